"""Triton split-K batch prefill (flashinfer/backends/triton/batch_attention.py), paged and ragged.

Each case plans the public wrapper twice, ``backend="triton"`` and ``backend="reference"``, on the
same inputs, and compares outputs and lse; on CPU the kernel runs in Triton's interpreter
(conftest) at small shapes. The reference is itself checked against float64 naive math in
test_batch_attention.py. Splits are forced through ``make_runner`` where a case needs them.
"""

from __future__ import annotations

import pytest
import torch

from attention_helpers import make_paged
from conftest import HAS_CUDA, rel_error
import flashinfer
from flashinfer.attention.batch_params import KVInput, RunScales
from flashinfer.backends.triton import batch_attention as ba

DEV = "cuda" if HAS_CUDA else "cpu"
F16 = torch.float16


def _ws():
    return torch.empty(64 << 20, dtype=torch.uint8, device=DEV)


def _setup(op, qo_lens, kv_lens, *, hq=4, hk=2, d=32, dvo=None, ps=4, layout="NHD",
           dtype=F16, kv_dtype=None, seed=0, **plan_kw):
    """``make(backend) -> wrapper`` planned with ``plan_kw``, and the run() inputs."""
    torch.manual_seed(seed)
    dvo = dvo or d
    kv_dtype = kv_dtype or dtype
    qo_indptr = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(int(qo_indptr[-1]), hq, d).to(DEV, dtype)
    kw = dict(q_data_type=dtype, kv_data_type=kv_dtype, **plan_kw)
    if op == "ragged":
        kv_indptr = torch.tensor([0] + torch.tensor(kv_lens).cumsum(0).tolist(), dtype=torch.int32)
        k = torch.randn(int(kv_indptr[-1]), hk, d).to(DEV, kv_dtype)
        v = torch.randn(int(kv_indptr[-1]), hk, dvo).to(DEV, kv_dtype)
        if layout == "HND":
            k, v = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()

        def make(backend):
            w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_ws(), layout, backend=backend)
            w.plan(qo_indptr.to(DEV), kv_indptr.to(DEV), hq, hk, d, head_dim_vo=dvo, **kw)
            return w
        return make, q, (k, v)
    cache, indptr, indices, last, _, _ = make_paged(kv_lens, ps, hk, d, layout)
    cache = cache.to(DEV).to(kv_dtype)
    if dvo != d:  # separate K and V caches, V with its own head dim
        v_shape = cache[:, 1].shape[:-1] + (dvo,)
        cache = (cache[:, 0], torch.randn(v_shape).to(DEV, kv_dtype))

    def make(backend):
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws(), layout, backend=backend)
        w.plan(qo_indptr.to(DEV), indptr.to(DEV), indices.to(DEV), last.to(DEV), hq, hk, d, ps,
               head_dim_vo=dvo, **kw)
        return w
    return make, q, (cache,)


def _check(make, q, kv, tol=1e-2, **run_kw):
    w, ref = make("triton"), make("reference")
    assert w.decision.backend == "triton"
    got, lse = w.run(q, *kv, return_lse=True, **run_kw)
    want, want_lse = ref.run(q, *kv, return_lse=True, **run_kw)
    assert rel_error(got, want) < tol
    empty = torch.isneginf(want_lse)
    assert torch.equal(torch.isneginf(lse), empty)
    assert rel_error(lse[~empty], want_lse[~empty]) < tol
    return got


OPS = ["paged", "ragged"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("causal", [False, True])
def test_lengths_and_layouts(op, layout, causal):
    # ragged lengths, a request with more queries than keys (causal: its first rows see nothing),
    # one with no keys at all
    _check(*_setup(op, [5, 1, 19, 3], [9, 17, 19, 0] if op == "paged" else [9, 17, 19, 0],
                   layout=layout, causal=causal))


@pytest.mark.parametrize("op", OPS)
def test_alibi_with_soft_cap_and_window(op):
    _check(*_setup(op, [7, 12], [20, 12], causal=True, pos_encoding_mode="ALIBI",
                   logits_soft_cap=5.0, window_left=6))


@pytest.mark.parametrize("op", OPS)
def test_alibi_non_causal(op):
    _check(*_setup(op, [6, 9], [14, 9], pos_encoding_mode="ALIBI", seed=1))


@pytest.mark.parametrize("op", OPS)
def test_custom_mask(op):
    torch.manual_seed(3)
    qo, kv = [5, 8], [11, 8]
    mask = torch.cat([(torch.rand(q, k) < 0.6).flatten() for q, k in zip(qo, kv)])
    mask[:kv[0]] = False  # a row that keeps no key: output 0, lse -inf
    _check(*_setup(op, qo, kv, custom_mask=mask.to(DEV), seed=3))


@pytest.mark.parametrize("op", OPS)
def test_sinks_scales_and_output_dtype(op):
    make, q, kv = _setup(op, [4, 9], [13, 9], causal=True, o_data_type=torch.float32, seed=4)
    sinks = torch.randn(4).to(DEV)
    got = _check(make, q, kv, sinks=sinks, q_scale=0.8, v_scale=1.5)
    assert got.dtype == torch.float32


@pytest.mark.parametrize("op", OPS)
def test_head_dims_differ(op):
    _check(*_setup(op, [6, 3], [10, 7], d=48, dvo=32, causal=True, seed=5))


def test_fp8_pages():
    make, q, kv = _setup("paged", [5, 7], [12, 7], kv_dtype=torch.float8_e4m3fn, causal=True, seed=6)
    _check(make, q, kv, tol=2e-2, k_scale=0.6, v_scale=1.7)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("splits", [1, 3])
def test_forced_splits_equal_the_reference(op, splits):
    """The merge path (splits > 1) and the single pass give the reference's result, with sinks
    and a window."""
    make, q, kv = _setup(op, [3, 5], [70, 40], causal=True, window_left=50, seed=7)
    plan = make("triton")._plan
    runner = ba.make_runner(plan, num_splits=splits)
    assert runner.config.num_splits == splits and (runner.part_o is None) == (splits == 1)
    inputs = KVInput(*kv) if op == "ragged" else KVInput(kv[0][:, 0], kv[0][:, 1])
    out = torch.full((q.shape[0], 4, 32), float("nan"), dtype=F16, device=DEV)
    lse = torch.full((q.shape[0], 4), float("nan"), device=DEV)
    sinks = torch.randn(4).to(DEV)
    runner(q, inputs, out, lse, RunScales(sinks=sinks))
    want, want_lse = make("reference").run(q, *kv, return_lse=True, sinks=sinks)
    assert rel_error(out, want) < 1e-2 and rel_error(lse, want_lse) < 1e-2


def test_prefill_splits_follow_the_workspace():
    """Prefill splits only as far as the workspace holds their scratch; no workspace: one."""
    make, q, kv = _setup("ragged", [2], [4096], hq=2, hk=1)
    plan = make("triton")._plan
    assert ba.launch_config(plan).num_splits > 1  # one short request: SMs to fill
    small = plan.__class__(**{**plan.__dict__, "workspace": torch.empty(
        ba.scratch_bytes(plan, 2) + ba.ALIGN, dtype=torch.uint8, device=DEV)})
    assert ba.launch_config(small).num_splits == 2
    assert ba.launch_config(plan.__class__(**{**plan.__dict__, "workspace": None})).num_splits == 1


@pytest.mark.parametrize("sm", ["8.0", "8.9", "9.0", "10.0", "12.0"])
def test_decision_prefers_vendor_kernels_and_takes_what_they_cannot(sm):
    """On simulated SMs plain causal prefill goes to a vendor kernel; ALiBi, a custom mask and
    sinks (which none of them serves) to triton, ahead of the reference."""
    from attention_helpers import ragged_problem
    from flashinfer.dispatch import select

    for op in ("batch_prefill_ragged", "batch_prefill_paged"):
        assert select(ragged_problem(sm, op=op), assume_installed=True).backend != "triton"
        for extra in ("alibi", "custom_mask", "sinks"):
            features = ("gqa", "lse", extra) + (() if extra == "custom_mask" else ("causal",))
            decision = select(ragged_problem(sm, op=op, features=features), assume_installed=True)
            assert decision.backend == "triton", (op, extra, decision.name)


GPU_CASES = {
    "alibi_causal": dict(qo=[1, 300, 1000], kv=[500, 300, 1500], causal=True,
                         pos_encoding_mode="ALIBI"),
    "alibi_cap_window": dict(qo=[128, 77], kv=[2048, 77], causal=True, pos_encoding_mode="ALIBI",
                             logits_soft_cap=30.0, window_left=256),
    "custom_mask": dict(qo=[200, 64], kv=[260, 64], mask=True),
    "long_kv_short_q": dict(qo=[4, 1], kv=[16384, 3000], causal=True),  # splits and a merge
    "head_dims_192_128": dict(qo=[100, 257], kv=[300, 257], causal=True, d=192, dvo=128),
}


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_gpu_prefill_vs_reference(op, case):
    """Serving shapes on CUDA (32 / 8 heads, bf16, pages of 16) against the reference run on the
    same GPU; run() with sinks and scales on one case."""
    cfg = dict(GPU_CASES[case])
    qo, kv = cfg.pop("qo"), cfg.pop("kv")
    if cfg.pop("mask", False):
        torch.manual_seed(9)
        cfg["custom_mask"] = torch.cat([(torch.rand(q, k) < 0.5).flatten()
                                        for q, k in zip(qo, kv)]).to(DEV)
    make, q, kv_in = _setup(op, qo, kv, hq=32, hk=8, d=cfg.pop("d", 128), dvo=cfg.pop("dvo", None),
                            ps=16, dtype=torch.bfloat16, seed=8, **cfg)
    run_kw = dict(sinks=torch.randn(32, device=DEV), v_scale=0.5) if case == "alibi_causal" else {}
    _check(make, q, kv_in, tol=2e-2, **run_kw)
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_gpu_fp8_pages():
    make, q, kv = _setup("paged", [64, 300], [1000, 300], hq=32, hk=8, d=128, ps=16,
                         dtype=torch.bfloat16, kv_dtype=torch.float8_e4m3fn, causal=True,
                         pos_encoding_mode="ALIBI", seed=10)
    _check(make, q, kv, tol=3e-2, k_scale=0.8, v_scale=1.2)
