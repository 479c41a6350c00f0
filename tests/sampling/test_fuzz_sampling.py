"""Fuzz suite, sampling family: per-row thresholds obey the scalars' rules and no NaN leaves a
sampler (the contract: flashinfer.sampling's module docstring, "Per-row thresholds").

* Generated calls with one value wrong in a CPU threshold tensor (top_p / min_p outside [0, 1] or
  NaN, a temperature not a finite number > 0; fp32/fp16/bf16/fp64) raise a ValueError naming
  the argument, the first bad row, its value and what is allowed; the scalar raises too; the
  call with the rows fixed runs.
* The result defined for bad rows on a GPU, checked on every kernel of every backend serving the
  case here (reference, torch, Triton in its interpreter), called through the canonical kernel
  signature: a row with a bad threshold, a row that is not a distribution (NaN, +-inf, negative,
  all zero) and an ``indices`` entry outside the rows give token 0 and ``valid = False``;
  renormalised rows come out zero, softmax rows with a bad temperature too. The good rows of the
  same call keep to float64 naive math: each sampled token in the keep set, renorm and softmax
  values within the dtype's tolerance. Their thresholds are drawn away from every keep boundary
  (fp32 sums cannot move a token across one).
* Chain speculative sampling with NaN probabilities and draft ids outside the vocabulary: only
  accepted in-vocabulary drafts, a replacement token of positive weight (or 0), then -1.
* Shapes at the edges (no rows, an empty vocabulary) and top-k values beyond int32.

GPU (marker ``gpu``): the same generated kernel calls with device tensors over every kernel usable
on the device, the public API with device tensors (no error: the defined result), and a CUDA
graph replayed with per-row thresholds changed in place.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from flashinfer import sampling as S
from flashinfer.dispatch import kernel_for
from flashinfer.dispatch import Problem

from conftest import FUZZ, FUZZ_SLOW, HAS_CUDA, raises_naming, usable_backends

NAN, INF = float("nan"), float("inf")
#: Triton's interpreter runs one program per output row at ~0.1 s: two examples per kernel
INTERPRETED = settings(FUZZ_SLOW, max_examples=2)

BAD_FRACTIONS = [1.5, 2.0, 1e3, -0.25, -1.0, NAN, INF, -INF]
GOOD_FRACTIONS = [0.0, -0.0, 0.25, 0.5, 1.0]
BAD_TEMPERATURES = [0.0, -0.0, -1.0, -1e-3, NAN, INF, -INF]
#: good temperatures of the generated kernel calls (the GPU runs leave out the fp32 subnormal)
TEMPERATURES = [1.0, 0.05, 0.3, 2.5, 1e-30, 1e-40]
#: thresholds of the good rows keep this far (as fractions) from every keep boundary
GAP = 2e-3
#: vocabularies 1..64; the simplest example (hypothesis's first) is 41, not 1
VOCAB = st.integers(0, 63).map(lambda v: (v + 40) % 64 + 1)

# --------------------------------------------------------------------------------------------
# which kernels serve which case

#: case -> (op, dtype key, the features of its Problem, extra shape facts)
CASES = {
    "top_p": ("sampling_from_probs", "probs", ["top_p", "indices"], {}),
    "min_p": ("sampling_from_probs", "probs", ["min_p", "indices"], {}),
    "top_k_top_p": ("sampling_from_probs", "probs", ["top_k", "top_p", "joint", "indices"],
                    {"top_k": 4}),
    "per_row": ("sampling_from_probs", "probs",
                ["top_k", "top_k_per_row", "top_p", "min_p", "joint", "indices"], {}),
    "logits": ("top_k_top_p_sampling_from_logits", "logits", ["top_k", "top_p", "indices"],
               {"top_k": 4}),
    "renorm": ("renorm_probs", "probs", ["top_p"], {}),
    "softmax": ("softmax", "logits", ["temperature"], {}),
    "chain": ("chain_speculative_sampling", "probs", [], {"num_draft": 2}),
}
#: the streaming softmax with rows split into two chunks (its two-launch path)
SPLIT = "triton:streaming/2"


def _names(case: str, device: str) -> list[str]:
    op, key, features, shape = CASES[case]
    if device == "cuda" and not HAS_CUDA:
        return ["reference", "torch", "triton"]  # collected, then skipped by the gpu marker
    problem = Problem.make(op, torch.device(device), dtypes={key: torch.float32},
                           shape={"batch_size": 4, "vocab_size": 64, **shape}, features=features)
    names = usable_backends(problem)
    return names + [SPLIT] if case == "softmax" and "triton:streaming" in names else names


def _kernel(name: str, op: str):
    if name == SPLIT:
        from flashinfer.backends.triton.softmax import softmax_streaming
        return lambda logits, out, t: softmax_streaming(logits, out, t, chunks=2)
    backend, _, variant = name.partition(":")
    return kernel_for(backend, op, variant or "default")


CPU = [(case, name) for case in CASES for name in _names(case, "cpu")]
CPU_FAST = [c for c in CPU if not c[1].startswith("triton")]
CPU_TRITON = [c for c in CPU if c[1].startswith("triton")]
GPU = [(case, name) for case in CASES for name in _names(case, "cuda")]


def _ids(pairs):
    return [f"{case}-{name}" for case, name in pairs]


# --------------------------------------------------------------------------------------------
# float64 naive math


def naive_keep(p: torch.Tensor, k, top_p, min_p, joint: bool) -> torch.Tensor:
    """The contract's keep rules on one float64 row, by all-pairs comparison."""
    larger = p[None, :] > p[:, None]          # [x, j]: p_j > p_x
    count = larger.sum(1)
    mass = (larger * p[None, :]).sum(1)
    keep = p > 0
    if k is not None and 0 < k < p.numel():
        keep &= count < k
    if top_p is not None:
        base = p.sum() if (joint or k is None) else p[keep].sum()
        keep &= (top_p >= 1) | (mass < top_p * base) | (p == p.max())
    if min_p is not None:
        keep &= p >= min_p * p.max()
    return keep


def _between(data, points, lo: float, hi: float) -> float:
    """``lo``, ``hi`` or the midpoint of two neighbours among ``points`` at least GAP apart."""
    pts = sorted({lo, hi, *(float(v) for v in points if lo < v < hi)})
    mids = [(a + b) / 2 for a, b in zip(pts, pts[1:]) if b - a > GAP]
    return data.draw(st.sampled_from([lo, hi] + mids))


def safe_top_p(data, p: torch.Tensor, k, joint: bool) -> float:
    """A top-p whose keep set no rounding changes: away from each token's mass above."""
    larger = p[None, :] > p[:, None]
    mass = (larger * p[None, :]).sum(1)
    cand = p > 0
    if k is not None and 0 < k < p.numel() and not joint:
        cand &= larger.sum(1) < k
    base = p.sum() if (joint or k is None) else p[cand].sum()
    return _between(data, (mass[cand] / base).tolist(), 0.0, 1.0)


def safe_min_p(data, p: torch.Tensor) -> float:
    return _between(data, (p[p > 0] / p.max()).tolist(), 0.0, 1.0)


# --------------------------------------------------------------------------------------------
# generated rows


def _roles(data, rows: int) -> list[str]:
    """Each row: ``good``, ``param`` (a bad threshold) or ``input`` (not a distribution); at
    least one good row and one bad threshold."""
    extra = data.draw(st.lists(st.sampled_from(["good", "param", "input"]),
                               min_size=rows - 2, max_size=rows - 2))
    return data.draw(st.permutations(["good", "param", *extra]))


def _prob_row(data, g: torch.Generator, vocab: int) -> torch.Tensor:
    """A float64 distribution: random, with ties, or with zeros; not always normalised."""
    kind = data.draw(st.sampled_from(["rand", "ties", "zeros"]))
    if kind == "ties":
        p = torch.randint(1, 4, (vocab,), generator=g).double()
    else:
        p = torch.rand(vocab, generator=g, dtype=torch.float64) + 0.05
        if kind == "zeros":
            p[torch.rand(vocab, generator=g) < 0.5] = 0
            p[int(torch.randint(vocab, (1,), generator=g))] = 1.0
    return p / p.sum() * data.draw(st.sampled_from([1.0, 3.0]))


def _spoil_probs(data, row: torch.Tensor) -> torch.Tensor:
    kind = data.draw(st.sampled_from(["nan", "inf", "-inf", "negative", "zeros"]))
    j = data.draw(st.integers(0, row.numel() - 1))
    row = row.clone()
    if kind == "zeros":
        return row.zero_()
    row[j] = {"nan": NAN, "inf": INF, "-inf": -INF, "negative": -0.25}[kind]
    return row


def _logit_row(data, g: torch.Generator, vocab: int) -> torch.Tensor:
    """float64 logits, some ``-inf`` (never all)."""
    scale = data.draw(st.sampled_from([1.0, 4.0]))
    x = torch.randn(vocab, generator=g, dtype=torch.float64) * scale
    if vocab > 1 and data.draw(st.booleans()):
        x[torch.rand(vocab, generator=g) < 0.3] = -INF
        x[int(torch.randint(vocab, (1,), generator=g))] = 0.5
    return x


def _spoil_logits(data, row: torch.Tensor) -> torch.Tensor:
    kind = data.draw(st.sampled_from(["nan", "inf", "all -inf"]))
    row = row.clone()
    if kind == "all -inf":
        return row.fill_(-INF)
    row[data.draw(st.integers(0, row.numel() - 1))] = NAN if kind == "nan" else INF
    return row


def _indices(data, rows: int, device):
    """``(indices tensor or None, the row each output reads)``: without, or a permutation of
    the rows with one entry outside them."""
    if not data.draw(st.booleans()):
        return None, list(range(rows))
    order = data.draw(st.permutations(range(rows)))
    bad = data.draw(st.sampled_from([-1, rows, rows + 3, -(2 ** 31)]))
    at = data.draw(st.integers(0, rows))
    idx = order[:at] + [bad] + order[at:]
    dtype = data.draw(st.sampled_from([torch.int32, torch.int64]))
    return torch.tensor(idx, dtype=dtype, device=device), idx


def _small_k(data, vocab: int) -> int:
    """A scalar top-k the two-pass kernels serve (``1 <= k <= 16``, below the vocabulary)."""
    return data.draw(st.integers(1, max(1, min(16, vocab - 1))))


# --------------------------------------------------------------------------------------------
# one generated kernel call per case, on ``device``; checks on the host


def run_sampler(case: str, name: str, data, device: str) -> None:
    op = CASES[case][0]
    rows = data.draw(st.integers(2, 3))
    vocab = data.draw(VOCAB)
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 16)))
    roles = _roles(data, rows)
    logits = case == "logits"
    # joint only where the case's Problem has it: its kernels were chosen for that Problem
    joint = "joint" in CASES[case][2] and data.draw(st.booleans())
    k_scalar = _small_k(data, vocab) if case in ("top_k_top_p", "logits") else None
    dtype = torch.float32  # probabilities: the op casts them to fp32 before the kernel
    if logits:
        dtype = data.draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
    src, keeps, ks, tps, mps = [], [], [], [], []
    for role in roles:
        if logits:
            x = _logit_row(data, g, vocab).to(dtype).double()
            p = torch.softmax(x, -1)
            row = x if role != "input" else _spoil_logits(data, x)
        else:
            p = _prob_row(data, g, vocab).float().double()  # the values the kernels read
            row = p if role != "input" else _spoil_probs(data, p)
        src.append(row)
        k = k_scalar
        if case == "per_row":
            k = data.draw(st.one_of(st.integers(-3, vocab + 3),
                                    st.sampled_from([2 ** 31 - 1, -(2 ** 31)])))
        tp = safe_top_p(data, p, k, joint) if case != "min_p" else None
        mp = safe_min_p(data, p) if case in ("min_p", "per_row") else None
        keeps.append(naive_keep(p, k, tp, mp, joint))
        if role == "param":  # one threshold of the row breaks its rule
            bad = data.draw(st.sampled_from(BAD_FRACTIONS))
            if mp is not None and (tp is None or data.draw(st.booleans())):
                mp = bad
            else:
                tp = bad
        ks.append(k)
        tps.append(tp)
        mps.append(mp)
    indices, reads = _indices(data, rows, device)
    src_t = torch.stack(src).to(dtype).to(device)

    def as_t(values):
        return None if values[0] is None else torch.tensor(values, dtype=torch.float32,
                                                           device=device)
    top_k = torch.tensor(ks, dtype=torch.int32, device=device) if case == "per_row" else k_scalar
    top_p, min_p = as_t(tps), as_t(mps)
    expect = [0 <= r < rows and roles[r] == "good" for r in reads]
    out = torch.full((len(reads),), -7, device=device,
                     dtype=indices.dtype if indices is not None else torch.int32)
    valid = ~torch.tensor(expect, device=device)  # poisoned: the opposite of the answer
    seed = data.draw(st.integers(0, 2 ** 31))
    kernel = _kernel(name, op)
    if logits:
        kernel(src_t, out, indices, top_k, top_p, joint, True, seed, 0)
    else:
        kernel(src_t, out, valid, indices, top_k, top_p, min_p, joint, True, seed, 0)
    out, valid = out.cpu().tolist(), valid.cpu().tolist()
    for i, (r, good) in enumerate(zip(reads, expect)):
        if not good:
            what = roles[r] if 0 <= r < rows else "outside the rows"
            assert out[i] == 0, f"output {i} (row {r}, {what}): token {out[i]}"
            assert logits or not valid[i], f"output {i} (row {r}) marked valid"
        else:
            assert 0 <= out[i] < vocab and bool(keeps[r][out[i]]), \
                f"output {i} (row {r}): token {out[i]} not in the keep set"
            assert logits or valid[i], f"output {i} (row {r}) marked invalid"


def run_renorm(case: str, name: str, data, device: str) -> None:
    rows = data.draw(st.integers(2, 3))
    vocab = data.draw(VOCAB)
    dtype = data.draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 16)))
    roles = _roles(data, rows)
    src, tps, want = [], [], []
    for role in roles:
        p = _prob_row(data, g, vocab).to(dtype).double()
        tp = safe_top_p(data, p, None, False)
        kept = torch.where(naive_keep(p, None, tp, None, False), p, 0)
        want.append(kept / kept.sum() if role == "good" else torch.zeros_like(p))
        src.append(p if role != "input" else _spoil_probs(data, p))
        tps.append(tp if role != "param" else data.draw(st.sampled_from(BAD_FRACTIONS)))
    probs = torch.stack(src).to(dtype).to(device)
    out = torch.full_like(probs, NAN)
    _kernel(name, "renorm_probs")(probs, out, None, torch.tensor(tps, device=device))
    got, want = out.cpu().double(), torch.stack(want)
    assert not torch.isnan(got).any(), "NaN in the output"
    for r, role in enumerate(roles):
        if role != "good":
            assert bool((got[r] == 0).all()), f"row {r} ({role}) is not zeros"
    tol = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-3, rtol=1e-2)
    torch.testing.assert_close(got, want, **tol)


def run_softmax(case: str, name: str, data, device: str) -> None:
    rows = data.draw(st.integers(2, 3))
    vocab = data.draw(VOCAB)
    dtype = data.draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 16)))
    roles = _roles(data, rows)
    good_t = TEMPERATURES if device == "cpu" else TEMPERATURES[:-1]
    src, ts, want = [], [], []
    for role in roles:
        x = _logit_row(data, g, vocab).to(dtype).double()
        if role == "input":  # a NaN logit: a NaN row (as torch.softmax), unless T is bad
            x[data.draw(st.integers(0, vocab - 1))] = NAN
        t = data.draw(st.sampled_from(good_t))
        bad_t = role == "param" or (role == "input" and data.draw(st.booleans()))
        if bad_t:
            t = data.draw(st.sampled_from(BAD_TEMPERATURES))
        t32 = torch.tensor(t, dtype=torch.float32).double()
        want.append(torch.zeros_like(x) if bad_t else
                    torch.softmax((x - x.max()) / t32, -1))
        src.append(x)
        ts.append(t)
    logits = torch.stack(src).to(dtype).to(device)
    out = torch.full(logits.shape, 12345.0, dtype=torch.float32, device=device)
    _kernel(name, "softmax")(logits, out, torch.tensor(ts, dtype=torch.float32, device=device))
    got, want = out.cpu().double(), torch.stack(want)
    assert torch.equal(torch.isnan(got), torch.isnan(want)), "NaN where float64 math has none"
    fin = ~torch.isnan(want)
    torch.testing.assert_close(got[fin], want[fin], atol=1e-6, rtol=1e-5)


def run_chain(case: str, name: str, data, device: str) -> None:
    batch = data.draw(st.integers(1, 3))
    n = data.draw(st.integers(1, 3))
    vocab = data.draw(VOCAB)
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 16)))
    draft = torch.softmax(torch.randn(batch, n, vocab, generator=g), -1)
    target = torch.softmax(torch.randn(batch, n + 1, vocab, generator=g), -1)
    ids = torch.randint(0, vocab, (batch, n), generator=g, dtype=torch.int32)
    for b in range(batch):
        for j in range(n):
            what = data.draw(st.sampled_from(["same", "same", "plain", "id", "nan draft",
                                              "nan target", "nan target row"]))
            if what == "same":  # accepted (u q < q) unless the id is bad
                target[b, j] = draft[b, j]
            elif what == "id":
                ids[b, j] = data.draw(st.sampled_from([-1, vocab, vocab + 5, -(2 ** 31)]))
            elif what == "nan draft":
                draft[b, j, ids[b, j]] = NAN
            elif what == "nan target":
                target[b, j, ids[b, j]] = NAN
            elif what == "nan target row":
                target[b, j] = NAN
    if data.draw(st.booleans()):
        target[data.draw(st.integers(0, batch - 1)), n] = NAN
    accepted = torch.full((batch,), 3, dtype=torch.int32)
    emitted = torch.full((batch,), 5, dtype=torch.int32)
    out = torch.full((batch, n + 1), -7, dtype=torch.int32)
    dev = lambda t: t.to(device)  # noqa: E731
    acc_d, emi_d, out_d = dev(accepted), dev(emitted), dev(out)
    _kernel(name, "chain_speculative_sampling")(
        dev(draft), dev(ids), dev(target), out_d, acc_d, emi_d, True,
        data.draw(st.integers(0, 2 ** 31)), 0)
    out, acc, pos_all = out_d.cpu(), acc_d.cpu() - 3, emi_d.cpu() - 5
    for b in range(batch):
        pos = int(pos_all[b])
        assert 0 <= pos <= n
        row = out[b].tolist()
        assert row[pos + 1:] == [-1] * (n - pos), f"request {b}: {row}, pos {pos}"
        fine = [0 <= int(d) < vocab and not torch.isnan(draft[b, j, int(d)])
                and not torch.isnan(target[b, j, int(d)]) for j, d in enumerate(ids[b])]
        assert row[:pos] == ids[b, :pos].tolist() and all(fine[:pos]), f"request {b}: {row}"
        assert pos <= int(acc[b]) <= sum(fine)
        t = torch.nan_to_num(target[b, pos].double(), nan=0.0).clamp_min(0)
        weights = t
        if pos < n:
            r = torch.nan_to_num(target[b, pos].double() - draft[b, pos].double(), nan=0.0)
            weights = r.clamp_min(0) if bool((r > 0).any()) else t
        token = row[pos]
        assert 0 <= token < vocab, f"request {b}: token {token}"
        assert (token == 0) if not bool((weights > 0).any()) else bool(weights[token] > 0), \
            f"request {b}: token {token} of no weight"


RUNNERS = {"top_p": run_sampler, "min_p": run_sampler, "top_k_top_p": run_sampler,
           "per_row": run_sampler, "logits": run_sampler, "renorm": run_renorm,
           "softmax": run_softmax, "chain": run_chain}


@pytest.mark.parametrize("case,name", CPU_FAST, ids=_ids(CPU_FAST))
@FUZZ_SLOW
@given(data=st.data())
def test_cpu_bad_rows_get_the_defined_result(case, name, data):
    RUNNERS[case](case, name, data, "cpu")


@pytest.mark.parametrize("case,name", CPU_TRITON, ids=_ids(CPU_TRITON))
@INTERPRETED
@given(data=st.data())
def test_cpu_triton_bad_rows_get_the_defined_result(case, name, data):
    RUNNERS[case](case, name, data, "cpu")


# --------------------------------------------------------------------------------------------
# CPU threshold tensors: checked on the host


def _sample(fn):
    return lambda x, t, b: fn(x, t, seed=0, offset=0, return_valid=True, backend=b)


#: function -> (argument, input kind, call(input, threshold, backend))
HOST = {
    "top_p_sampling_from_probs": ("top_p", "probs", _sample(S.top_p_sampling_from_probs)),
    "min_p_sampling_from_probs": ("min_p", "probs", _sample(S.min_p_sampling_from_probs)),
    "top_k_top_p_sampling_from_probs": (
        "top_p", "probs", lambda x, t, b: S.top_k_top_p_sampling_from_probs(
            x, 2, t, seed=0, offset=0, backend=b)),
    "top_k_top_p_sampling_from_probs_joint_per_row_k": (
        "top_p", "probs", lambda x, t, b: S.top_k_top_p_sampling_from_probs(
            x, torch.full((x.shape[0],), 2, dtype=torch.int64), t, filter_apply_order="joint",
            seed=0, offset=0, backend=b)),
    "top_k_top_p_sampling_from_logits": (
        "top_p", "logits", lambda x, t, b: S.top_k_top_p_sampling_from_logits(
            x, 3, t, seed=0, offset=0, backend=b)),
    "top_p_renorm_probs": ("top_p", "probs", lambda x, t, b: S.top_p_renorm_probs(x, t, backend=b)),
    "softmax": ("temperature", "logits", lambda x, t, b: S.softmax(x, t, backend=b)),
}


@FUZZ
@given(data=st.data())
def test_cpu_bad_threshold_tensor_raises_naming_row_and_value(data):
    fn = data.draw(st.sampled_from(sorted(HOST)))
    name, kind, call = HOST[fn]
    rows, vocab = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 64))
    dtype = data.draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16,
                                       torch.float64]))
    temperature = name == "temperature"
    good = [0.25, 0.5, 1.0, 2.0, 7.0] if temperature else GOOD_FRACTIONS
    bad = BAD_TEMPERATURES if temperature else BAD_FRACTIONS
    values = data.draw(st.lists(st.sampled_from(good), min_size=rows, max_size=rows))
    bad_rows = data.draw(st.lists(st.integers(0, rows - 1), min_size=1, unique=True))
    for r in bad_rows:
        values[r] = data.draw(st.sampled_from(bad))
    t = torch.tensor(values, dtype=torch.float64).to(dtype)
    first = min(bad_rows)
    shown = f"{float(t.float()[first]):.7g}"
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 999)))
    x = torch.rand(rows, vocab, generator=g) + 0.1
    if kind == "logits":
        x = x.log()
    backend = data.draw(st.sampled_from(["reference", "torch", "triton"]))
    allowed = "a finite number > 0" if temperature else "in [0, 1]"
    with raises_naming(name, f"{name}[{first}] = {shown}", allowed):
        call(x, t, backend)
    with raises_naming(name):  # the scalar rule is the same
        call(x, values[first], backend)
    for r in bad_rows:  # fixed: the call runs (the reference: no interpreter)
        t[r] = good[-1]
    result = call(x, t, "reference")
    if isinstance(result, tuple):
        assert bool(result[1].all()), "a good row came out invalid"


def test_cpu_temperature_tensor_is_read_as_float32():
    """A float64 temperature that float32 rounds to 0 is 0 to the kernels: rejected."""
    x = torch.randn(2, 8)
    with raises_naming("temperature", "temperature[1] = 0"):
        S.softmax(x, torch.tensor([1.0, 1e-50], dtype=torch.float64))
    assert torch.isfinite(S.softmax(x, 1e-50)).all()  # a scalar: 1 / T clamped, the arg-max


# --------------------------------------------------------------------------------------------
# edges: no rows, an empty vocabulary, top-k beyond int32

EDGE = {
    "sampling_from_probs": ("probs", lambda x, b: S.sampling_from_probs(x, backend=b)),
    "top_p_sampling_from_probs": (
        "probs", lambda x, b: S.top_p_sampling_from_probs(x, torch.full((x.shape[0],), 0.5),
                                                          return_valid=True, backend=b)),
    "min_p_sampling_from_probs": (
        "probs", lambda x, b: S.min_p_sampling_from_probs(x, torch.full((x.shape[0],), 0.5),
                                                          backend=b)),
    "top_k_top_p_sampling_from_logits": (
        "logits", lambda x, b: S.top_k_top_p_sampling_from_logits(
            x, torch.ones(x.shape[0], dtype=torch.int32), torch.ones(x.shape[0]), backend=b)),
    "sampling_from_logits": ("logits", lambda x, b: S.sampling_from_logits(x, backend=b)),
    "top_p_renorm_probs": ("probs", lambda x, b: S.top_p_renorm_probs(
        x, torch.full((x.shape[0],), 0.5), backend=b)),
    "top_k_renorm_probs": ("probs", lambda x, b: S.top_k_renorm_probs(x, 3, backend=b)),
    "top_k_mask_logits": ("logits", lambda x, b: S.top_k_mask_logits(x, 3, backend=b)),
    "softmax": ("logits", lambda x, b: S.softmax(x, torch.ones(x.shape[0]), backend=b)),
    "chain_speculative_sampling": (
        "draft_probs", lambda x, b: S.chain_speculative_sampling(
            x.unsqueeze(1), torch.zeros(x.shape[0], 1, dtype=torch.int32),
            torch.cat([x.unsqueeze(1)] * 2, 1), backend=b)),
}


@FUZZ
@given(data=st.data())
def test_cpu_no_rows_and_empty_vocabulary(data):
    fn = data.draw(st.sampled_from(sorted(EDGE)))
    kind, call = EDGE[fn]
    backend = data.draw(st.sampled_from(["reference", "torch", "triton"]))
    vocab = data.draw(VOCAB)
    result = call(torch.rand(0, vocab), backend)
    for t in result if isinstance(result, tuple) else (result,):
        assert t.shape[0] == 0
    with raises_naming(kind, "vocabulary"):
        call(torch.rand(data.draw(st.integers(0, 4)), 0), backend)


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_cpu_top_k_beyond_int32_saturates(backend):
    """Every integer is a top-k: int64 values beyond int32 saturate (2**32 + 1 must not
    become 1), so these filter nothing."""
    torch.manual_seed(0)
    p = torch.rand(4, 16)
    x = torch.randn(4, 16)
    k = torch.tensor([2 ** 32 + 1, 2 ** 40, -(2 ** 40), -(2 ** 32) + 1], dtype=torch.int64)
    torch.testing.assert_close(S.top_k_renorm_probs(p, k, backend=backend),
                               p / p.sum(-1, keepdim=True))
    assert torch.equal(S.top_k_mask_logits(x, k, backend=backend), x)
    out, valid = S.top_k_sampling_from_probs(p, k, seed=1, offset=0, return_valid=True,
                                             backend=backend)
    assert bool(valid.all())


@pytest.mark.parametrize("k", [2 ** 70, -(2 ** 70)])
@pytest.mark.parametrize("backend", ["reference", "torch", "triton"])
def test_cpu_scalar_top_k_beyond_int64(backend, k):
    p = torch.rand(2, 16)
    torch.testing.assert_close(S.top_k_renorm_probs(p, k, backend=backend),
                               p / p.sum(-1, keepdim=True))


# --------------------------------------------------------------------------------------------
# GPU: device tensors are never read back; the defined result


@pytest.mark.gpu
@pytest.mark.parametrize("case,name", GPU, ids=_ids(GPU))
@FUZZ_SLOW
@given(data=st.data())
def test_gpu_bad_rows_get_the_defined_result(case, name, data):
    RUNNERS[case](case, name, data, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["reference", "torch", "triton"])
def test_gpu_public_api_bad_rows_get_the_defined_result(backend):
    dev = "cuda"
    torch.manual_seed(3)
    x = torch.randn(4, 100, device=dev)
    p = torch.softmax(x, -1)
    top_p = torch.tensor([0.5, 2.0, NAN, 0.9], device=dev)
    out, valid = S.top_p_sampling_from_probs(p, top_p, seed=0, offset=0, return_valid=True,
                                             backend=backend)
    assert valid.tolist() == [True, False, False, True] and out[1:3].tolist() == [0, 0]
    min_p = torch.tensor([0.1, 2.0, -1.0, NAN], device=dev)
    out, valid = S.min_p_sampling_from_probs(p, min_p, seed=0, offset=0, return_valid=True,
                                             backend=backend)
    assert valid.tolist() == [True, False, False, False] and out[1:].tolist() == [0, 0, 0]
    k = torch.tensor([5, 0, 3, 2 ** 31 - 1], dtype=torch.int32, device=dev)
    out, valid = S.top_k_top_p_sampling_from_probs(p, k, top_p, seed=0, offset=0,
                                                   return_valid=True, backend=backend)
    assert valid.tolist() == [True, False, False, True] and out[1:3].tolist() == [0, 0]
    out = S.top_k_top_p_sampling_from_logits(x, 5, top_p, seed=0, offset=0, backend=backend)
    assert out[1:3].tolist() == [0, 0] and bool(((out >= 0) & (out < 100)).all())
    renormed = S.top_p_renorm_probs(p, top_p, backend=backend)
    assert bool((renormed[1:3] == 0).all()) and not torch.isnan(renormed).any()
    torch.testing.assert_close(renormed[[0, 3]].sum(-1), torch.ones(2, device=dev))
    soft = S.softmax(x, torch.tensor([0.7, 0.0, -1.0, NAN], device=dev), backend=backend)
    assert bool((soft[1:] == 0).all()) and not torch.isnan(soft).any()
    torch.testing.assert_close(soft[0].double(), torch.softmax(x[0].double() / 0.7, -1),
                               atol=1e-6, rtol=1e-5)


@pytest.mark.gpu
def test_gpu_cuda_graph_with_per_row_thresholds_changed_in_place():
    """Per-row tensors as engines pass them (captured once, refilled each step): a bad row is
    returned invalid on every replay, with no host synchronisation in the captured calls."""
    from conftest import capture_cuda_graph

    dev = "cuda"
    torch.manual_seed(5)
    x = torch.randn(6, 4096, device=dev)
    p = torch.softmax(x, -1)
    k = torch.tensor([20, 0, 5, 1, 4096, 50], dtype=torch.int32, device=dev)
    top_p = torch.tensor([0.9, 2.0, 0.5, 1.0, NAN, 0.8], device=dev)
    min_p = torch.tensor([0.1, 0.0, 1.5, 1.0, 0.2, -0.5], device=dev)
    temperature = torch.tensor([1.0, 0.5, 0.0, 2.0, INF, 0.9], device=dev)
    seed, offset = torch.tensor([7], device=dev), torch.tensor([0], device=dev)
    res = {}

    def step():
        res["kp"] = S.top_k_top_p_sampling_from_probs(p, k, top_p, seed=seed, offset=offset,
                                                      return_valid=True, backend="triton")
        res["mp"] = S.min_p_sampling_from_probs(p, min_p, seed=seed, offset=offset,
                                                return_valid=True, backend="triton")
        res["renorm"] = S.top_p_renorm_probs(p, top_p, backend="triton")
        res["soft"] = S.softmax(x, temperature, backend="triton")

    def check(tp, mp, t):
        ok_p = [0.0 <= v <= 1.0 for v in tp]
        ok_m = [0.0 <= v <= 1.0 for v in mp]
        ok_t = [0.0 < v < INF for v in t]
        assert res["kp"][1].tolist() == ok_p and res["mp"][1].tolist() == ok_m
        for (out, valid) in (res["kp"], res["mp"]):
            assert bool((out[~valid] == 0).all()) and bool(((out >= 0) & (out < 4096)).all())
        for name, ok in (("renorm", ok_p), ("soft", ok_t)):
            rows = res[name]
            assert not torch.isnan(rows).any()
            bad = ~torch.tensor(ok, device=dev)
            assert bool((rows[bad] == 0).all())
            sums = rows[~bad].sum(-1)
            torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-4, rtol=0)

    graph = capture_cuda_graph(step)
    graph.replay()
    torch.cuda.synchronize()
    check(top_p.tolist(), min_p.tolist(), temperature.tolist())
    new_p, new_m, new_t = [-0.1, 0.7, 1.0, 3.0, 0.3, 0.0], [NAN, 0.3, 0.0, 1.0, 2.0, 0.5], \
        [0.8, -2.0, 1.0, NAN, 1.5, 1e-30]
    top_p.copy_(torch.tensor(new_p))
    min_p.copy_(torch.tensor(new_m))
    temperature.copy_(torch.tensor(new_t))
    graph.replay()
    torch.cuda.synchronize()
    check(new_p, new_m, new_t)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["reference", "torch", "triton"])
def test_gpu_indices_outside_the_rows_are_invalid_and_recorded(backend):
    """``indices`` on the GPU: the output reading a bad entry is token 0, ``valid=False``, and
    the entry is raised by ``flashinfer.check_errors()`` (the index contract)."""
    import flashinfer

    probs = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], device="cuda")
    idx = torch.tensor([1, 5, 0], device="cuda", dtype=torch.int32)
    out, valid = S.top_k_top_p_sampling_from_probs(probs, 2, 0.9, indices=idx, seed=0, offset=0,
                                                  return_valid=True, backend=backend)
    assert out.tolist() == [2, 0, 1] and valid.tolist() == [True, False, True]
    with raises_naming("indices[1] = 5", "[0, 2)"):
        flashinfer.check_errors()
