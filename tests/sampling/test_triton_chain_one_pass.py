"""Chain speculative sampling by one inverse-CDF draw (the Triton backend's kernel,
``_chain_draw_kernels.py``): the accept decisions equal to host accept tests at the kernel's
Philox uniforms, the replacement token equal to a float64 inverse CDF of the residual (or the
target) in position-major order at the kernel's own uniform, the edge cases (all accepted, a
draft id outside the vocabulary, a one-token residual), determinism; ``gpu``: the joint law of
(position, token) and the accepted count by chi-square."""

import math

import pytest
import torch

triton = pytest.importorskip("triton")

from flashinfer import sampling as S  # noqa: E402
from sampling_helpers import (assert_samples_follow, chain_expectation, run_spec,  # noqa: E402
                              spec_inputs)
from triton_draws import uniform_kernel  # noqa: E402

import triton.language as tl  # noqa: E402
from triton.language.random import philox, uint_to_uniform_float  # noqa: E402

pytestmark = pytest.mark.usefixtures("kernel_device")


def _expected_tokens(draft, target, pos, block, seed):
    """float64 inverse CDF of relu(t - d) at each request's position (the target when that is
    all zero or every draft was accepted), in position-major order for ``block``."""
    batch, n, vocab = draft.shape
    u = torch.empty(batch, dtype=torch.float32, device=draft.device)
    uniform_kernel[(batch,)](u, seed, WORD2=0x300)
    order = torch.tensor([t for j in range(block) for t in range(j, vocab, block)], device="cpu")
    tokens = []
    for b in range(batch):
        p = int(pos[b])
        t = target[b, p].double().cpu()
        w = (t - draft[b, p].double().cpu()).clamp_min(0) if p < n else t
        if not bool((w > 0).any()):
            w = t.clamp_min(0)
        cdf = w[order].cumsum(0)
        k = int(torch.searchsorted(cdf, float(u[b]) * cdf[-1], right=True))
        tokens.append(int(order[min(k, vocab - 1)]))
    return tokens


@triton.jit
def _accept_uniforms_kernel(out, seed, N: tl.constexpr, NPAD: tl.constexpr):
    """Request i's accept-test uniforms (offset 0): Philox counter ``(j, i, 0x100, 0)``."""
    i = tl.program_id(0)
    jj = tl.arange(0, NPAD)
    j = jj.to(tl.uint32)
    r0, _r1, _r2, _r3 = philox(tl.zeros([], tl.int64) + seed, j, j * 0 + i.to(tl.uint32),
                               j * 0 + 0x100, j * 0, 7)
    tl.store(out + i * N + jj, uint_to_uniform_float(r0), mask=jj < N)


def _host_accept_tests(draft, ids, target, seed):
    """Per request: the accepted count and the first rejected position, from the kernel's
    uniforms and float32 ``u * q < t`` on the host (an id outside the vocabulary: rejected)."""
    batch, n, vocab = draft.shape
    u = torch.empty(batch, n, dtype=torch.float32, device=draft.device)
    _accept_uniforms_kernel[(batch,)](u, seed, N=n, NPAD=triton.next_power_of_2(n))
    u = u.cpu()
    counts, firsts = [], []
    for b in range(batch):
        ok = [0 <= int(ids[b, j]) < vocab and
              bool(u[b, j] * draft[b, j, int(ids[b, j])].cpu() < target[b, j, int(ids[b, j])].cpu())
              for j in range(n)]
        counts.append(sum(ok))
        firsts.append(next((j for j in range(n) if not ok[j]), n))
    return counts, firsts


@pytest.mark.parametrize("vocab", [16, 300])
def test_accept_decisions_and_the_token_is_the_inverse_cdf(vocab):
    draft, ids, target = spec_inputs(6, 3, vocab, seed=31)
    target[:3, :3] = draft[:3]  # requests 0-2 accept more often
    ids[:3] = draft[:3].argmax(-1).int()
    out, acc, emit = run_spec(draft, ids, target, seed=4)
    counts, firsts = _host_accept_tests(draft, ids, target, seed=4)
    assert acc.tolist() == counts and emit.tolist() == firsts
    for b in range(6):
        p = int(emit[b])
        assert torch.equal(out[b, :p], ids[b, :p].to(out.device)) and (out[b, p + 1:] == -1).all()
    block = 4 * min(512, max(16, 1 << (-(-vocab // 4) - 1).bit_length()))  # the adapter's BLOCK
    expected = _expected_tokens(draft, target, emit, block, seed=4)
    assert [int(out[b, int(emit[b])]) for b in range(6)] == expected


def test_all_accepted_and_out_of_vocabulary_ids():
    draft, ids, target = spec_inputs(3, 3, 16, seed=32)
    target[:, :3] = draft
    ids[1, 0] = 99  # rejected at 0; later tests still count
    target[2, 0] = 0.0
    target[2, 0, 5] = 1.0
    draft[2, 0] = 0.0
    draft[2, 0, 6] = 1.0
    ids[2, 0] = 6  # residual relu(t - d) at position 0 is token 5 alone
    out, acc, emit = run_spec(draft, ids, target, acc0=5, emit0=1)
    assert torch.equal(out[0, :3], ids[0]) and 0 <= int(out[0, 3]) < 16
    assert out[1, 1:].tolist() == [-1, -1, -1] and 0 <= int(out[1, 0]) < 16
    assert out[2].tolist() == [5, -1, -1, -1]
    assert emit.tolist() == [4, 1, 1]
    again = run_spec(draft, ids, target, acc0=5, emit0=1)
    assert all(torch.equal(x, y) for x, y in zip(again, (out, acc, emit)))


def test_public_call_with_the_variant():
    draft, ids, target = spec_inputs(4, 2, 64, seed=33)
    a = S.chain_speculative_sampling(draft, ids, target, seed=3, offset=0,
                                     backend="triton")
    b = S.chain_speculative_sampling(draft, ids, target, seed=3, offset=0,
                                     backend="triton")
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.gpu
def test_gpu_joint_law_of_position_and_token():
    n, vocab, batch = 3, 12, 20000
    with torch.device("cpu"):  # the float64 expectation and the chi-square on the host
        g = torch.Generator().manual_seed(21)
        draft = torch.softmax(torch.randn(n, vocab, generator=g, dtype=torch.float64), -1)
        target_p = torch.softmax(torch.randn(n + 1, vocab, generator=g, dtype=torch.float64), -1)
        ids = torch.stack([draft[i].argmax() for i in range(n)])
        p_pos, laws, a = chain_expectation(draft, ids, target_p)
    out, accepted, emitted = S.chain_speculative_sampling(
        draft.float().expand(batch, n, vocab).contiguous().cuda(),
        ids.int().expand(batch, n).contiguous().cuda(),
        target_p.float().expand(batch, n + 1, vocab).contiguous().cuda(), seed=17, offset=0,
        backend="triton")
    with torch.device("cpu"):
        pos = emitted.long().cpu()
        token = out.cpu().gather(1, pos.unsqueeze(1)).squeeze(1)
        joint = (p_pos.unsqueeze(-1) * laws).reshape(1, -1)
        assert_samples_follow(pos * vocab + token.long(), torch.zeros(batch, dtype=torch.long),
                              joint)
        mean, var = float(a.sum()), float((a * (1 - a)).sum())
        assert abs(accepted.double().cpu().mean().item() - mean) < 5.5 * math.sqrt(var / batch)
