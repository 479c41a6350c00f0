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

BACKENDS = ["reference", "torch"]
ALPHA = 1e-6
DRAWS = 12000


def chi2_critical(df: int, alpha: float = ALPHA) -> float:
    """Upper alpha quantile of chi-square(df): scipy if installed, else Wilson-Hilferty."""
    try:
        from scipy.stats import chi2
        return float(chi2.isf(alpha, df))
    except ImportError:
        z = 4.753424308822899  # standard normal upper 1e-6 quantile
        return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _larger(p):
    """#{j: p_j > p_x} and sum{p_j: p_j > p_x} for each x, float64, pairwise."""
    gt = p.unsqueeze(-2) > p.unsqueeze(-1)  # [.., x, j]: p_j > p_x
    return gt.sum(-1), (gt * p.unsqueeze(-2)).sum(-1)


def target(p, top_k=None, top_p=None, min_p=None, joint=False):
    """The exact sampling distribution of each row (float64), from the keep rules."""
    p = p.double()
    count, mass = _larger(p)
    keep = p > 0
    if top_k is not None:
        keep &= (top_k <= 0) | (top_k >= p.shape[-1]) | (count < top_k)
    if top_p is not None:
        total = (torch.where(keep, p, 0) if top_k is not None and not joint else p).sum(-1, keepdim=True)
        keep &= (top_p >= 1) | (mass < top_p * total) | (p == p.max(-1, keepdim=True).values)
    if min_p is not None:
        keep &= p >= min_p * p.max(-1, keepdim=True).values
    q = torch.where(keep, p, 0)
    return q / q.sum(-1, keepdim=True)


def _col(v, rows):
    if v is None or not isinstance(v, torch.Tensor):
        return v
    return v.double().unsqueeze(-1) if v.is_floating_point() else v.long().unsqueeze(-1)


def assert_samples_follow(samples, rows, q):
    """Chi-square over every (row, token) cell with q > 0; zero-probability cells never drawn."""
    rows = rows.long()
    stat, df = 0.0, 0
    for r in range(q.shape[0]):
        drawn = samples[rows == r].long()
        n = drawn.numel()
        if n == 0:
            continue
        counts = torch.bincount(drawn, minlength=q.shape[1]).double()
        support = q[r] > 0
        assert counts[~support].sum() == 0, f"row {r}: drew tokens outside the kept set"
        if int(support.sum()) > 1:
            expected = n * q[r][support]
            stat += float(((counts[support] - expected) ** 2 / expected).sum())
            df += int(support.sum()) - 1
    if df:
        assert stat < chi2_critical(df), f"chi-square {stat:.1f} >= critical {chi2_critical(df):.1f} (df {df})"


def _rows(num_rows, draws=DRAWS):
    return torch.arange(num_rows).repeat_interleave(draws // num_rows)


def _dist(rows, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(rows, vocab, generator=g, dtype=torch.float64) + 0.15
    return (p / p.sum(-1, keepdim=True)).float()


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


def _call(p, idx, top_k, top_p, min_p, joint, backend, seed):
    kw = dict(indices=idx, seed=seed, offset=0, backend=backend)
    if top_k is not None and top_p is not None:
        return S.top_k_top_p_sampling_from_probs(p, top_k, top_p,
                                                 filter_apply_order="joint" if joint else "top_k_first", **kw)
    if top_k is not None:
        return S.top_k_sampling_from_probs(p, top_k, **kw)
    if top_p is not None:
        return S.top_p_sampling_from_probs(p, top_p, **kw)
    if min_p is not None:
        return S.min_p_sampling_from_probs(p, min_p, **kw)
    return S.sampling_from_probs(p, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_sampling_follows_target(case, backend):
    rows, vocab, top_k, top_p, min_p, joint = CASES[case]
    p = _dist(rows, vocab, seed=len(case))
    idx = _rows(rows)
    q = target(p, _col(top_k, rows), _col(top_p, rows), _col(min_p, rows), joint)
    out = _call(p, idx.int(), top_k, top_p, min_p, joint, backend, seed=1234)
    assert_samples_follow(out, idx, q)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ties_at_the_boundary_are_all_kept(backend):
    p = torch.tensor([[0.2, 0.05, 0.2, 0.2, 0.1, 0.1, 0.05, 0.1]])
    idx = _rows(1)
    # top-k 2 keeps the three 0.2s; top-p 0.5: mass above 0.2 is 0 (< 0.5): the 0.2s kept, the
    # 0.1s have 0.6 above them (>= 0.5): dropped
    for top_k, top_p in ((2, None), (None, 0.5), (4, 0.5)):
        q = target(p, top_k, top_p)
        out = _call(p, idx, top_k, top_p, None, False, backend, seed=7)
        assert_samples_follow(out, idx, q)
    assert set(_call(p, idx, 2, None, None, False, backend, 7).tolist()) == {0, 2, 3}


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_mass_on_one_token(backend):
    p = torch.zeros(3, 20)
    p[0, 13] = 1.0
    p[1, 0] = 0.5
    p[2, 19] = 3.0  # unnormalised
    idx = torch.arange(3).repeat(50)
    for top_k, top_p, min_p in ((None, None, None), (3, None, None), (None, 0.1, None),
                                (None, None, 0.9), (1, 0.9, None)):
        out = _call(p, idx, top_k, top_p, min_p, False, backend, seed=3)
        assert out.tolist() == [13, 0, 19] * 50


@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_sampling_follows_softmax(backend):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 32, generator=g) * 0.7
    x[0, :5] = -float("inf")  # zero probability
    idx = _rows(2)
    q = torch.softmax(x.double(), -1)
    out = S.sampling_from_logits(x, indices=idx, seed=5, offset=0, backend=backend)
    assert_samples_follow(out, idx, q)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("order", ["top_k_first", "joint"])
def test_top_k_top_p_from_logits_follows_target(backend, order):
    g = torch.Generator().manual_seed(12)
    x = torch.randn(2, 40, generator=g) * 0.5
    idx = _rows(2)
    q = target(torch.softmax(x.double(), -1), 12, 0.6, joint=order == "joint")
    out = S.top_k_top_p_sampling_from_logits(x, 12, 0.6, indices=idx, filter_apply_order=order,
                                             seed=9, offset=0, backend=backend)
    assert_samples_follow(out, idx, q)


# ------------------------------------------------------------------------------------------
# chain speculative sampling


def _chain_expectation(draft, ids, target_p):
    """float64: P(pos = j) for j in 0..n, the token law at each pos, and E[accepted]."""
    n = ids.shape[0]
    a = torch.tensor([min(1.0, float(target_p[i, ids[i]] / draft[i, ids[i]])) for i in range(n)],
                     dtype=torch.float64)
    p_pos = torch.zeros(n + 1, dtype=torch.float64)
    survive = 1.0
    for j in range(n):
        p_pos[j] = survive * (1 - a[j])
        survive *= float(a[j])
    p_pos[n] = survive
    laws = []
    for j in range(n + 1):
        w = (target_p[j] - draft[j]).clamp_min(0) if j < n else target_p[n]
        laws.append(w / w.sum())
    return p_pos, torch.stack(laws), a


@pytest.mark.parametrize("backend", BACKENDS)
def test_chain_speculative_counts_and_tokens(backend):
    g = torch.Generator().manual_seed(21)
    n, vocab, batch = 3, 12, 6000
    draft = torch.softmax(torch.randn(n, vocab, generator=g, dtype=torch.float64), -1)
    target_p = torch.softmax(torch.randn(n + 1, vocab, generator=g, dtype=torch.float64), -1)
    ids = torch.stack([draft[i].argmax() for i in range(n)])  # likely-accepted drafts
    p_pos, laws, a = _chain_expectation(draft, ids, target_p)
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
