"""Every GPU backend that serves single_decode / single_prefill vs the reference, on CUDA.

The backends come from the capability DB (one parameter per record, e.g. ``cudnn``,
``torch:flash_varlen``), so a new record is tested by itself. A case the record or the adapter
rejects is skipped with the dispatcher's reasons; a case it accepts must match the reference
(same CUDA inputs, float32 math): output within TOLERANCE[dtype] (relative Frobenius), lse
(base 2) within 1e-3 relative on finite entries and ``-inf`` exactly where the reference has it.
"""

import pytest
import torch

from conftest import TOLERANCE, rel_error
from flashinfer.capability_db import database
from flashinfer.decode import single_decode_with_kv_cache
from flashinfer.dispatch import BackendUnavailableError, record_decisions
from flashinfer.prefill import single_prefill_with_kv_cache

pytestmark = pytest.mark.gpu


def gpu_kernels(op):
    names = []
    for rec in database().for_op(op):
        if rec.backend != "reference" and "cuda" in rec.devices:
            names.append(rec.backend if rec.variant == "default" else f"{rec.backend}:{rec.variant}")
    return names


DTYPES = [torch.float16, torch.bfloat16]
LAYOUTS = ["NHD", "HND"]

DECODE_CASES = {
    "gqa_d128": dict(hq=32, hk=8, d=128, kv=1000),
    "mha_d64_long": dict(hq=32, hk=32, d=64, kv=4096),
    "gqa_d256_window": dict(hq=16, hk=2, d=256, kv=777, window_left=200),
    "alibi": dict(hq=8, hk=8, d=128, kv=513, pos_encoding_mode="ALIBI"),
    "alibi_gqa_window": dict(hq=32, hk=4, d=128, kv=2048, pos_encoding_mode="ALIBI", window_left=100),
}

PREFILL_CASES = {
    "causal_square": dict(qo=128, kv=128, hq=32, hk=8, d=128, causal=True),
    "causal_append": dict(qo=100, kv=1000, hq=16, hk=4, d=64, causal=True),
    "causal_window_d256": dict(qo=77, kv=1500, hq=8, hk=1, d=256, causal=True, window_left=256),
    "noncausal": dict(qo=64, kv=512, hq=8, hk=8, d=128),
    "noncausal_window_gqa": dict(qo=64, kv=512, hq=16, hk=4, d=128, window_left=100),
    "alibi_causal_12_heads": dict(qo=200, kv=900, hq=12, hk=4, d=128, causal=True,
                                  pos_encoding_mode="ALIBI"),
    "alibi_causal_window": dict(qo=200, kv=900, hq=8, hk=2, d=64, causal=True, window_left=64,
                                pos_encoding_mode="ALIBI"),
    "alibi_noncausal": dict(qo=50, kv=300, hq=8, hk=8, d=128, pos_encoding_mode="ALIBI"),
    "rows_without_keys": dict(qo=96, kv=48, hq=8, hk=2, d=128, causal=True),
    "custom_mask": dict(qo=128, kv=640, hq=8, hk=2, d=128, mask=True),
    "head_dim_192_128": dict(qo=64, kv=256, hq=8, hk=8, d=192, dv=128, causal=True),
    "one_query_row": dict(qo=1, kv=1000, hq=32, hk=8, d=128, causal=True),
}


def _inputs(qo, cfg, dtype, layout):
    torch.manual_seed(0)
    dev = "cuda"
    hq, hk, d, kv = cfg["hq"], cfg["hk"], cfg["d"], cfg["kv"]
    dv = cfg.get("dv", d)
    q = torch.randn(qo, hq, d, device=dev).to(dtype)
    k = torch.randn(kv, hk, d, device=dev).to(dtype)
    v = torch.randn(kv, hk, dv, device=dev).to(dtype)
    if layout == "HND":
        k, v = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
    return q, k, v


def _call_or_skip(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except BackendUnavailableError as exc:
        reasons = "; ".join(r.message for c in exc.candidates for r in c.reasons)
        pytest.skip(f"rejected by the dispatcher: {reasons}")


def _compare(got, expected, dtype):
    out, lse = got
    exp_out, exp_lse = expected
    assert out.dtype == exp_out.dtype and out.shape == exp_out.shape
    assert rel_error(out, exp_out) <= TOLERANCE[dtype]
    assert lse.dtype == torch.float32 and lse.shape == exp_lse.shape
    assert torch.equal(torch.isneginf(lse), torch.isneginf(exp_lse))
    finite = torch.isfinite(exp_lse)
    if finite.any():
        assert rel_error(lse[finite], exp_lse[finite]) <= 1e-3


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(DECODE_CASES))
@pytest.mark.parametrize("backend", gpu_kernels("single_decode") + ["auto"])
def test_decode_vs_reference(backend, case, dtype, layout):
    cfg = dict(DECODE_CASES[case])
    q, k, v = _inputs(1, cfg, dtype, layout)
    kw = dict(kv_layout=layout, return_lse=True, window_left=cfg.get("window_left", -1),
              pos_encoding_mode=cfg.get("pos_encoding_mode", "NONE"))
    expected = single_decode_with_kv_cache(q[0], k, v, backend="reference", **kw)
    got = _call_or_skip(single_decode_with_kv_cache, q[0], k, v, backend=backend, **kw)
    _compare(got, expected, dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(PREFILL_CASES))
@pytest.mark.parametrize("backend", gpu_kernels("single_prefill") + ["auto"])
def test_prefill_vs_reference(backend, case, dtype, layout):
    cfg = dict(PREFILL_CASES[case])
    q, k, v = _inputs(cfg["qo"], cfg, dtype, layout)
    kw = dict(kv_layout=layout, return_lse=True, causal=cfg.get("causal", False),
              window_left=cfg.get("window_left", -1),
              pos_encoding_mode=cfg.get("pos_encoding_mode", "NONE"))
    if cfg.get("mask"):
        gen = torch.Generator(device="cuda").manual_seed(1)
        mask = torch.rand(cfg["qo"], cfg["kv"], device="cuda", generator=gen) > 0.3
        mask[5] = False  # one row that sees no key
        kw["custom_mask"] = mask
    expected = single_prefill_with_kv_cache(q, k, v, backend="reference", **kw)
    got = _call_or_skip(single_prefill_with_kv_cache, q, k, v, backend=backend, **kw)
    _compare(got, expected, dtype)


@pytest.mark.parametrize("backend", gpu_kernels("single_prefill"))
def test_prefill_without_lse(backend):
    cfg = PREFILL_CASES["causal_append"]
    q, k, v = _inputs(cfg["qo"], cfg, torch.float16, "NHD")
    expected = single_prefill_with_kv_cache(q, k, v, causal=True, backend="reference")
    got = _call_or_skip(single_prefill_with_kv_cache, q, k, v, causal=True, backend=backend)
    assert rel_error(got, expected) <= TOLERANCE[torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_auto_picks_a_gpu_kernel(dtype):
    cfg = PREFILL_CASES["causal_append"]
    q, k, v = _inputs(cfg["qo"], cfg, dtype, "NHD")
    with record_decisions() as log:
        single_prefill_with_kv_cache(q, k, v, causal=True)
        single_decode_with_kv_cache(q[0], k, v)
    for decision in log:
        assert decision.backend != "reference", decision.explain()
