"""Helpers of the Triton sampling kernel tests that need triton at import, from
test_triton_sampling_two_pass.py: the kernels' own uniforms (``uniform_kernel``, a @triton.jit
kernel) and the draws a sampler must make at them (``expected_draws``). Import it after
``pytest.importorskip("triton")``.
"""

import torch
import triton
import triton.language as tl
from triton.language.random import philox, uint_to_uniform_float

from sampling_helpers import keep_set


@triton.jit
def uniform_kernel(out, seed, WORD2: tl.constexpr = 0xFFFF):
    """The uniform of program i (offset 0) at Philox counter ``(0, i, WORD2, 0)``: the two-pass
    and logits samplers' (0xFFFF), the one-pass chain kernel's (0x300)."""
    i = tl.program_id(0)
    zero = tl.zeros([], tl.uint32)
    r0, _r1, _r2, _r3 = philox(tl.zeros([], tl.int64) + seed, zero, i.to(tl.uint32),
                               zero + WORD2, zero, 7)
    tl.store(out + i, uint_to_uniform_float(r0))


def expected_draws(p, top_k, top_p, joint, block, seed, min_p=None):
    """float64 inverse CDF over the keep set in position-major order, at the kernel's uniforms."""
    rows, vocab = p.shape
    u = torch.empty(rows, dtype=torch.float32, device=p.device)
    uniform_kernel[(rows,)](u, seed)
    w = p.cpu().double() * keep_set(p, top_k=top_k, top_p=top_p, joint=joint, min_p=min_p).cpu()
    order = torch.tensor([t for j in range(block) for t in range(j, vocab, block)], device="cpu")
    cdf = w[:, order].cumsum(-1)
    target = u.cpu().double() * cdf[:, -1]
    pos = torch.searchsorted(cdf, target.unsqueeze(-1), right=True).squeeze(-1)
    return order[pos.clamp_max(vocab - 1)]
