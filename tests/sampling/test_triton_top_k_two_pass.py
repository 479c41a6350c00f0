"""Top-k renormalisation and top-k logit masking by candidates (variant ``triton:two_pass`` of
renorm_probs and of top_k_mask_logits, ``_top_k_two_pass_kernels.py``): the kept set and values
against the float64 reference, three dtypes, ties at the boundary, rows that are not
distributions, ``-inf`` / NaN logits and rows of fewer than k finite logits, the exact full-pass
path (forced with a narrow block or too few candidate slots), the calls the adapters refuse (their
checks keep them away), and the dispatch checks. CPU: the interpreter, small shapes; ``gpu``: 128k."""

import pytest
import torch

from conftest import poison, rel_error
from sampling_helpers import keep_set, probs_rows, with_bad_rows

triton = pytest.importorskip("triton")

from flashinfer.dispatch import kernel_for  # noqa: E402
from flashinfer.device import simulated  # noqa: E402
from flashinfer.dispatch import Problem, select  # noqa: E402

pytestmark = [pytest.mark.usefixtures("kernel_device"),
              # the interpreter's numpy evaluates 1 / 0 of an invalid row before it is masked
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]


def renorm(variant="two_pass"):
    return kernel_for("triton", "renorm_probs", variant)


def mask(variant="two_pass"):
    return kernel_for("triton", "top_k_mask_logits", variant)


def logits(rows, vocab, seed, dtype=torch.float32):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(rows, vocab, generator=g, device="cpu") * 3).to(dtype)


def expected_mask(x, top_k):
    """The reference's masking on the CPU (NaN entries: masked, as the Triton kernels do)."""
    xd = x.double().cpu()
    finite = torch.where(xd == xd, xd, float("-inf"))
    larger = (finite.unsqueeze(-1) < finite.unsqueeze(-2)).sum(-1)
    return torch.where((larger < top_k) & (xd == xd), x.cpu(), float("-inf")).to(x.dtype)


def expected(p, top_k):
    keep = keep_set(p.float(), top_k=top_k).cpu()
    kept = p.double().cpu() * keep
    return kept / kept.sum(-1, keepdim=True), keep


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 7, 40])
def test_matches_the_reference(dtype, k):
    p = probs_rows(3, 250, seed=k).to(dtype)
    out = poison(torch.empty_like(p))
    renorm()(p, out, k, None)
    want, keep = expected(p, k)
    assert torch.equal((out != 0).cpu(), keep)
    assert rel_error(out.cpu(), want) < (1e-6 if dtype == torch.float32 else 1e-2)


def test_ties_at_the_boundary_are_all_kept():
    p = probs_rows(1, 64, seed=2)
    p[0, [3, 9, 20, 41]] = p.max() * 1.5  # four equal largest values, top_k = 2
    p /= p.sum()
    out = poison(torch.empty_like(p))
    renorm()(p, out, 2, None)
    assert int((out != 0).sum()) == 4
    assert rel_error(out.cpu(), expected(p, 2)[0]) < 1e-6


def test_rows_that_are_not_distributions_give_zeros():
    p = with_bad_rows(probs_rows(5, 50, seed=3))
    out = poison(torch.empty_like(p))
    renorm()(p, out, 4, None)
    assert (out[1:] == 0).all()
    assert rel_error(out[:1].cpu(), expected(p[:1], 4)[0]) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 7, 40])
def test_mask_matches_the_reference(dtype, k):
    x = logits(3, 250, seed=k, dtype=dtype)
    x[1, ::5] = float("-inf")
    x[2, 17] = float("nan")
    x = x.to(torch.get_default_device())
    out = poison(torch.empty_like(x))
    mask()(x, out, k)
    assert torch.equal(out.cpu(), expected_mask(x, k))


def test_mask_keeps_every_finite_logit_of_a_row_with_fewer_than_k():
    x = torch.full((2, 100), float("-inf"))
    x[0, [3, 50, 77]] = torch.tensor([1.0, -2.0, 0.5])
    x[1] = logits(1, 100, seed=9)[0]
    x[1, 40] = x[1].max()  # a tie at the top
    x = x.to(torch.get_default_device())
    out = poison(torch.empty_like(x))
    mask()(x, out, 5)
    assert torch.equal(out.cpu(), expected_mask(x, 5))


@pytest.mark.parametrize("block,cap", [(16, None), (64, 8)], ids=["narrow_block", "few_slots"])
def test_the_exact_path_agrees(block, cap):
    # 8 large values at block position 3 of a 16-wide block: four candidates per position miss
    # half of them; 8 slots cannot hold the 64 position maxima at or above the bound
    from flashinfer.backends.triton import _top_k_two_pass_kernels as KR
    from flashinfer.backends.triton.sampling import two_pass_groups

    g = torch.Generator().manual_seed(6)
    base = torch.rand(3, 256, generator=g, dtype=torch.float64, device="cpu") * 0.1 + 0.01
    for j, col in enumerate(range(3, 131, 16)):
        base[:, col] = 1.0 + 0.1 * j + 0.01 * torch.arange(3, dtype=torch.float64)
    p = (base / base.sum(-1, keepdim=True)).float().to(torch.get_default_device())
    groups, default_cap = two_pass_groups(8, block, 256)
    cap = cap or default_cap
    out = poison(torch.empty_like(p))
    scratch = torch.full((3, cap), float("nan"), device=p.device)
    KR.top_k_renorm_kernel[(3,)](p, out, scratch, 8, 256, p.stride(0), out.stride(0),
                                 BLOCK=block, G=groups, CAP=cap)
    want, keep = expected(p, 8)
    assert torch.equal((out != 0).cpu(), keep)
    assert rel_error(out.cpu(), want) < 1e-6
    x = p.log()  # the same order as logits
    masked = poison(torch.empty_like(x))
    KR.top_k_mask_kernel[(3,)](x, masked, scratch, 8, 256, x.stride(0), masked.stride(0),
                               BLOCK=block, G=groups, CAP=cap)
    assert torch.equal(masked.cpu(), expected_mask(x, 8))


def test_calls_it_does_not_serve_are_refused_not_rerouted():
    p = probs_rows(2, 120, seed=8)
    for top_k, top_p in ((torch.tensor([3, 9], dtype=torch.int32, device=p.device), None),
                         (None, 0.7), (120, None), (0, None), (5, 0.7)):
        with pytest.raises(ValueError, match="triton:two_pass was called"):
            renorm()(p, poison(torch.empty_like(p)), top_k, top_p)
    x = p.log()
    for top_k in (torch.tensor([3, 9], dtype=torch.int32, device=p.device), 120, 0):
        with pytest.raises(ValueError, match="top_k_two_pass_reasons"):
            mask()(x, poison(torch.empty_like(x)), top_k)


@pytest.mark.parametrize("op,features,top_k,usable", [
    ("renorm_probs", ["top_k"], 64, True), ("renorm_probs", ["top_k"], 1024, False),
    ("renorm_probs", ["top_k", "top_k_per_row"], None, False),
    ("renorm_probs", ["top_p"], None, False), ("top_k_mask_logits", [], 64, True),
    ("top_k_mask_logits", [], 1024, False), ("top_k_mask_logits", ["top_k_per_row"], None, False),
], ids=["small_k", "large_k", "per_row", "top_p", "mask_small_k", "mask_large_k", "mask_per_row"])
def test_dispatch_checks(op, features, top_k, usable):
    shape = {"batch_size": 64, "vocab_size": 131072}
    if top_k is not None:
        shape["top_k"] = top_k
    role = "probs" if op == "renorm_probs" else "logits"
    problem = Problem.make(op, simulated("9.0"), dtypes={role: "float32"}, shape=shape,
                           features=features)
    decision = select(problem, assume_installed=True)
    cand = next(c for c in decision.candidates if c.variant == "two_pass")
    assert cand.usable == usable
    fallback = "triton:bracket" if features == ["top_p"] else "triton"  # top-p: the bracket kernel
    assert decision.name == ("triton:two_pass" if usable else fallback)


@pytest.mark.gpu
def test_gpu_large_vocab_mask():
    x = logits(16, 128256, seed=17, dtype=torch.bfloat16).cuda()
    out = poison(torch.empty_like(x))
    mask()(x, out, 50)
    kept = out != float("-inf")
    assert torch.equal(out[kept], x[kept])
    # kept: exactly the values at or above the smallest kept one, fewer than 50 of them larger
    # (bf16 ties at the boundary are all kept)
    low = x.float().masked_fill(~kept, float("inf")).min(-1, keepdim=True).values
    assert torch.equal(kept, x.float() >= low)
    assert ((x.float() > low).sum(-1) < 50).all() and (kept.sum(-1) >= 50).all()


@pytest.mark.gpu
def test_gpu_large_vocab():
    p = probs_rows(16, 128256, seed=16, power=8.0).cuda()
    out = poison(torch.empty_like(p))
    renorm()(p, out, 50, None)
    want, keep = expected(p, 50)
    assert torch.equal((out != 0).cpu(), keep)
    assert rel_error(out.cpu(), want) < 1e-6
