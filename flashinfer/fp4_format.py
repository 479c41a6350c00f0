"""The FP4 (e2m1) formats: codes, packing, block-scale values and layouts, as torch ops.

Shared by the quantisers (:mod:`flashinfer.quantization.fp4`) and the ``mm_fp4`` kernels of
every backend (dequantisation). No argument checks here: callers validate.

e2m1 encoding
-------------
A 4-bit code ``s eem``: bit 3 the sign, bits 0-2 index the magnitudes
``{0, 0.5, 1, 1.5, 2, 3, 4, 6}``; so codes 0-7 are the non-negative values and 8-15 their
negatives (8 is -0). Encoding rounds to the nearest grid value, ties to the even code (the one
whose mantissa bit, bit 0, is 0), and saturates at +-6 (``cvt.rn.satfinite.e2m1``). Two codes are
packed per ``uint8``: element ``2j`` in the **low** nibble, element ``2j + 1`` in the high nibble
(``x_q [..., K/2]`` for ``x [..., K]``).

Block scales
------------
Each block of ``sf_vec_size`` consecutive elements along K has one scale:

* NVFP4 (``sf_vec_size=16``, float8_e4m3fn scales, as upstream's recipe): with the global scale
  ``g`` (typically ``448 * 6 / amax(x)``; 1 when ``global_scale`` is None)
  ``sf = e4m3(g * amax(block) / 6)`` and ``code = e2m1(x * g / sf)`` (0 when ``sf`` is 0), so
  ``x ~= e2m1 * sf / g``.
* MXFP4 (``sf_vec_size=32``, UE8M0 scales): ``sf`` is the smallest power of two ``>= amax / 6``,
  stored as its biased exponent ``e`` (``uint8``, value ``2**(e - 127)``); ``code = e2m1(x / sf)``.
  The global scale is not used (upstream's kernel ignores it for UE8M0 scales of 16-bit inputs).

Scale layouts (``SfLayout``), for ``M`` rows and ``C = K / sf_vec_size`` scale columns; the scale
of row ``r``, column ``c`` is stored at flat offset:

* ``layout_linear``: ``r * C + c``; returned as ``[M, C]``.
* ``layout_128x4`` (CUTLASS / TRT-LLM swizzled): rows padded to ``Mp = ceil(M/128)*128``, columns
  to ``Cp = ceil(C/4)*4`` (padding holds 0);
  ``(r // 128) * (128 * Cp) + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4)``;
  returned as ``[Mp, Cp]`` (upstream's ``reshape(-1, C)`` of the same bytes when C % 4 == 0).
* ``layout_8x4``: rows padded to ``ceil(M/8)*8``, columns to ``Cp``;
  ``(r // 8) * (8 * Cp) + (c // 4) * 32 + (r % 8) * 4 + (c % 4)``; returned as
  ``[ceil(M/8)*8, Cp]``.

Scale dtypes: e4m3 scales are returned as ``float8_e4m3fn`` and UE8M0 scales as ``uint8``
(upstream returns raw ``uint8`` bytes for both; ``.view(torch.uint8)`` /
``.view(torch.float8_e4m3fn)`` convert between the two spellings at no cost, and every function
here accepts either).
"""

from __future__ import annotations

import enum
from typing import Tuple

import torch

class SfLayout(enum.IntEnum):
    """Scale-factor layouts (upstream ``flashinfer.tllm_enums.SfLayout``)."""

    layout_128x4 = 0
    layout_8x4 = 1
    layout_linear = 2


_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# boundaries between magnitude codes i and i + 1; at a tie the even code wins, so the boundary
# belongs to the upper code when i + 1 is even (i odd) and to the lower one otherwise
_BOUNDS_TIE_DOWN = (0.25, 1.25, 2.5, 5.0)   # i = 0, 2, 4, 6
_BOUNDS_TIE_UP = (0.75, 1.75, 3.5)          # i = 1, 3, 5

# --------------------------------------------------------------------------------------------
# e2m1 codes


def float_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round ``x`` (any float dtype) to e2m1 codes (``uint8`` in 0..15, same shape): nearest,
    ties to even, saturating at +-6; NaN gives 0."""
    mag = x.float().abs()
    code = torch.zeros_like(mag, dtype=torch.uint8)
    for b in _BOUNDS_TIE_DOWN:
        code += (mag > b).to(torch.uint8)
    for b in _BOUNDS_TIE_UP:
        code += (mag >= b).to(torch.uint8)
    return code | (torch.signbit(x).to(torch.uint8) << 3)


def e2m1_to_float(code: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """e2m1 codes (integer tensor, 0..15) -> their values in ``dtype``."""
    table = torch.tensor(_E2M1_VALUES + tuple(-v for v in _E2M1_VALUES), dtype=dtype,
                         device=code.device)
    return table[code.long() & 0xF]


def pack_e2m1(code: torch.Tensor) -> torch.Tensor:
    pairs = code.reshape(*code.shape[:-1], code.shape[-1] // 2, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """``uint8 [..., K/2]`` -> codes ``[..., K]`` (low nibble first)."""
    p = packed.view(torch.uint8) if packed.dtype != torch.uint8 else packed
    return torch.stack((p & 0xF, p >> 4), dim=-1).reshape(*p.shape[:-1], 2 * p.shape[-1])


# --------------------------------------------------------------------------------------------
# scale layouts


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def sf_storage_shape(rows: int, cols: int, layout: SfLayout) -> Tuple[int, int]:
    """The ``[rows, cols]`` storage a scale layout needs for ``rows x cols`` scales (padded)."""
    if layout == SfLayout.layout_linear:
        return rows, cols
    return round_up(rows, 128 if layout == SfLayout.layout_128x4 else 8), round_up(cols, 4)


def sf_offsets(rows: int, cols: int, layout: SfLayout, device=None) -> torch.Tensor:
    """``int64 [rows, cols]``: the flat storage offset of each scale (formulas in the module
    docstring)."""
    r = torch.arange(rows, device=device).unsqueeze(1)
    c = torch.arange(cols, device=device).unsqueeze(0)
    if layout == SfLayout.layout_linear:
        return r * cols + c
    cp = round_up(cols, 4)
    if layout == SfLayout.layout_128x4:
        return ((r // 128) * (128 * cp) + (c // 4) * 512 + (r % 32) * 16
                + ((r % 128) // 32) * 4 + (c % 4))
    return (r // 8) * (8 * cp) + (c // 4) * 32 + (r % 8) * 4 + (c % 4)


def to_layout(sf: torch.Tensor, layout: SfLayout) -> torch.Tensor:
    """Linear ``[M, C]`` scales -> the storage tensor of ``layout`` (padding zero)."""
    rows, cols = sf.shape
    if layout == SfLayout.layout_linear:
        return sf.contiguous()
    shape = sf_storage_shape(rows, cols, layout)
    flat = torch.zeros(shape[0] * shape[1], dtype=torch.uint8, device=sf.device)
    flat[sf_offsets(rows, cols, layout, sf.device).reshape(-1)] = sf.view(torch.uint8).reshape(-1)
    return flat.view(sf.dtype).reshape(shape)


def from_layout(storage: torch.Tensor, rows: int, cols: int, layout: SfLayout) -> torch.Tensor:
    """Any-shape storage of ``layout`` -> linear ``[rows, cols]`` scales (same dtype)."""
    flat = storage.reshape(-1)
    raw = flat.view(torch.uint8) if flat.element_size() == 1 else flat
    return raw[sf_offsets(rows, cols, layout, storage.device)].view(storage.dtype)



# --------------------------------------------------------------------------------------------
# scale values


def ue8m0_to_float(e: torch.Tensor) -> torch.Tensor:
    """UE8M0 biased exponents (``uint8``) -> ``2**(e - 127)`` in float32; 255 is NaN (OCP MX)."""
    code = e.view(torch.uint8)
    return torch.exp2(code.float() - 127.0).masked_fill(code == 255, float("nan"))


def scale_to_float(sf: torch.Tensor, ue8m0: bool) -> torch.Tensor:
    """Block scales stored as e4m3 (``float8_e4m3fn`` or its ``uint8`` bytes) or UE8M0 ->
    float32."""
    if ue8m0:
        return ue8m0_to_float(sf)
    return sf.view(torch.float8_e4m3fn).float()


def float_to_ue8m0(v: torch.Tensor) -> torch.Tensor:
    """Smallest power of two >= v (v >= 0, float32) as a biased exponent, clamped to 0..254
    (inf saturates to 254); NaN gives 255, UE8M0's NaN."""
    mant, exp = torch.frexp(v)
    exp = exp - (mant == 0.5).to(exp.dtype)  # an exact power of two keeps its exponent
    exp = torch.where(v > 0, exp, torch.full_like(exp, -127))
    exp = torch.where(torch.isinf(v), torch.full_like(exp, 127), exp)
    code = (exp + 127).clamp(0, 254).to(torch.uint8)
    return code.masked_fill(torch.isnan(v), 255)


def dequantize(x_q: torch.Tensor, sf_linear: torch.Tensor, sf_vec_size: int, ue8m0: bool,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Packed codes ``[R, K/2]`` and linear scales ``[R, K/sf_vec_size]`` -> ``[R, K]`` in
    ``dtype`` (no validation: the GEMM kernels call this)."""
    values = e2m1_to_float(unpack_e2m1(x_q), dtype)
    scales = scale_to_float(sf_linear, ue8m0).to(dtype)
    return values * scales.repeat_interleave(sf_vec_size, dim=1)


def gemm_operands(a: torch.Tensor, b: torch.Tensor, a_sf: torch.Tensor, b_sf: torch.Tensor,
                  block_size: int, a_sf_8x4: bool, dtype: torch.dtype
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The ``mm_fp4`` kernels' common first step (no validation): packed ``a [M, K/2]`` and
    ``b [K/2, N]`` with their swizzled scale storages (``a_sf`` 128x4, or 8x4 when
    ``a_sf_8x4``; ``b_sf`` 128x4 of the ``[N, K/block_size]`` scale matrix) -> dequantised
    ``a [M, K]`` and ``b.T [N, K]`` in ``dtype``. ``block_size`` 32 means UE8M0 scales."""
    m, n, k = a.shape[0], b.shape[1], 2 * a.shape[1]
    cols, ue8m0 = k // block_size, block_size == 32
    a_layout = SfLayout.layout_8x4 if a_sf_8x4 else SfLayout.layout_128x4
    a_deq = dequantize(a, from_layout(a_sf, m, cols, a_layout), block_size, ue8m0, dtype)
    b_deq = dequantize(b.t(), from_layout(b_sf, n, cols, SfLayout.layout_128x4), block_size,
                       ue8m0, dtype)
    return a_deq, b_deq
