"""Statistical tests: each sampling function and backend draws from the renormalised target
distribution, computed here in float64 from the keep rules' definitions (pairwise comparisons,
not the backends' code). One batched call per case (a repeated row through ``indices``), a
chi-square test at alpha = 1e-6 (false-failure probability below 1e-6 per test), fixed seeds.

Kept tokens get expected counts >= ~40, so the chi-square approximation holds at this alpha.
Also: no draw ever lands on a token outside the kept set.
"""

import math

import pytest
import torch

from flashinfer import sampling as S
from sampling_helpers import (as_column, assert_samples_follow, call_sampler, chain_expectation,
                              flat_probs, repeated_rows, target)

BACKENDS = ["reference", "torch"]

CASES = {
    # name: (rows, vocab, top_k, top_p, min_p, joint)
    "plain": (2, 24, None, None, None, False),
    "top_k": (2, 32, 7, None, None, False),
    "top_k_ge_vocab": (1, 16, 16, None, None, False),
    "top_p": (2, 32, None, 0.6, None, False),
    "top_p_one": (1, 16, None, 1.0, None, False),
    "min_p": (2, 32, None, None, 0.55, False),
    "min_p_zero": (1, 16, None, None, 0.0, False),
    "top_k_top_p": (2, 48, 10, 0.7, None, False),
    "joint": (2, 48, 10, 0.4, None, True),
    "per_row": (4, 64, torch.tensor([1, 5, 0, 64], dtype=torch.int32),
                torch.tensor([0.9, 0.3, 0.5, 1.0]), None, False),
    "per_row_min_p": (3, 32, None, None, torch.tensor([0.0, 0.5, 0.9]), False),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_sampling_follows_target(case, backend):
    rows, vocab, top_k, top_p, min_p, joint = CASES[case]
    p = flat_probs(rows, vocab, seed=len(case))
    idx = repeated_rows(rows)
    q = target(p, as_column(top_k, rows), as_column(top_p, rows), as_column(min_p, rows), joint)
    out = call_sampler(p, idx.int(), top_k, top_p, min_p, joint, backend, seed=1234)
    assert_samples_follow(out, idx, q)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ties_at_the_boundary_are_all_kept(backend):
    p = torch.tensor([[0.2, 0.05, 0.2, 0.2, 0.1, 0.1, 0.05, 0.1]])
    idx = repeated_rows(1)
    # top-k 2 keeps the three 0.2s; top-p 0.5: mass above 0.2 is 0 (< 0.5): the 0.2s kept, the
    # 0.1s have 0.6 above them (>= 0.5): dropped
    for top_k, top_p in ((2, None), (None, 0.5), (4, 0.5)):
        q = target(p, top_k, top_p)
        out = call_sampler(p, idx, top_k, top_p, None, False, backend, seed=7)
        assert_samples_follow(out, idx, q)
    assert set(call_sampler(p, idx, 2, None, None, False, backend, 7).tolist()) == {0, 2, 3}


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_mass_on_one_token(backend):
    p = torch.zeros(3, 20)
    p[0, 13] = 1.0
    p[1, 0] = 0.5
    p[2, 19] = 3.0  # unnormalised
    idx = torch.arange(3).repeat(50)
    for top_k, top_p, min_p in ((None, None, None), (3, None, None), (None, 0.1, None),
                                (None, None, 0.9), (1, 0.9, None)):
        out = call_sampler(p, idx, top_k, top_p, min_p, False, backend, seed=3)
        assert out.tolist() == [13, 0, 19] * 50


@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_sampling_follows_softmax(backend):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 32, generator=g) * 0.7
    x[0, :5] = -float("inf")  # zero probability
    idx = repeated_rows(2)
    q = torch.softmax(x.double(), -1)
    out = S.sampling_from_logits(x, indices=idx, seed=5, offset=0, backend=backend)
    assert_samples_follow(out, idx, q)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("order", ["top_k_first", "joint"])
def test_top_k_top_p_from_logits_follows_target(backend, order):
    g = torch.Generator().manual_seed(12)
    x = torch.randn(2, 40, generator=g) * 0.5
    idx = repeated_rows(2)
    q = target(torch.softmax(x.double(), -1), 12, 0.6, joint=order == "joint")
    out = S.top_k_top_p_sampling_from_logits(x, 12, 0.6, indices=idx, filter_apply_order=order,
                                             seed=9, offset=0, backend=backend)
    assert_samples_follow(out, idx, q)


# ------------------------------------------------------------------------------------------
# chain speculative sampling


@pytest.mark.parametrize("backend", BACKENDS)
def test_chain_speculative_counts_and_tokens(backend):
    g = torch.Generator().manual_seed(21)
    n, vocab, batch = 3, 12, 6000
    draft = torch.softmax(torch.randn(n, vocab, generator=g, dtype=torch.float64), -1)
    target_p = torch.softmax(torch.randn(n + 1, vocab, generator=g, dtype=torch.float64), -1)
    ids = torch.stack([draft[i].argmax() for i in range(n)])  # likely-accepted drafts
    p_pos, laws, a = chain_expectation(draft, ids, target_p)
    out, accepted, emitted = S.chain_speculative_sampling(
        draft.float().expand(batch, n, vocab).contiguous(), ids.int().expand(batch, n).contiguous(),
        target_p.float().expand(batch, n + 1, vocab).contiguous(), seed=17, offset=0,
        backend=backend)
    # pos (= emitted) histogram and the token drawn at pos: chi-square on the joint law
    pos = emitted.long()
    token = out.gather(1, pos.unsqueeze(1)).squeeze(1)
    cell = pos * vocab + token.long()
    joint = (p_pos.unsqueeze(-1) * laws).reshape(1, -1)
    assert_samples_follow(cell, torch.zeros(batch, dtype=torch.long), joint)
    assert bool((out.gather(1, (pos + 1).clamp_max(n).unsqueeze(1)).squeeze(1)[pos < n] == -1).all())
    # accepted: a sum of independent Bernoulli(a_i); mean within 5.5 standard errors (p < 4e-8)
    mean, var = float(a.sum()), float((a * (1 - a)).sum())
    assert abs(accepted.double().mean().item() - mean) < 5.5 * math.sqrt(var / batch)
    assert bool((accepted >= emitted).all())
