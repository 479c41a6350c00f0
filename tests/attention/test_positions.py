"""pos_encoding_mode="ROPE_LLAMA" on kernels that do not rotate (flashinfer.attention.positions):
the choice between a kernel that rotates, the plain kernel on rotated copies and the
reference, and the rotated path's numerics against the reference's in-kernel rotation."""

from __future__ import annotations

import math
import types

import pytest
import torch

from conftest import rope_oracle
import flashinfer
from flashinfer import dispatch
from flashinfer.attention import positions


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 1e-2)])
def test_rotate_is_rope_over_the_whole_head_dim(dtype, tol):
    """float32 angles (as upstream's kernels): at position 4095 they are good to ~1e-4."""
    torch.manual_seed(0)
    x = torch.randn(7, 3, 32).to(dtype)
    pos = torch.tensor([0, 1, 5, 100, 4095, 7, 3])
    out = positions.rotate(x, pos, 2.0, 5e5)
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out.double(), rope_oracle(x, pos, 32, False, 2.0, 5e5), atol=tol, rtol=tol)


def _decision(backend):
    return types.SimpleNamespace(backend=backend)


def _fake_decide(monkeypatch, answers):
    """decide_keyed answers by key: a backend name, or an exception to raise."""
    def decide_keyed(key, make_problem, backend="auto"):
        answer = answers[key]
        if isinstance(answer, Exception):
            raise answer
        return _decision(answer)
    monkeypatch.setattr(dispatch, "decide_keyed", decide_keyed)


NO = dispatch.BackendUnavailableError(dispatch.Problem.make("single_prefill", torch.device("cpu")), [],
                                     "backend='torch' cannot run this problem")


@pytest.mark.parametrize("native,plain,want", [
    ("fa3", "fa3", ("fa3", False)),             # a kernel that rotates itself wins
    ("reference", "fa3", ("fa3", True)),        # else the plain kernel on rotated copies
    ("reference", "reference", ("reference", False)),  # a CPU: the reference rotates inside
    (NO, "torch", ("torch", True)),             # backend='torch': it cannot rotate, so rotate first
    ("reference", NO, ("reference", False)),
])
def test_choose(monkeypatch, native, plain, want):
    _fake_decide(monkeypatch, {"rope": native, "plain": plain})
    decision, rotate_first = positions.choose(("rope", None), ("plain", None), "auto")
    assert (decision.backend, rotate_first) == want


@pytest.mark.parametrize("plain", [NO, "reference"])
def test_choose_raises_why_the_call_with_rope_cannot_run(monkeypatch, plain):
    _fake_decide(monkeypatch, {"rope": NO, "plain": plain})
    with pytest.raises(dispatch.BackendUnavailableError, match="cannot run"):
        positions.choose(("rope", None), ("plain", None), "torch")


def _rotate_first(monkeypatch):
    """From here on the rotated path, with the reference as the plain kernel (no other kernel
    serves single attention on a CPU), so its numerics can be compared with the in-kernel
    rotation (what a CPU call runs without this)."""
    monkeypatch.setattr(positions, "choose", lambda with_rope, plain, backend: (
        dispatch.decide_keyed(*plain, "reference"), True))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("rope", [{}, {"rope_scale": 4.0, "rope_theta": 5e5}])
def test_rotated_single_prefill_matches_the_in_kernel_rotation(monkeypatch, layout, rope):
    torch.manual_seed(1)
    q, k, v = torch.randn(5, 4, 32), torch.randn(19, 2, 32), torch.randn(19, 2, 32)
    if layout == "HND":
        k, v = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
    common = dict(kv_layout=layout, pos_encoding_mode="ROPE_LLAMA", causal=True,
                  return_lse=True, **rope)
    with dispatch.record_decisions() as log:
        want = flashinfer.single_prefill_with_kv_cache(q, k, v, backend="reference", **common)
    assert "rope_llama" in log[-1].problem.features  # the reference rotates inside
    _rotate_first(monkeypatch)
    with dispatch.record_decisions() as log:
        got = flashinfer.single_prefill_with_kv_cache(q, k, v, **common)
    assert "rope_llama" not in log[-1].problem.features  # the plain problem ran
    assert [d.problem.op for d in log[-3:-1]] == ["rope", "rope"]  # after rotating q and k
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_rotated_single_decode_matches_float64_and_is_remembered(monkeypatch):
    _rotate_first(monkeypatch)
    torch.manual_seed(2)
    q, k, v = torch.randn(4, 32), torch.randn(40, 2, 32), torch.randn(40, 2, 32)
    first = flashinfer.single_decode_with_kv_cache(q, k, v, pos_encoding_mode="ROPE_LLAMA")
    second = flashinfer.single_decode_with_kv_cache(q, k, v, pos_encoding_mode="ROPE_LLAMA")
    torch.testing.assert_close(first, second, atol=0, rtol=0)
    # float64: query at position kv_len - 1, key j at j
    qr = rope_oracle(q[None], [39], 32, False)[0]
    kr = rope_oracle(k, torch.arange(40), 32, False).repeat_interleave(2, 1)
    s = torch.einsum("hd,khd->hk", qr, kr) / math.sqrt(32)
    want = torch.einsum("hk,khd->hd", s.softmax(-1), v.double().repeat_interleave(2, 1))
    torch.testing.assert_close(first.double(), want, atol=1e-5, rtol=1e-5)
