"""@triton.jit kernels of the streaming softmax (variant ``streaming`` of op softmax).

``out = softmax(x / T)`` in fp32, computed as ``exp((x - max) / T) / sum``: the maximum is the
logits' own (``T > 0``), and ``1 / T`` multiplies differences ``<= 0``, so a tiny temperature
cannot overflow (``1 / T`` is clamped to FLT_MAX: the result tends to the arg-max). Two ways:

* **One program per row** (many rows): pass 1 keeps per lane a running maximum and the sum of
  ``exp((x - max) / T)`` (one exponential per element: ``exp((min - max) / T)`` of the old
  maximum and the new value serves both cases), pass 2 writes. Both passes load the next block
  before working on the current one.
* **Split rows** (few rows, which leave most SMs idle with one program per row): a grid of
  ``rows x chunks``; the first launch writes each chunk's ``(max, sum)``, the second combines a
  row's chunk pairs and writes its chunk.

Semantics as the general kernel (``_sampling_kernels.softmax_kernel``): a NaN in a row makes the
row NaN; a row of only ``-inf`` gives NaN; a per-row temperature that is not a finite number > 0
(tested where it is loaded) gives a row of zeros.
"""

import triton
import triton.language as tl


@triton.jit
def _online(mx, s, x):
    """Lane-wise running maximum ``mx`` and sum ``s`` of ``exp(v - mx)`` after adding ``x``."""
    hi = tl.maximum(mx, x)
    e = tl.exp(tl.minimum(mx, x) - hi)
    e = tl.where(hi == float("-inf"), 0.0, e)  # both -inf: nothing to add
    s = tl.where(x > mx, s * e + 1.0, s + e)
    return hi, tl.where(x != x, float("nan"), s)


@triton.jit
def _online_scaled(mx, s, x, inv_t):
    """:func:`_online` for ``exp((v - mx) * inv_t)``: ``mx`` the running maximum of ``x``
    itself."""
    hi = tl.maximum(mx, x)
    e = tl.exp((tl.minimum(mx, x) - hi) * inv_t)
    e = tl.where(hi == float("-inf"), 0.0, e)  # both -inf: nothing to add
    s = tl.where(x > mx, s * e + 1.0, s + e)
    return hi, tl.where(x != x, float("nan"), s)


@triton.jit
def _stats(row_ptr, inv_t, start, stop, BLOCK: tl.constexpr):
    """``(max of x, sum of exp((x - max) / T))`` over ``x[start:stop]``."""
    lane = tl.arange(0, BLOCK)
    mx = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    nxt = tl.load(row_ptr + start + lane, mask=start + lane < stop, other=float("-inf"))
    for off in range(start, stop, BLOCK):
        x = nxt.to(tl.float32)
        nxt = tl.load(row_ptr + off + BLOCK + lane, mask=off + BLOCK + lane < stop,
                      other=float("-inf"))
        mx, s = _online_scaled(mx, s, x, inv_t)
    top = tl.max(mx, axis=0)
    return top, tl.sum(s * tl.exp((mx - top) * inv_t), axis=0)


@triton.jit
def _write(row_ptr, out_ptr, inv_t, top, inv_total, ok, start, stop, BLOCK: tl.constexpr):
    """``out[j] = exp((x[j] - top) / T) * inv_total`` for ``j`` in ``[start, stop)``; zeros
    unless ``ok`` (a bad temperature)."""
    lane = tl.arange(0, BLOCK)
    nxt = tl.load(row_ptr + start + lane, mask=start + lane < stop, other=float("-inf"))
    for off in range(start, stop, BLOCK):
        x = nxt.to(tl.float32)
        nxt = tl.load(row_ptr + off + BLOCK + lane, mask=off + BLOCK + lane < stop,
                      other=float("-inf"))
        y = tl.where(ok, tl.exp((x - top) * inv_t) * inv_total, 0.0)
        tl.store(out_ptr + off + lane, y, mask=off + lane < stop)


@triton.jit
def inv_temperature(t_ptr, t_val, row, T_T: tl.constexpr):
    """``(1 / T clamped to FLT_MAX, ok)`` of row ``row``'s temperature (per row with T_T, else
    the scalar ``t_val``, checked on the host): ``ok`` iff T is a finite number > 0; a bad row
    gets ``1 / T = 1`` (its output is zeroed by the caller). The clamp keeps a tiny T finite:
    ``(x - max) * FLT_MAX`` is 0 at the maximum and ``-inf`` or very negative elsewhere."""
    if T_T:
        t = tl.load(t_ptr + row).to(tl.float32)
        ok = (t > 0.0) & (t < float("inf"))
        return tl.minimum(1.0 / tl.where(ok, t, 1.0), 3.4028234663852886e38), ok
    t = tl.zeros([], tl.float32) + t_val
    return tl.minimum(1.0 / t, 3.4028234663852886e38), t == t



@triton.jit
def softmax_rows_kernel(src, dst, t_ptr, t_val, V, stride_src, stride_dst, T_T: tl.constexpr,
                        BLOCK: tl.constexpr):
    """One program per row of ``src [R, V]`` (fp32/fp16/bf16) -> ``dst [R, V]`` fp32."""
    row = tl.program_id(0).to(tl.int64)
    inv_t, t_ok = inv_temperature(t_ptr, t_val, row, T_T)
    row_ptr = src + row * stride_src
    top, total = _stats(row_ptr, inv_t, 0, V, BLOCK)
    _write(row_ptr, dst + row * stride_dst, inv_t, top, 1.0 / total, t_ok, 0, V, BLOCK)


@triton.jit
def softmax_chunk_stats_kernel(src, part, t_ptr, t_val, V, stride_src, CHUNK, N_CHUNKS,
                               T_T: tl.constexpr, BLOCK: tl.constexpr):
    """Program ``(row, c)``: ``part[row, c] = (max, sum)`` of chunk ``c`` (``CHUNK`` elements,
    a multiple of BLOCK) of the row; ``part`` fp32 ``[R, N_CHUNKS, 2]``."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    inv_t, _t_ok = inv_temperature(t_ptr, t_val, row, T_T)
    start = c * CHUNK
    top, total = _stats(src + row * stride_src, inv_t, start, tl.minimum(start + CHUNK, V),
                        BLOCK)
    slot = part + (row * N_CHUNKS + c) * 2
    tl.store(slot, top)
    tl.store(slot + 1, total)


@triton.jit
def softmax_chunk_write_kernel(src, dst, part, t_ptr, t_val, V, stride_src, stride_dst, CHUNK,
                               N_CHUNKS, T_T: tl.constexpr, S: tl.constexpr,
                               BLOCK: tl.constexpr):
    """Program ``(row, c)``: the row's maximum and sum from its ``N_CHUNKS <= S`` chunk pairs,
    then chunk ``c`` written."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    inv_t, t_ok = inv_temperature(t_ptr, t_val, row, T_T)
    j = tl.arange(0, S)
    slots = part + (row * N_CHUNKS + j) * 2
    tops = tl.load(slots, mask=j < N_CHUNKS, other=float("-inf"))
    sums = tl.load(slots + 1, mask=j < N_CHUNKS, other=0.0)
    top = tl.max(tops, axis=0)
    total = tl.sum(tl.where(j < N_CHUNKS, sums * tl.exp((tops - top) * inv_t), 0.0), axis=0)
    start = c * CHUNK
    _write(src + row * stride_src, dst + row * stride_dst, inv_t, top, 1.0 / total, t_ok, start,
           tl.minimum(start + CHUNK, V), BLOCK)
