"""Top-p renormalisation by a shrinking bracket (variant ``triton:bracket`` of renorm_probs,
``_top_p_bracket_kernels.py``): the kept set equal to the contract's float64 one and the values
``p / kept mass`` (three dtypes, scalar and per-row top-p, p = 0 and 1), ties at the boundary,
a bracket that needs several pivot passes, one that overflows its slots with a single value,
invalid rows (zeros), a strided output, top-k handed to the general kernel; ``gpu``: 128k rows."""

import pytest
import torch

from sampling_helpers import keep_set, probs_rows, with_bad_rows

triton = pytest.importorskip("triton")

from flashinfer.dispatch import kernel_for  # noqa: E402

pytestmark = pytest.mark.usefixtures("kernel_device")


def bracket():
    return kernel_for("triton", "renorm_probs", "bracket")


def expected(p, top_p):
    keep = keep_set(p, top_p=top_p).cpu()
    kept = torch.where(keep, p.double().cpu(), 0)
    return kept / kept.sum(-1, keepdim=True), keep


def renorm(p, top_p, out=None):
    out = torch.full_like(p, float("nan")) if out is None else out
    bracket()(p, out, None, top_p)
    return out


@pytest.mark.parametrize("dtype,top_p", [(torch.float32, 0.0), (torch.float32, 0.3),
                                         (torch.float32, 0.999), (torch.float32, 1.0),
                                         (torch.float16, 0.9), (torch.bfloat16, 0.9)])
def test_kept_set_and_values(dtype, top_p):
    p = probs_rows(2, 700, seed=41).to(dtype)
    want, keep = expected(p, top_p)
    got = renorm(p, top_p).double().cpu()
    assert torch.equal(got > 0, keep)
    torch.testing.assert_close(got, want, atol=2e-3 if dtype != torch.float32 else 1e-6,
                               rtol=1e-2 if dtype != torch.float32 else 1e-5)


def test_per_row_top_p():
    p = probs_rows(3, 500, seed=42)
    ps = torch.tensor([0.05, 0.5, 0.95], device=p.device)
    want, keep = expected(p, ps)
    got = renorm(p, ps).cpu()
    assert torch.equal(got > 0, keep)
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-5)


def test_several_pivot_passes_on_a_flat_long_row():
    # 5,000 near-equal values: the bracket holds more tokens than the 1,024 slots at first
    g = torch.Generator().manual_seed(43)
    p = 1.0 + 0.01 * torch.rand(2, 5000, generator=g, dtype=torch.float64, device="cpu")
    p = (p / p.sum(-1, keepdim=True)).float().to(torch.get_default_device())
    want, keep = expected(p, 0.6)
    got = renorm(p, 0.6).cpu()
    assert torch.equal(got > 0, keep)
    torch.testing.assert_close(got.double(), want, atol=1e-7, rtol=1e-4)


@pytest.mark.parametrize("top_p", [0.2, 0.7])
def test_ties_wider_than_the_slots(top_p):
    # 2,000 tokens of one value and a few larger ones: the bracket narrows to that one value,
    # wider than the slots, and every tied token is kept or none
    p = torch.full((2, 2100), 1.0, device="cpu", dtype=torch.float64)
    p[:, :100] = 3.0
    p = (p / p.sum(-1, keepdim=True)).float().to(torch.get_default_device())
    want, keep = expected(p, top_p)
    got = renorm(p, top_p).cpu()
    assert torch.equal(got > 0, keep)
    torch.testing.assert_close(got.double(), want, atol=1e-7, rtol=1e-5)


def test_ties_at_the_boundary_are_all_kept():
    p = probs_rows(2, 300, seed=44)
    p[:, [5, 50, 150]] = p.max() * 2  # three equal largest values
    p /= p.sum(-1, keepdim=True)
    want, keep = expected(p, 0.01)
    got = renorm(p, 0.01).cpu()
    assert torch.equal(got > 0, keep) and int(keep[0].sum()) >= 3


def test_invalid_rows_come_out_zero():
    p = with_bad_rows(probs_rows(5, 200, seed=45))
    got = renorm(p, 0.8).cpu()
    assert torch.equal(got[1:], torch.zeros_like(got[1:]))
    assert torch.equal(got[0] > 0, keep_set(p[:1], top_p=0.8).cpu()[0])


def test_strided_output_and_top_k_refused():
    p = probs_rows(3, 129, seed=46)
    out = torch.full((129, 3), float("nan"), device=p.device).t()
    renorm(p, 0.5, out)
    assert torch.equal(out.cpu() > 0, keep_set(p, top_p=0.5).cpu())
    with pytest.raises(ValueError, match="triton:bracket was called"):
        bracket()(p, torch.full_like(p, float("nan")), 7, None)  # top-k: not this record's


@pytest.mark.gpu
def test_gpu_large_vocab():
    p = probs_rows(32, 128256, seed=47, power=8.0).cuda()
    want, keep = expected(p, 0.9)
    got = renorm(p, 0.9).cpu()
    assert torch.equal(got > 0, keep)
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-4)
