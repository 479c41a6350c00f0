"""flashinfer.sampling: validation, return conventions, generators, indices, thresholds,
torch.compile, reproducibility, invalid rows. CPU, reference and torch backends."""

import pytest
import torch

import flashinfer
from flashinfer import sampling as S

BACKENDS = ["reference", "torch"]


def _probs(rows=4, vocab=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(rows, vocab, generator=g) + 0.05
    return p / p.sum(-1, keepdim=True)


def _sample_fns():
    """Every sampling entry point as (name, fn(probs, **kw))."""
    return {
        "plain": lambda p, **kw: S.sampling_from_probs(p, **kw),
        "top_p": lambda p, **kw: S.top_p_sampling_from_probs(p, 0.7, **kw),
        "top_k": lambda p, **kw: S.top_k_sampling_from_probs(p, 5, **kw),
        "min_p": lambda p, **kw: S.min_p_sampling_from_probs(p, 0.3, **kw),
        "top_k_top_p": lambda p, **kw: S.top_k_top_p_sampling_from_probs(p, 5, 0.7, **kw),
        "joint": lambda p, **kw: S.top_k_top_p_sampling_from_probs(
            p, 5, 0.7, filter_apply_order="joint", **kw),
    }


# ------------------------------------------------------------------------------------------
# validation: one case per rule, exception type and the argument named

P = _probs()

BAD = [
    ("probs", TypeError, lambda: S.sampling_from_probs(P.long())),
    ("probs", ValueError, lambda: S.sampling_from_probs(P[0])),
    ("probs", TypeError, lambda: S.sampling_from_probs(P.numpy())),
    ("indices", TypeError, lambda: S.sampling_from_probs(P, indices=torch.zeros(3))),
    ("indices", ValueError, lambda: S.sampling_from_probs(P, indices=torch.zeros(3, 1, dtype=torch.int32))),
    ("top_k", TypeError, lambda: S.top_k_sampling_from_probs(P, 2.5)),
    ("top_k", ValueError, lambda: S.top_k_sampling_from_probs(P, torch.ones(3, dtype=torch.int32))),
    ("top_k", TypeError, lambda: S.top_k_sampling_from_probs(P, torch.ones(4))),
    ("top_p", ValueError, lambda: S.top_p_sampling_from_probs(P, 1.5)),
    ("top_p", ValueError, lambda: S.top_p_sampling_from_probs(P, -0.1)),
    ("top_p", TypeError, lambda: S.top_p_sampling_from_probs(P, "0.5")),
    ("top_p", ValueError, lambda: S.top_p_sampling_from_probs(P, torch.ones(5))),
    ("min_p", ValueError, lambda: S.min_p_sampling_from_probs(P, 2.0)),
    ("filter_apply_order", ValueError,
     lambda: S.top_k_top_p_sampling_from_probs(P, 2, 0.5, filter_apply_order="both")),
    ("seed and offset", ValueError, lambda: S.sampling_from_probs(P, seed=1)),
    ("seed and offset", ValueError, lambda: S.sampling_from_probs(P, seed=1, offset=torch.tensor([0]))),
    ("seed", ValueError, lambda: S.sampling_from_probs(P, seed=-1, offset=0)),
    ("seed", TypeError, lambda: S.sampling_from_probs(P, seed=1.0, offset=0)),
    ("seed", TypeError, lambda: S.sampling_from_probs(P, seed=torch.tensor([1], dtype=torch.int32),
                                                      offset=torch.tensor([1], dtype=torch.int32))),
    ("seed", ValueError, lambda: S.sampling_from_probs(P, seed=torch.tensor([1, 2]),
                                                       offset=torch.tensor([1, 2]))),
    ("generator", TypeError, lambda: S.sampling_from_probs(P, generator=1)),
    ("temperature", ValueError, lambda: S.softmax(P, 0.0)),
    ("temperature", ValueError, lambda: S.softmax(P, torch.ones(3))),
    ("logits", TypeError, lambda: S.top_k_mask_logits(P.int(), 3)),
    ("backend", TypeError, lambda: S.sampling_from_probs(P, backend=None)),
    ("target_probs", ValueError,
     lambda: S.chain_speculative_sampling(torch.rand(2, 3, 8), torch.zeros(2, 3, dtype=torch.int32),
                                          torch.rand(2, 3, 8))),
    ("draft_token_ids", TypeError,
     lambda: S.chain_speculative_sampling(torch.rand(2, 3, 8), torch.zeros(2, 3),
                                          torch.rand(2, 4, 8))),
    ("draft_token_ids", ValueError,
     lambda: S.chain_speculative_sampling(torch.rand(2, 3, 8), torch.zeros(2, 2, dtype=torch.int32),
                                          torch.rand(2, 4, 8))),
    ("maybe_output_accepted_token_num", TypeError,
     lambda: S.chain_speculative_sampling(torch.rand(2, 3, 8), torch.zeros(2, 3, dtype=torch.int32),
                                          torch.rand(2, 4, 8), torch.zeros(2))),
]


@pytest.mark.parametrize("name,exc,call", BAD, ids=[f"{i}-{b[0]}" for i, b in enumerate(BAD)])
def test_bad_input_names_the_argument(name, exc, call):
    with pytest.raises(exc, match=name):
        call()


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError):
        S.sampling_from_probs(P, backend="no_such_backend")


def test_torch_backend_rejects_tensor_seeds():
    seeds = dict(seed=torch.tensor([1]), offset=torch.tensor([0]))
    with pytest.raises(flashinfer.BackendUnavailableError, match="seed_tensor"):
        S.sampling_from_probs(P, backend="torch", **seeds)


# ------------------------------------------------------------------------------------------
# return conventions


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", list(_sample_fns()))
def test_return_conventions(fn, backend):
    call = _sample_fns()[fn]
    out = call(P, seed=3, offset=0, backend=backend)
    assert out.dtype == torch.int32 and out.shape == (4,)
    idx = torch.tensor([3, 0, 0, 2, 1], dtype=torch.int64)
    out, valid = call(P, indices=idx, seed=3, offset=0, return_valid=True, backend=backend)
    assert out.dtype == torch.int64 and out.shape == (5,)
    assert valid.dtype == torch.bool and bool(valid.all())


def test_logits_entry_points_return_int32_or_indices_dtype():
    logits = torch.randn(3, 10)
    assert S.sampling_from_logits(logits).dtype == torch.int32
    idx = torch.tensor([2, 2], dtype=torch.int64)
    assert S.sampling_from_logits(logits, indices=idx).dtype == torch.int64
    out = S.top_k_top_p_sampling_from_logits(logits, 3, 0.9, indices=idx)
    assert out.dtype == torch.int64 and out.shape == (2,)


def test_chain_counters_are_added_into_given_tensors():
    torch.manual_seed(1)
    d = torch.rand(2, 3, 8).softmax(-1)
    t = torch.rand(2, 4, 8).softmax(-1)
    ids = torch.randint(0, 8, (2, 3), dtype=torch.int32)
    acc = torch.full((2,), 10, dtype=torch.int32)
    emi = torch.full((2,), 20, dtype=torch.int32)
    out, acc2, emi2 = S.chain_speculative_sampling(d, ids, t, acc, emi, seed=5, offset=0)
    assert acc2 is acc and emi2 is emi
    assert out.dtype == torch.int32 and out.shape == (2, 4)
    fresh, a0, e0 = S.chain_speculative_sampling(d, ids, t, seed=5, offset=0)
    assert torch.equal(fresh, out)
    assert torch.equal(acc, a0 + 10) and torch.equal(emi, e0 + 20)
    for b in range(2):
        pos = int(e0[b])
        assert torch.equal(out[b, :pos], ids[b, :pos])
        assert 0 <= int(out[b, pos]) < 8 and bool((out[b, pos + 1:] == -1).all())


def test_aliases_and_top_level_exports():
    assert S.top_p_renorm_prob is S.top_p_renorm_probs
    assert S.top_k_renorm_prob is S.top_k_renorm_probs
    for name in ("sampling_from_probs", "top_k_top_p_sampling_from_logits", "softmax",
                 "chain_speculative_sampling", "top_k_mask_logits", "top_p_renorm_probs"):
        assert getattr(flashinfer, name) is getattr(S, name)


# ------------------------------------------------------------------------------------------
# generators and reproducibility


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", list(_sample_fns()))
def test_same_seed_offset_is_bit_identical(fn, backend):
    call = _sample_fns()[fn]
    p = _probs(64, 32, seed=1)
    a = call(p, seed=123, offset=8, backend=backend)
    b = call(p, seed=123, offset=8, backend=backend)
    c = call(p, seed=123, offset=12, backend=backend)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)  # 64 rows of 32 tokens: equal by chance ~never


def test_tensor_seeds_match_int_seeds_on_reference():
    p = _probs(6, 16)
    a = S.sampling_from_probs(p, seed=7, offset=4, backend="reference")
    b = S.sampling_from_probs(p, seed=torch.tensor([7]), offset=torch.tensor([4]), backend="reference")
    c = S.sampling_from_probs(p, seed=torch.full((6,), 7), offset=torch.full((6,), 4),
                              backend="reference")
    assert torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cpu_generator_advances_and_replays(backend):
    p = _probs(64, 32)
    g = torch.Generator().manual_seed(42)
    a = S.top_p_sampling_from_probs(p, 0.9, generator=g, backend=backend)
    b = S.top_p_sampling_from_probs(p, 0.9, generator=g, backend=backend)
    g.manual_seed(42)
    a2 = S.top_p_sampling_from_probs(p, 0.9, generator=g, backend=backend)
    assert torch.equal(a, a2) and not torch.equal(a, b)


def test_default_generator_follows_manual_seed():
    p = _probs(64, 32)
    torch.manual_seed(9)
    a = S.sampling_from_probs(p)
    torch.manual_seed(9)
    assert torch.equal(a, S.sampling_from_probs(p))


def test_get_seed_and_offset_cpu():
    g = torch.Generator().manual_seed(1)
    s1, o1 = S.get_seed_and_offset(100, g)
    s2, _ = S.get_seed_and_offset(100, g)
    assert o1 == 0 and s1 != s2 and 0 <= s1 < 2**62


# ------------------------------------------------------------------------------------------
# indices and per-row thresholds


@pytest.mark.parametrize("backend", BACKENDS)
def test_indices_map_outputs_to_rows(backend):
    eye = torch.eye(8)[[5, 1, 7]]  # row r is one-hot on token [5, 1, 7][r]
    idx = torch.tensor([2, 0, 0, 1, 2, 1], dtype=torch.int32)
    for call in _sample_fns().values():
        out = call(eye, indices=idx, seed=1, offset=0, backend=backend)
        assert out.tolist() == [7, 5, 5, 1, 7, 1]
    out = S.sampling_from_logits(eye.log(), indices=idx, seed=1, offset=0, backend=backend)
    assert out.tolist() == [7, 5, 5, 1, 7, 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_row_thresholds_read_at_the_mapped_row(backend):
    p = torch.tensor([[0.4, 0.3, 0.2, 0.1]] * 2)
    idx = torch.tensor([0, 1] * 200)
    k = torch.tensor([1, 4], dtype=torch.int32)  # row 0 greedy, row 1 unfiltered
    out = S.top_k_sampling_from_probs(p, k, indices=idx, seed=2, offset=0, backend=backend)
    assert bool((out[0::2] == 0).all()) and len(set(out[1::2].tolist())) == 4
    top_p = torch.tensor([0.0, 1.0])
    out = S.top_p_sampling_from_probs(p, top_p, indices=idx, seed=2, offset=0, backend=backend)
    assert bool((out[0::2] == 0).all()) and len(set(out[1::2].tolist())) == 4
    min_p = torch.tensor([1.0, 0.0])
    out = S.min_p_sampling_from_probs(p, min_p, indices=idx, seed=2, offset=0, backend=backend)
    assert bool((out[0::2] == 0).all()) and len(set(out[1::2].tolist())) == 4


# ------------------------------------------------------------------------------------------
# invalid rows, NaN, never an id outside the vocabulary


@pytest.mark.parametrize("backend", BACKENDS)
def test_invalid_rows_give_token_zero_and_invalid(backend):
    good = [0.0, 0.0, 1.0, 0.0]
    p = torch.tensor([good, [float("nan"), 0.5, 0.5, 0.0], [0.0] * 4, [-0.1, 0.5, 0.6, 0.0],
                      [float("inf"), 0.0, 0.0, 0.0]])
    idx = torch.tensor([0, 1, 2, 3, 4])
    for call in _sample_fns().values():
        out, valid = call(p, indices=idx, seed=0, offset=0, return_valid=True, backend=backend)
        assert out.tolist() == [2, 0, 0, 0, 0]
        assert valid.tolist() == [True] + [False] * 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_indices_outside_the_rows_raise_on_the_cpu(backend):
    """Index arrays on the host are checked there (the kernels' invalid-row result for such an
    entry, on a GPU, is tested kernel by kernel in test_fuzz_sampling.py)."""
    p = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    for bad in (2, -1):
        idx = torch.tensor([0, 1, bad])
        for call in _sample_fns().values():
            with pytest.raises(ValueError, match=rf"indices\[2\] = {bad}.*\[0, 2\)"):
                call(p, indices=idx, seed=0, offset=0, backend=backend)
        with pytest.raises(ValueError, match=r"indices\[2\]"):
            S.sampling_from_logits(p, indices=idx, seed=0, offset=0, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_nan_or_all_neg_inf_rows_give_zero(backend):
    inf = float("inf")
    x = torch.tensor([[-inf, -inf, 3.0], [float("nan"), 0.0, 0.0], [-inf, -inf, -inf]])
    out = S.sampling_from_logits(x, seed=0, offset=0, backend=backend)
    assert out.tolist() == [2, 0, 0]


def test_check_nan_raises():
    p = _probs()
    p[1, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        S.top_p_sampling_from_probs(p, 0.5, check_nan=True)
    with pytest.raises(ValueError, match="NaN"):
        S.sampling_from_logits(p, check_nan=True)
    with pytest.raises(ValueError, match="NaN"):
        S.top_k_top_p_sampling_from_logits(p, 3, 0.5, check_nan=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_never_an_id_outside_the_vocab(backend):
    torch.manual_seed(3)
    p = torch.rand(256, 50) ** 8  # heavy-tailed rows, many near-zero entries
    p[::7] = 0
    p[::5, ::3] = 0
    p[3::11, 7] = float("nan")
    p[::13, 1] = -1
    for call in _sample_fns().values():
        out = call(p, seed=1, offset=0, backend=backend)
        assert bool(((out >= 0) & (out < 50)).all())
        ok = ~torch.isnan(p).any(-1) & (p >= 0).all(-1) & (p.sum(-1) > 0)
        assert bool((p[ok].gather(1, out[ok].long().unsqueeze(1)) > 0).all())


# ------------------------------------------------------------------------------------------
# renorm / mask / softmax values against float64 computations written here


def _top_k_keep(x, k):
    larger = (x.unsqueeze(-1) < x.unsqueeze(-2)).sum(-1)
    return (k <= 0) | (k >= x.shape[-1]) | (larger < k)


def _top_p_keep(p, top_p):
    larger_mass = (p.unsqueeze(-2) * (p.unsqueeze(-1) < p.unsqueeze(-2))).sum(-1)
    is_max = p == p.max(-1, keepdim=True).values
    return (p > 0) & ((top_p >= 1) | (larger_mass < top_p * p.sum(-1, keepdim=True)) | is_max)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_renorm_probs(backend, dtype):
    p = _probs(6, 40, seed=4).to(dtype)
    p64 = p.double()
    k = torch.tensor([1, 3, 7, 40, 0, 100], dtype=torch.int32)
    keep = _top_k_keep(p64, k.long().unsqueeze(-1))
    expect = torch.where(keep, p64, 0) / torch.where(keep, p64, 0).sum(-1, keepdim=True)
    out = S.top_k_renorm_probs(p, k, backend=backend)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), expect, atol=2e-3 if dtype != torch.float32 else 1e-6,
                               rtol=1e-2 if dtype != torch.float32 else 1e-5)
    top_p = torch.tensor([0.0, 0.2, 0.5, 0.9, 1.0, 0.75])
    keep = _top_p_keep(p64, top_p.double().unsqueeze(-1))
    expect = torch.where(keep, p64, 0) / torch.where(keep, p64, 0).sum(-1, keepdim=True)
    out = S.top_p_renorm_probs(p, top_p, backend=backend)
    torch.testing.assert_close(out.double(), expect, atol=2e-3 if dtype != torch.float32 else 1e-6,
                               rtol=1e-2 if dtype != torch.float32 else 1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_top_k_mask_logits_with_ties(backend):
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 0.5], [5.0, 4.0, 3.0, 2.0, 1.0]], dtype=torch.bfloat16)
    out = S.top_k_mask_logits(x, torch.tensor([2, 6], dtype=torch.int32), backend=backend)
    inf = float("inf")
    assert out.dtype == torch.bfloat16
    assert out.float().tolist() == [[-inf, 3.0, 3.0, -inf, -inf], [5.0, 4.0, 3.0, 2.0, 1.0]]
    assert S.top_k_mask_logits(x, 1, backend=backend).float().tolist()[1] == [5.0] + [-inf] * 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_softmax(backend):
    torch.manual_seed(5)
    x = torch.randn(5, 33, dtype=torch.float16)
    t = torch.rand(5) + 0.2
    expect = torch.softmax(x.double() / t.double().unsqueeze(-1), -1)
    torch.testing.assert_close(S.softmax(x, t, backend=backend).double(), expect, atol=1e-6, rtol=1e-5)
    expect = torch.softmax(x.double() / 0.7, -1)
    out = S.softmax(x, 0.7, backend=backend)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), expect, atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------------------------------
# torch.compile


def test_torch_compile_fullgraph_matches_eager():
    p = _probs(8, 24)
    x = torch.randn(8, 24)

    def f(p, x):
        a = S.top_k_top_p_sampling_from_probs(p, 5, 0.8, seed=11, offset=4)
        b, valid = S.min_p_sampling_from_probs(p, 0.2, seed=11, offset=4, return_valid=True)
        c = S.sampling_from_logits(x, seed=11, offset=4)
        d = S.top_k_renorm_probs(p, 3) + S.top_p_renorm_probs(p, 0.5)
        e = S.top_k_mask_logits(x, 4)
        f_ = S.softmax(x, 0.5)
        return a, b, valid, c, d, e, f_

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(p, x), f(p, x)):
        assert torch.equal(got, want)


def test_torch_compile_default_generator_and_chain():
    torch.manual_seed(2)
    d = torch.rand(3, 2, 8).softmax(-1)
    t = torch.rand(3, 3, 8).softmax(-1)
    ids = torch.randint(0, 8, (3, 2), dtype=torch.int32)

    def f(p):
        out = S.sampling_from_probs(p)  # default generator read inside the op
        chain = S.chain_speculative_sampling(d, ids, t, seed=3, offset=0)
        return out, chain

    p = _probs(6, 16)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.manual_seed(1)
    got = compiled(p)
    torch.manual_seed(1)
    want = f(p)
    assert torch.equal(got[0], want[0])
    for g_, w_ in zip(got[1], want[1]):
        assert torch.equal(g_, w_)


def test_repeated_scalar_calls_skip_the_checks_but_not_the_overrides_nor_the_generator():
    """The steady-state memo of sampling_from_probs-family calls (ops._CHECKED_DRAWS): a repeat
    draws from the advanced generator, follows a use_backend override, and a call that differs
    only in an argument's type (True for 1) is checked again."""
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(3, 50), -1)
    from flashinfer.sampling import ops

    ops._CHECKED_DRAWS.clear()
    call = lambda: flashinfer.top_k_top_p_sampling_from_probs(probs, 1, 0.9)  # noqa: E731
    first = call()
    assert len(ops._CHECKED_DRAWS) == 1
    with flashinfer.record_decisions() as log:
        assert torch.equal(call(), first)  # top_k = 1: the arg-max, whatever the draw
    assert log[-1].problem.op == "sampling_from_probs" and log[-1].backend == "reference"
    torch.manual_seed(5)
    a = flashinfer.sampling_from_probs(probs)
    torch.manual_seed(5)
    assert torch.equal(flashinfer.sampling_from_probs(probs), a)  # the generator is read per call
    with flashinfer.use_backend(sampling="torch"), flashinfer.record_decisions() as log:
        call()
    assert log[-1].backend == "torch"
    with pytest.raises(TypeError, match="top_k"):
        flashinfer.top_k_top_p_sampling_from_probs(probs, True, 0.9)
