"""torch attention adapter plumbing on CPU.

torch's FlashAttention-2 and memory-efficient kernels only run on a GPU, so here the two aten
entry points are replaced by float64 emulations of what those kernels compute (argument
conventions, bottom-right causal / top-left ``is_causal``, FA2's ALiBi forms, natural-log lse and
its layouts, ``+inf`` or NaN for rows that see no key). The public functions then run with the
torch kernels forced, and must match the reference backend. What the emulations assume about the
real kernels is checked on hardware by tests/attention/test_attention_gpu.py.
"""

import dataclasses
import math

import pytest
import torch

from conftest import TOLERANCE, rel_error
from flashinfer import dispatch, overrides
from flashinfer.attention import single
from flashinfer.backends.torch import attention as torch_native
from flashinfer.checked_calls import CheckedCalls
from flashinfer.decode import single_decode_with_kv_cache
from flashinfer.dispatch import BackendUnavailableError, select
from flashinfer.prefill import single_prefill_with_kv_cache


# --- emulations of the aten kernels --------------------------------------------------------

def emulated_flash(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, *,
                   scale=None, window_size_left=None, window_size_right=None, seqused_k=None,
                   alibi_slopes=None, block_table=None, num_splits=None):
    """FA2 varlen (torch's flash_api.cpp + mask.h) for one sequence, in float64."""
    for t in (q, k, v):
        assert t.dim() == 3 and t.stride(-1) == 1
    assert cu_q.dtype == torch.int32 and cu_q.tolist() == [0, max_q] and q.shape[0] == max_q
    assert cu_k.dtype == torch.int32 and cu_k.tolist() == [0, max_k] and k.shape[0] == max_k
    assert dropout_p == 0.0 and not return_debug_mask and seqused_k is None and block_table is None
    assert alibi_slopes is None  # torch's FA2 build has no ALiBi; the adapter must not pass it
    assert q.dtype == k.dtype == v.dtype and q.shape[-1] == k.shape[-1] == v.shape[-1]
    left = -1 if window_size_left is None else window_size_left
    right = -1 if window_size_right is None else window_size_right
    if max_q == 1:
        is_causal = False
    if is_causal:
        right = 0
    left = -1 if left >= max_k else left
    right = -1 if right >= max_k else right
    causal = left < 0 and right == 0
    if left < 0 and right >= 0:
        left = max_k
    if left >= 0 and right < 0:
        right = max_k
    local = (left >= 0 or right >= 0) and not causal
    i = torch.arange(max_q)[:, None] + max_k - max_q
    j = torch.arange(max_k)[None, :]
    keep = torch.ones(max_q, max_k, dtype=torch.bool)
    if causal:
        keep = j <= i
    if local:
        keep = (j >= i - left) & (j <= i + right)
    group = q.shape[1] // k.shape[1]
    kk, vv = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    s = torch.einsum("qhd,khd->hqk", q.double(), kk) * scale
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    out = torch.einsum("hqk,khd->qhd", p, vv)
    lse = lse.masked_fill(torch.isneginf(lse), float("inf"))  # FA2 writes +inf there
    empty = torch.empty(0)
    return out.to(q.dtype), lse.float(), empty, empty, empty


def emulated_efficient(q, k, v, bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *,
                       scale=None):
    """The memory-efficient kernel ([B, H, M, D] inputs, top-left ``is_causal``), in float64.
    Rows that see no key come back as NaN, the worst the real kernel could do."""
    b, h, m, _ = q.shape
    n = k.shape[2]
    assert k.shape[:2] == (b, h) and v.shape[:3] == (b, h, n) and dropout_p == 0.0
    elems = 16 // q.element_size()
    for t in (q, k, v):
        assert t.stride(-1) == 1 and all(s % elems == 0 for s in t.stride()[:-1])
    s = q.double() @ k.double().transpose(-1, -2) * scale
    if bias is not None:
        assert bias.shape == (b, h, m, n) and bias.dtype == q.dtype and bias.stride(-1) == 1
        assert bias.stride(-2) % 16 == 0 and bias.stride(1) % 16 == 0
        s = s + bias.double()
    if is_causal:
        assert m == n
        s = s.masked_fill(torch.ones(m, n, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    out = torch.exp(s - lse[..., None]) @ v.double()
    lse_out = torch.full((b, h, -(-m // 32) * 32 if compute_log_sumexp else 0), float("nan"))
    if compute_log_sumexp:
        lse_out[..., :m] = torch.where(torch.isneginf(lse), float("nan"), lse)
    empty = torch.empty(0)
    return out.to(q.dtype), lse_out.float(), empty, empty


@pytest.fixture
def emulated(monkeypatch):
    monkeypatch.setattr(torch_native, "aten_flash", emulated_flash)
    monkeypatch.setattr(torch_native, "aten_efficient", emulated_efficient)


class NotAdmitted(Exception):
    """The forced variant's capability record or adapter checks reject the call's Problem."""


def admitted(problem, variant) -> bool:
    """Whether the capability record and the adapter checks accept ``problem`` on an SM 9.0."""
    on_gpu = dataclasses.replace(problem, device="cuda", sm=(9, 0))
    try:
        select(on_gpu, overrides.collect("attention", f"torch:{variant}"), assume_installed=True)
    except BackendUnavailableError:
        return False
    return True


def run_forced(monkeypatch, variant, fn, *args, **kw):
    """Run ``fn`` with the torch kernel ``variant`` forced, provided the dispatcher would admit
    the call's Problem for that kernel on a GPU; else raise NotAdmitted."""

    class Forced:
        kernel = staticmethod(getattr(torch_native, variant))

    def decide_keyed(key, make_problem, backend="auto"):
        problem = make_problem()
        if not admitted(problem, variant):
            raise NotAdmitted(problem.describe())
        return Forced

    with monkeypatch.context() as patch:
        patch.setattr(dispatch, "decide_keyed", decide_keyed)
        # a fresh steady-state memo: a stored call would decide through its KeyedDecision
        patch.setattr(single, "_CHECKED_DECODES", CheckedCalls())
        return fn(*args, **kw)


# --- cases ---------------------------------------------------------------------------------

BOTH = {"flash_varlen", "sdpa_efficient"}
EFF = {"sdpa_efficient"}
PREFILL = {
    "plain": (dict(), BOTH),
    "causal": (dict(causal=True), BOTH),
    "causal_square_mha": (dict(causal=True, qo_len=19, hk=4), BOTH),
    "causal_square_gqa": (dict(causal=True, qo_len=19), BOTH),
    "causal_more_queries": (dict(causal=True, qo_len=24), BOTH),
    "window": (dict(window_left=4), BOTH),
    "causal_window": (dict(causal=True, window_left=3), BOTH),
    "alibi_causal": (dict(causal=True, pos_encoding_mode="ALIBI"), EFF),
    "alibi_causal_window": (dict(causal=True, window_left=5, pos_encoding_mode="ALIBI"), EFF),
    "alibi_causal_more_queries": (dict(causal=True, qo_len=24, pos_encoding_mode="ALIBI"), EFF),
    "alibi": (dict(pos_encoding_mode="ALIBI"), EFF),
    "alibi_window": (dict(window_left=4, pos_encoding_mode="ALIBI"), EFF),
    "custom_mask": (dict(mask=True), EFF),
    "custom_mask_alibi": (dict(mask=True, pos_encoding_mode="ALIBI"), EFF),
    "head_dim_differs": (dict(causal=True, dv=24), EFF),
    "soft_cap": (dict(logits_soft_cap=5.0), set()),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("variant", sorted(BOTH))
@pytest.mark.parametrize("case", list(PREFILL))
def test_prefill_torch_kernels_match_reference(case, variant, layout, dtype, monkeypatch, emulated):
    cfg, variants = dict(PREFILL[case][0]), PREFILL[case][1]
    torch.manual_seed(list(PREFILL).index(case))
    qo_len, hk, dv = cfg.pop("qo_len", 6), cfg.pop("hk", 2), cfg.pop("dv", 16)
    q = torch.randn(qo_len, 8, 16).to(dtype)
    k, v = torch.randn(19, hk, 16).to(dtype), torch.randn(19, hk, dv).to(dtype)
    if cfg.pop("mask", False):
        cfg["custom_mask"] = torch.rand(qo_len, 19) > 0.5
        cfg["custom_mask"][1] = False
    if layout == "HND":
        k, v = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
    kw = dict(kv_layout=layout, return_lse=True, **cfg)
    expected = single_prefill_with_kv_cache(q, k, v, backend="reference", **kw)
    if variant not in variants:
        with pytest.raises(NotAdmitted):
            run_forced(monkeypatch, variant, single_prefill_with_kv_cache, q, k, v, **kw)
        return
    out, lse = run_forced(monkeypatch, variant, single_prefill_with_kv_cache, q, k, v, **kw)
    assert out.dtype == dtype and out.shape == expected[0].shape
    assert rel_error(out, expected[0]) <= TOLERANCE[dtype]
    assert torch.equal(torch.isneginf(lse), torch.isneginf(expected[1]))
    finite = torch.isfinite(expected[1])
    assert rel_error(lse[finite], expected[1][finite]) <= 1e-3


DECODE = {
    "plain": (dict(), BOTH),
    "window": (dict(window_left=6), BOTH),
    "alibi": (dict(pos_encoding_mode="ALIBI"), EFF),
    "alibi_window": (dict(pos_encoding_mode="ALIBI", window_left=6), EFF),
}


@pytest.mark.parametrize("return_lse", [True, False])
@pytest.mark.parametrize("variant", sorted(BOTH))
@pytest.mark.parametrize("case", list(DECODE))
def test_decode_torch_kernels_match_reference(case, variant, return_lse, monkeypatch, emulated):
    config, variants = DECODE[case]
    if variant not in variants:
        pytest.skip(f"{variant} does not declare this feature")
    torch.manual_seed(20)
    q = torch.randn(8, 32).half()
    k, v = torch.randn(2, 37, 32).half(), torch.randn(2, 37, 32).half()
    kw = dict(kv_layout="HND", return_lse=return_lse, **config)
    expected = single_decode_with_kv_cache(q, k, v, backend="reference", **kw)
    got = run_forced(monkeypatch, variant, single_decode_with_kv_cache, q, k, v, **kw)
    if not return_lse:
        got, expected = (got,), (expected,)
    assert rel_error(got[0], expected[0]) <= TOLERANCE[torch.float16]
    if return_lse:
        assert rel_error(got[1], expected[1]) <= 1e-3


def test_efficient_float32_and_strided_query(monkeypatch, emulated):
    torch.manual_seed(21)
    q = torch.randn(5, 8, 40)[:, :, 8:32]  # a strided view the kernel reads in place
    k, v = torch.randn(11, 4, 24), torch.randn(11, 4, 8)
    kw = dict(causal=True, return_lse=True, pos_encoding_mode="ALIBI")
    expected = single_prefill_with_kv_cache(q, k, v, backend="reference", **kw)
    out, lse = run_forced(monkeypatch, "sdpa_efficient", single_prefill_with_kv_cache, q, k, v, **kw)
    assert rel_error(out, expected[0]) <= 1e-6
    assert rel_error(lse, expected[1]) <= 1e-6


def test_aligned_copies_only_when_needed():
    base = torch.randn(4, 3, 16).half()
    assert torch_native.aligned(base) is base
    assert torch_native.aligned(base.transpose(0, 1)).data_ptr() == base.data_ptr()
    odd = torch.randn(4 * 3 * 16 + 1).half()[1:].view(4, 3, 16)  # base address off by 2 bytes
    fixed = torch_native.aligned(odd)
    assert fixed.data_ptr() % 16 == 0 and torch.equal(fixed, odd)
    narrow = torch.randn(4, 3, 20).half()[..., :16]  # row stride 20 elements = 40 bytes
    assert torch_native.aligned(narrow).is_contiguous()


def test_finish_lse_converts_base_and_empty_rows():
    lse = torch.tensor([[0.0, float("inf"), math.log(8.0)]])
    out = torch_native.finish_lse(lse)
    assert out.shape == (3, 1)
    assert out[0, 0] == 0.0 and torch.isneginf(out[1, 0]) and abs(out[2, 0] - 3.0) < 1e-6
