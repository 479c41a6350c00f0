"""@triton.jit RoPE kernel (imported only when a Triton RoPE kernel runs).

Grid ``(nnz, q_head_blocks + k_head_blocks)``: program ``(t, b)`` computes token ``t``'s
``cos/sin [HALF_BLOCK]`` once (from the frequency formula, or gathered from the cos/sin cache),
then rotates one ``[BLOCK_H, rotary_dim/2]`` tile of pairs of q (``b < q_head_blocks``) or k, in
float32, and stores it in the output's dtype. Out-of-place launches also copy the pass-through
dims ``[rotary_dim, head_dim)``. Every tensor is addressed through its strides.

Cache variants guard the gather: a position outside ``[0, max_pos)`` reads no cache row, the
token's pairs are stored unrotated (the input values, bit for bit) and, when ``FAULT_CODE >
0``, the first head block of the token reports it into the error record (``report_fault``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._fault_kernels import report_fault


@triton.jit
def _rotate_tile(x_ptr, o_ptr, tok, h0, num_heads, head_dim, half,
                 sx_n, sx_h, sx_d, so_n, so_h, so_d, cos, sin, d, d_mask, rot,
                 INTERLEAVE: tl.constexpr, COPY_PASS: tl.constexpr, BLOCK_H: tl.constexpr,
                 PASS_BLOCK: tl.constexpr):
    h = h0 + tl.arange(0, BLOCK_H)
    h_mask = h < num_heads
    mask = h_mask[:, None] & d_mask[None, :]
    x_row = x_ptr + tok * sx_n + h[:, None].to(tl.int64) * sx_h
    o_row = o_ptr + tok * so_n + h[:, None].to(tl.int64) * so_h
    if INTERLEAVE:
        c1 = 2 * d
        c2 = 2 * d + 1
    else:
        c1 = d
        c2 = d + half
    x1 = tl.load(x_row + c1[None, :] * sx_d, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + c2[None, :] * sx_d, mask=mask, other=0.0).to(tl.float32)
    # rot: the pairs to rotate (all of them, or none for a token whose cache position is bad:
    # its values are stored back unchanged)
    o1 = tl.where(rot[None, :], x1 * cos[None, :] - x2 * sin[None, :], x1)
    o2 = tl.where(rot[None, :], x2 * cos[None, :] + x1 * sin[None, :], x2)
    tl.store(o_row + c1[None, :] * so_d, o1.to(o_ptr.dtype.element_ty), mask=mask)
    tl.store(o_row + c2[None, :] * so_d, o2.to(o_ptr.dtype.element_ty), mask=mask)
    if COPY_PASS:
        p = 2 * half + tl.arange(0, PASS_BLOCK)
        p_mask = h_mask[:, None] & (p < head_dim)[None, :]
        v = tl.load(x_row + p[None, :] * sx_d, mask=p_mask)
        tl.store(o_row + p[None, :] * so_d, v, mask=p_mask)


@triton.jit(do_not_specialize=["fault_code"])
def rope_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, cache_ptr, rec_ptr, fault_code,
                num_q_heads, num_k_heads, head_dim, half,
                sq_n, sq_h, sq_d, sk_n, sk_h, sk_d,
                sqo_n, sqo_h, sqo_d, sko_n, sko_h, sko_d,
                sc_n, sc_d, max_pos,
                rotary_dim_f, log2_theta, inv_scale, smooth_a, smooth_b,
                INTERLEAVE: tl.constexpr, USE_CACHE: tl.constexpr, LLAMA31: tl.constexpr,
                COPY_PASS: tl.constexpr, BLOCK_H: tl.constexpr, HALF_BLOCK: tl.constexpr,
                PASS_BLOCK: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    d = tl.arange(0, HALF_BLOCK)
    d_mask = d < half
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    rot = d_mask
    if USE_CACHE:
        ok = (pos >= 0) & (pos < max_pos)
        if (fault_code > 0) & (block == 0) & (ok == 0):
            report_fault(rec_ptr, fault_code, tok, pos, max_pos)
        # the scalar flag enters the vector mask through its bound (Triton's interpreter cannot
        # AND a vector mask with a scalar bool)
        rot = d < tl.where(ok, half, 0)
        row = cache_ptr + tl.where(ok, pos, 0) * sc_n
        cos = tl.load(row + d * sc_d, mask=rot, other=1.0)
        sin = tl.load(row + (d + half) * sc_d, mask=rot, other=0.0)
    else:
        exponent = tl.math.div_rn((2 * d).to(tl.float32), rotary_dim_f)  # IEEE, as torch divides
        freq = tl.exp2(-exponent * log2_theta)
        if LLAMA31:
            smooth = tl.minimum(tl.maximum(freq * smooth_a + smooth_b, 0.0), 1.0)
            freq = (1.0 - smooth) * (freq * inv_scale) + smooth * freq
        else:
            freq = freq * inv_scale
        angle = pos.to(tl.float32) * freq
        cos = tl.cos(angle)
        sin = tl.sin(angle)
    q_blocks = tl.cdiv(num_q_heads, BLOCK_H)
    if block < q_blocks:
        _rotate_tile(q_ptr, qo_ptr, tok, block * BLOCK_H, num_q_heads, head_dim, half,
                     sq_n, sq_h, sq_d, sqo_n, sqo_h, sqo_d, cos, sin, d, d_mask, rot,
                     INTERLEAVE, COPY_PASS, BLOCK_H, PASS_BLOCK)
    else:
        _rotate_tile(k_ptr, ko_ptr, tok, (block - q_blocks) * BLOCK_H, num_k_heads, head_dim,
                     half, sk_n, sk_h, sk_d, sko_n, sko_h, sko_d, cos, sin, d, d_mask, rot,
                     INTERLEAVE, COPY_PASS, BLOCK_H, PASS_BLOCK)
