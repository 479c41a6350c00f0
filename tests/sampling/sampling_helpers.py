"""Helpers shared by the sampling tests.

* the statistical tests' target distributions and checks, from test_sampling_stats.py: the exact
  sampling distribution of each row from the keep rules (``target``, float64), the chi-square
  check of a batch of draws (``assert_samples_follow``, at alpha ``ALPHA``), its inputs
  (``flat_probs``, ``repeated_rows``, ``as_column``), the call of the sampling function of a
  case (``call_sampler``), and the law of chain speculative sampling (``chain_expectation``);
* the Triton kernel tests' inputs and oracles, from test_triton_sampling.py and
  test_triton_softmax_streaming.py: a kernel of the triton backend (``kernel``), random
  distributions and logits (``probs_rows``, ``logits``), rows that are not distributions
  (``with_bad_rows``), the float64 keep set of the contract's rules (``keep_set``), a chain
  speculative call (``spec_inputs``, ``run_spec``), and a chi-square p-value
  (``chi_square_p_value``).

Nothing here imports triton (a kernel resolves when it is called); the @triton.jit helper lives
in triton_draws.py.
"""

import math

import torch

from flashinfer import sampling as S
from flashinfer.dispatch import kernel_for


# --------------------------------------------------------------------------------------------
# the statistical tests

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


def as_column(v, rows):
    """A per-row threshold tensor as a float64 (or long) column; scalars and None as given."""
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


def repeated_rows(num_rows, draws=DRAWS):
    """Row ids ``0..num_rows-1``, each repeated ``draws // num_rows`` times (one batched call)."""
    return torch.arange(num_rows).repeat_interleave(draws // num_rows)


def flat_probs(rows, vocab, seed):
    """Seeded random distributions ``[rows, vocab]`` with no token far below the rest."""
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(rows, vocab, generator=g, dtype=torch.float64) + 0.15
    return (p / p.sum(-1, keepdim=True)).float()


def call_sampler(p, idx, top_k, top_p, min_p, joint, backend, seed):
    """The sampling function of the rules given (top-k with top-p: joint or top-k first)."""
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


def chain_expectation(draft, ids, target_p):
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


# --------------------------------------------------------------------------------------------
# the Triton kernel tests

def kernel(op, variant="default"):
    """The triton backend's kernel of ``op`` / ``variant``, called directly."""
    return kernel_for("triton", op, variant)


def probs_rows(rows, vocab, seed, power=3.0):
    """Seeded random distributions ``[rows, vocab]`` (``power`` skews them), default device."""
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(rows, vocab, generator=g, dtype=torch.float64, device="cpu").pow(power) + 1e-3
    return (p / p.sum(-1, keepdim=True)).float().to(torch.get_default_device())


def with_bad_rows(p):
    """``p [5, V]`` with rows 1-4 made not distributions: a NaN, a negative value, all zeros,
    +inf (row 0 stays valid)."""
    p[1, 7] = float("nan")
    p[2, 3] = -0.1
    p[3] = 0.0
    p[4, 9] = float("inf")
    return p


def as_rows(value, rows):
    """A scalar threshold repeated for every row; None and tensors as given."""
    if value is None or isinstance(value, torch.Tensor):
        return value
    return [value] * rows


def keep_set(p, top_k=None, top_p=None, min_p=None, joint=False):
    """float64 keep mask of the contract's rules; p [R, V]; thresholds None, scalar or per row.
    Computed on the CPU, returned on ``p``'s device."""
    device = p.device
    with torch.device("cpu"):
        keep = _keep_set_cpu(p.double().cpu(), top_k, top_p, min_p, joint)
    return keep.to(device)


def _keep_set_cpu(p, top_k, top_p, min_p, joint):
    rows, vocab = p.shape
    desc = p.sort(-1, descending=True).values
    count = vocab - torch.searchsorted(desc.flip(-1).contiguous(), p, right=True)  # #{p_j > p_x}
    top_sums = torch.cat([torch.zeros(rows, 1, dtype=p.dtype), desc.cumsum(-1)], -1)
    mass = top_sums.gather(-1, count)                                               # sum{p_j > p_x}
    keep = p > 0
    top = p == p.max(-1, keepdim=True).values
    ks = as_rows(top_k, rows)
    ps = as_rows(top_p, rows)
    ms = as_rows(min_p, rows)
    for r in range(rows):
        kr = keep[r].clone()
        k_keep = torch.ones(vocab, dtype=torch.bool)
        if ks is not None and 0 < int(ks[r]) < vocab:
            k_keep = count[r] < int(ks[r])
        kr &= k_keep
        if ps is not None and float(ps[r]) < 1.0:
            base = p[r].sum() if (joint or ks is None) else p[r][k_keep].sum()
            kr &= (mass[r] < float(ps[r]) * base) | top[r]
        if ms is not None:
            kr &= p[r] >= float(ms[r]) * p[r].max()
        keep[r] = kr
    return keep


def spec_inputs(batch, n, vocab, seed):
    """Seeded draft probabilities, draft ids and target probabilities of a chain call."""
    g = torch.Generator().manual_seed(seed)
    draft = torch.rand(batch, n, vocab, generator=g, device="cpu").softmax(-1)
    target = torch.rand(batch, n + 1, vocab, generator=g, device="cpu").softmax(-1)
    ids = torch.randint(0, vocab, (batch, n), generator=g, dtype=torch.int32, device="cpu")
    here = torch.get_default_device()
    return draft.to(here), ids.to(here), target.to(here)


def run_spec(draft, ids, target, seed=1, offset=0, acc0=0, emit0=0):
    """The Triton chain speculative kernel into fresh buffers: (output, accepted, emitted)."""
    batch, n = ids.shape
    output = torch.full((batch, n + 1), -7, dtype=torch.int32)
    accepted = torch.full((batch,), acc0, dtype=torch.int32)
    emitted = torch.full((batch,), emit0, dtype=torch.int32)
    kernel("chain_speculative_sampling")(draft, ids, target, output, accepted, emitted, True,
                                         seed, offset)
    return output, accepted, emitted


def chi_square_p_value(counts, expected_prob):
    """p-value of Pearson's chi-square on the cells with positive expectation."""
    n = counts.sum()
    mask = expected_prob > 0
    e = expected_prob[mask] * n
    stat = float(((counts[mask] - e) ** 2 / e).sum())
    df = int(mask.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def logits(rows, vocab, seed, dtype=torch.float32):
    """Seeded random logits ``[rows, vocab]`` (standard deviation 3) on the default device."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g, device="cpu") * 3
    return x.to(dtype).to(torch.get_default_device())
