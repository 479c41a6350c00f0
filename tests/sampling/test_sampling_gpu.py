"""Sampling on CUDA, every backend (reference, torch, triton): chi-square tests at vocab 64,
smoke tests at vocab 32k / 128k (valid ids, kept tokens only, determinism), value tests of
renorm / mask / softmax in fp16/bf16/fp32, CUDA generator offsets, and CUDA-graph capture with
tensor seeds for the backends that never sync. A backend whose record rejects a problem is
skipped with the dispatcher's reasons."""

import pytest
import torch

from flashinfer import BackendUnavailableError
from flashinfer import sampling as S
from sampling_helpers import (as_column, assert_samples_follow, call_sampler, flat_probs,
                              repeated_rows, target)

pytestmark = pytest.mark.gpu

BACKENDS = ["reference", "torch", "triton"]
DEV = "cuda"


def run(backend, fn, *args, **kwargs):
    """Call ``fn``; skip (with the reasons) when ``backend`` cannot run this problem."""
    try:
        return fn(*args, backend=backend, **kwargs)
    except BackendUnavailableError as exc:
        pytest.skip(f"{backend} rejects this problem: {exc}")


CASES = {
    "plain": (2, None, None, None, False),
    "top_k": (2, 7, None, None, False),
    "top_p": (2, None, 0.6, None, False),
    "min_p": (2, None, None, 0.55, False),
    "top_k_top_p": (2, 10, 0.7, None, False),
    "joint": (2, 10, 0.4, None, True),
    "per_row": (4, torch.tensor([1, 5, 0, 64], dtype=torch.int32),
                torch.tensor([0.9, 0.3, 0.5, 1.0]), None, False),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_vocab64_follows_target(case, backend):
    rows, top_k, top_p, min_p, joint = CASES[case]
    p = flat_probs(rows, 64, seed=len(case))
    idx = repeated_rows(rows, 24000)
    q = target(p, as_column(top_k, rows), as_column(top_p, rows), as_column(min_p, rows), joint)
    dev = lambda v: v.to(DEV) if isinstance(v, torch.Tensor) else v  # noqa: E731
    out = run(backend, lambda **kw: call_sampler(p.to(DEV), idx.to(DEV).int(), dev(top_k),
                                                 dev(top_p), dev(min_p), joint, kw["backend"],
                                                 seed=99))
    assert out.device.type == "cuda"
    assert_samples_follow(out.cpu(), idx, q)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_vocab64_logits_follow_softmax(backend, dtype):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 64, generator=g) * 0.5).to(dtype)
    x[1, :9] = -float("inf")
    idx = repeated_rows(2, 24000)
    q = torch.softmax(x.double(), -1)
    out = run(backend, S.sampling_from_logits, x.to(DEV), indices=idx.to(DEV), seed=4, offset=0)
    assert_samples_follow(out.cpu(), idx, q)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("vocab", [32768, 131072])
def test_large_vocab_smoke(backend, vocab):
    torch.manual_seed(0)
    batch = 16
    logits = torch.randn(batch, vocab, device=DEV) * 3
    p = torch.softmax(logits, -1)
    calls = {
        "plain": lambda **kw: S.sampling_from_probs(p, **kw),
        "top_k": lambda **kw: S.top_k_sampling_from_probs(p, 50, **kw),
        "top_p": lambda **kw: S.top_p_sampling_from_probs(p, 0.9, **kw),
        "min_p": lambda **kw: S.min_p_sampling_from_probs(p, 0.1, **kw),
        "top_k_top_p": lambda **kw: S.top_k_top_p_sampling_from_probs(p, 50, 0.9, **kw),
        "logits": lambda **kw: S.sampling_from_logits(logits, **kw),
        "logits_top_k_top_p": lambda **kw: S.top_k_top_p_sampling_from_logits(logits, 50, 0.9, **kw),
    }
    kth = p.topk(50, dim=-1).values[:, -1:]
    for name, call in calls.items():
        a = run(backend, call, seed=5, offset=8)
        b = run(backend, call, seed=5, offset=8)
        assert torch.equal(a, b), f"{name}: not reproducible"
        assert bool(((a >= 0) & (a < vocab)).all()), name
        chosen = p.gather(1, a.long().unsqueeze(1))
        assert bool((chosen > 0).all()), name
        if "top_k" in name:
            assert bool((chosen >= kth).all()), f"{name}: token outside the top-k"
        if name == "min_p":
            assert bool((chosen >= 0.1 * p.max(-1, keepdim=True).values).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_vocab_invalid_rows(backend):
    p = torch.rand(4, 131072, device=DEV)
    p[1, 7] = float("nan")
    p[2] = 0
    p[3, 5] = -1
    out, valid = run(backend, S.top_k_top_p_sampling_from_probs, p, 20, 0.8, seed=1, offset=0,
                     return_valid=True)
    assert valid.tolist() == [True, False, False, False]
    assert out[1:].tolist() == [0, 0, 0] and 0 <= int(out[0]) < 131072


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_renorm_mask_softmax_values(backend, dtype):
    torch.manual_seed(1)
    x = torch.randn(6, 1024, device=DEV).to(dtype)
    p = torch.softmax(x.float(), -1).to(dtype)
    p64 = p.double()
    k = torch.tensor([1, 10, 100, 1024, 0, 5000], dtype=torch.int32, device=DEV)
    q = target(p64, k.long().unsqueeze(-1))
    tol = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-3, rtol=1e-2)
    torch.testing.assert_close(run(backend, S.top_k_renorm_probs, p, k).double(), q, **tol)
    top_p = torch.tensor([0.0, 0.3, 0.6, 0.9, 1.0, 0.75], device=DEV)
    q = target(p64, None, top_p.double().unsqueeze(-1))
    torch.testing.assert_close(run(backend, S.top_p_renorm_probs, p, top_p).double(), q, **tol)
    larger = (x.double().unsqueeze(-2) > x.double().unsqueeze(-1)).sum(-1)
    kk = k.long().unsqueeze(-1)
    keep = (kk <= 0) | (kk >= 1024) | (larger < kk)
    masked = run(backend, S.top_k_mask_logits, x, k)
    assert masked.dtype == dtype
    assert torch.equal(masked, torch.where(keep, x, torch.tensor(-float("inf"), dtype=dtype, device=DEV)))
    t = torch.rand(6, device=DEV) + 0.3
    want = torch.softmax(x.double() / t.double().unsqueeze(-1), -1)
    torch.testing.assert_close(run(backend, S.softmax, x, t).double(), want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_chain_speculative_smoke(backend):
    torch.manual_seed(2)
    batch, n, vocab = 8, 4, 32768
    draft = torch.softmax(torch.randn(batch, n, vocab, device=DEV), -1)
    target_p = torch.softmax(torch.randn(batch, n + 1, vocab, device=DEV), -1)
    ids = draft.argmax(-1).int()
    a = run(backend, S.chain_speculative_sampling, draft, ids, target_p, seed=3, offset=0)
    b = run(backend, S.chain_speculative_sampling, draft, ids, target_p, seed=3, offset=0)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    out, accepted, emitted = a
    for r in range(batch):
        pos = int(emitted[r])
        assert torch.equal(out[r, :pos], ids[r, :pos]) and 0 <= int(out[r, pos]) < vocab
        assert bool((out[r, pos + 1:] == -1).all()) and int(accepted[r]) >= pos


INCREMENTS = {
    "plain": (lambda p, g: S.sampling_from_probs(p, generator=g), lambda b, v: b),
    "min_p": (lambda p, g: S.min_p_sampling_from_probs(p, 0.1, generator=g), lambda b, v: b),
    "top_p": (lambda p, g: S.top_p_sampling_from_probs(p, 0.5, generator=g), lambda b, v: b * 32),
    "top_k": (lambda p, g: S.top_k_sampling_from_probs(p, 5, generator=g), lambda b, v: b * 32),
    "logits": (lambda p, g: S.sampling_from_logits(p, generator=g), lambda b, v: b * v),
}


@pytest.mark.parametrize("name", list(INCREMENTS))
def test_cuda_generator_offset_advances_by_ceil4_increment(name):
    call, increment = INCREMENTS[name]
    p = torch.rand(3, 37, device=DEV)
    g = torch.Generator(device=DEV).manual_seed(5)
    before = int(g.get_state().view(torch.int64)[1])
    call(p, g)
    after = int(g.get_state().view(torch.int64)[1])
    assert after - before == (increment(3, 37) + 3) // 4 * 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_graph_capture_with_tensor_seeds(backend):
    if backend != "triton":
        pytest.skip(f"{backend} reads seeds on the host or seeds a host generator: not capturable")
    from conftest import capture_cuda_graph

    torch.manual_seed(4)
    p = torch.softmax(torch.randn(32, 32768, device=DEV), -1)
    seed = torch.tensor([7], device=DEV)
    offset = torch.tensor([0], device=DEV)
    out = {}

    def step():
        out["t"] = run(backend, S.top_k_top_p_sampling_from_probs, p, 40, 0.9, seed=seed,
                       offset=offset)

    graph = capture_cuda_graph(step)
    graph.replay()
    first = out["t"].clone()
    eager = S.top_k_top_p_sampling_from_probs(p, 40, 0.9, seed=seed, offset=offset, backend=backend)
    assert torch.equal(first, eager)
    offset.fill_(1024)
    graph.replay()
    assert not torch.equal(out["t"], first)
    assert bool(((out["t"] >= 0) & (out["t"] < 32768)).all())
