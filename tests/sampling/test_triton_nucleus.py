"""Top-p sampling by rejection rounds (variant ``triton:nucleus`` of sampling_from_probs,
``_nucleus_kernels.py``): every draw equal to a float64 mirror of the rounds at the kernel's own
uniforms, every draw in the contract's nucleus (top_p 0, small, large, 1, per row, ties), rows
that are not distributions, the calls it refuses (its check keeps them away); ``gpu``: a
chi-square test and 128k rows."""

import numpy as np
import pytest
import torch

from sampling_helpers import chi_square_p_value, keep_set, probs_rows, with_bad_rows

triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402
from triton.language.random import philox, uint_to_uniform_float  # noqa: E402

from flashinfer.dispatch import kernel_for  # noqa: E402
from flashinfer.backends.triton.sampling import NUCLEUS_MAX_ROUNDS  # noqa: E402

pytestmark = pytest.mark.usefixtures("kernel_device")


def nucleus():
    return kernel_for("triton", "sampling_from_probs", "nucleus")


def draw(p, n_per_row, top_p, seed=7, offset=0, variant="nucleus"):
    rows = p.shape[0]
    idx = torch.arange(rows, dtype=torch.int32, device=p.device).repeat_interleave(n_per_row)
    out = torch.full((idx.numel(),), -7, dtype=torch.int32, device=p.device)
    valid = torch.zeros(idx.numel(), dtype=torch.bool, device=p.device)
    kernel_for("triton", "sampling_from_probs", variant)(
        p, out, valid, idx, None, top_p, None, False, True, seed, offset)
    return idx.long(), out.long(), valid


@triton.jit
def _uniforms_kernel(out, seed, ROUNDS: tl.constexpr):
    """The kernel's uniform of each round for output row i (offset 0): the same counters."""
    i = tl.program_id(0)
    r = tl.arange(0, ROUNDS).to(tl.uint32)
    zero = r * 0
    r0, _r1, _r2, _r3 = philox(tl.zeros([], tl.int64) + seed, r, zero + i.to(tl.uint32),
                               zero + 0xFFFE, zero, 7)
    tl.store(out + i * ROUNDS + tl.arange(0, ROUNDS), uint_to_uniform_float(r0))


def _ord(x):
    b = np.float32(x).view(np.int32).astype(np.int64)
    return b ^ 0x7FFFFFFF if b < 0 else b


def _unord(o):
    o = int(o)
    return float(np.int32(o ^ 0x7FFFFFFF if o < 0 else o).view(np.float32))


def _mirror(p, top_p, block, us):
    """The kernel's rounds in float64 on one row ``p`` (float32 values, numpy)."""
    vocab = p.shape[0]
    order = np.array([t for j in range(block) for t in range(j, vocab, block)])

    def pick(weights, target):
        cdf = np.cumsum(weights[order])
        return int(order[min(np.searchsorted(cdf, target, side="right"), vocab - 1)])

    pd = p.astype(np.float64)
    total, rmax = pd[pd > 0].sum(), float(p.max())
    bound = top_p * total
    t = pick(np.where(pd > 0, pd, 0.0), us[0] * total)
    lo, hi = 0, _ord(rmax)
    for rnd in range(1, NUCLEUS_MAX_ROUNDS):
        p_t = float(p[t])
        lo_t = max(lo, _ord(p_t))
        mid = lo_t + (hi - lo_t) // 2
        thr_mid = _unord(mid)
        m_t, m_mid = pd[pd > p_t].sum(), pd[pd > thr_mid].sum()
        if m_t < bound or p_t == rmax:
            break
        heavy = m_mid >= bound
        lo, hi = (mid, hi) if heavy else (lo_t, mid)
        thr, mass = (thr_mid, m_mid) if heavy else (p_t, m_t)
        t = pick(np.where(pd > thr, pd, 0.0), us[rnd] * mass)
    return t


@pytest.mark.parametrize("top_p", [0.0, 0.3, 0.8, 0.97])
def test_every_draw_is_the_float64_mirror_of_the_rounds(top_p):
    from flashinfer.backends.triton.sampling import _launch_shape

    p = probs_rows(6, 300, seed=int(top_p * 100), power=2.0)
    _, out, valid = draw(p, 1, top_p, seed=9)
    assert valid.all()
    rounds = 64  # a power of two covering NUCLEUS_MAX_ROUNDS
    us = torch.empty(6, rounds, dtype=torch.float32, device=p.device)
    _uniforms_kernel[(6,)](us, 9, ROUNDS=rounds)
    block = 4 * _launch_shape(300, 6)[0]
    pn, un = p.float().cpu().numpy(), us.cpu().double().numpy()
    assert out.cpu().tolist() == [_mirror(pn[r], top_p, block, un[r]) for r in range(6)]


@pytest.mark.parametrize("top_p", [0.0, 0.05, 0.5, 0.9, 1.0])
def test_every_draw_is_in_the_nucleus(top_p):
    p = probs_rows(3, 200, seed=3)
    idx, out, valid = draw(p, 5, top_p)
    assert valid.all()
    assert keep_set(p, top_p=top_p)[idx, out].all(), out.tolist()


def test_a_steep_row_with_top_p_0_climbs_to_its_maximum():
    # masses 2^-j over 120 shuffled tokens: each rejected round halves the bracket, so the
    # rounds reach the single kept token (the maximum) well inside NUCLEUS_MAX_ROUNDS
    g = torch.Generator().manual_seed(11)
    order = torch.randperm(120, generator=g, device="cpu")
    p = torch.pow(0.5, torch.arange(120, dtype=torch.float64, device="cpu"))[order]
    p = (p / p.sum()).float().unsqueeze(0).repeat(4, 1).to(torch.get_default_device())
    for seed in (1, 2, 3):
        _, out, valid = draw(p, 1, 0.0, seed=seed)
        assert valid.all() and (out == int(p[0].argmax())).all()


def test_per_row_top_p_and_ties():
    p = probs_rows(3, 64, seed=4)
    p[1, [3, 9, 20, 41]] = p[1].max() * 1.5  # four equal largest values
    p /= p.sum(-1, keepdim=True)
    ps = torch.tensor([0.2, 0.1, 0.95], device=p.device)
    idx, out, valid = draw(p, 8, ps)
    assert valid.all() and keep_set(p, top_p=ps)[idx, out].all()


def test_rows_that_are_not_distributions_give_token_0_and_invalid():
    p = with_bad_rows(probs_rows(5, 50, seed=5))
    idx, out, valid = draw(p, 1, 0.7)
    assert valid.tolist() == [True, False, False, False, False]
    assert out[1:].tolist() == [0, 0, 0, 0]


def test_calls_it_does_not_serve_are_refused_not_rerouted():
    p = probs_rows(2, 120, seed=8)
    out = torch.full((2,), -7, dtype=torch.int32, device=p.device)
    valid = torch.zeros(2, dtype=torch.bool, device=p.device)
    for args in ((5, 0.7, None), (None, 0.7, 0.1), (None, None, None)):
        with pytest.raises(ValueError, match="nucleus_reasons"):
            nucleus()(p, out, valid, None, *args, False, True, 3, 0)
    assert (out == -7).all()


@pytest.mark.gpu
def test_gpu_chi_square():
    p = probs_rows(1, 48, seed=14).cuda()
    n = 200_000
    _, out, valid = draw(p, n, 0.8)
    assert valid.all()
    keep = keep_set(p.cpu(), top_p=0.8)[0]
    target = p.cpu().double()[0] * keep
    counts = torch.bincount(out.cpu(), minlength=48).double()
    assert (counts[~keep] == 0).all()
    assert chi_square_p_value(counts, target / target.sum()) > 1e-6


@pytest.mark.gpu
def test_gpu_large_vocab_nucleus():
    p = probs_rows(64, 128256, seed=16, power=8.0).cuda()
    idx, out, valid = draw(p, 2, 0.9)
    assert valid.all() and keep_set(p.cpu(), top_p=0.9)[idx.cpu(), out.cpu()].all()
