"""FP4 (e2m1) quantisation: NVFP4 and MXFP4 (upstream ``flashinfer.quantization`` FP4 part).

Pure torch ops on any device; these are the reference implementations (upstream's CUDA kernels
need SM 10.x / 12.x). ``backend`` and ``enable_pdl`` arguments are accepted for compatibility and
ignored: upstream uses them only to pick its CUDA implementation.

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

Non-finite values: a block holding NaN gets a NaN scale (e4m3 NaN, or UE8M0 255, which every
dequantiser here reads as NaN), so it dequantises to NaN (NaN in, NaN out); a block holding
inf saturates (scale 448 for e4m3, 254 for UE8M0; the inf element becomes the largest code,
the block's finite elements may flush to 0). The global scale must be finite and > 0: a float
or CPU tensor that is not raises ``ValueError`` naming it; a GPU tensor is not read back: a
bad value there makes every NVFP4 block scale of the quantisers NaN, and the dequantiser
divides by it (IEEE). Every quantiser writes fresh tensors (no ``out=`` arguments, so no
aliasing to check).

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
from typing import Optional, Tuple

import torch

__all__ = [
    "SfLayout", "fp4_quantize", "nvfp4_quantize", "mxfp4_quantize", "mxfp4_dequantize",
    "mxfp4_dequantize_host", "block_scale_interleave", "nvfp4_block_scale_interleave",
    "e2m1_and_ufp8sf_scale_to_float", "e2m1_to_float", "float_to_e2m1", "sf_offsets",
    "sf_storage_shape",
]


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
_SOURCES = (torch.float16, torch.bfloat16, torch.float32)
_SCALE_DTYPES = (torch.float8_e4m3fn, torch.uint8)
_UPSTREAM_BACKENDS = ("cuda", "cute-dsl", "auto", "torch", "reference")


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


def _pack(code: torch.Tensor) -> torch.Tensor:
    pairs = code.reshape(*code.shape[:-1], code.shape[-1] // 2, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def _unpack(packed: torch.Tensor) -> torch.Tensor:
    """``uint8 [..., K/2]`` -> codes ``[..., K]`` (low nibble first)."""
    p = packed.view(torch.uint8) if packed.dtype != torch.uint8 else packed
    return torch.stack((p & 0xF, p >> 4), dim=-1).reshape(*p.shape[:-1], 2 * p.shape[-1])


# --------------------------------------------------------------------------------------------
# scale layouts


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def sf_storage_shape(rows: int, cols: int, layout: SfLayout) -> Tuple[int, int]:
    """The ``[rows, cols]`` storage a scale layout needs for ``rows x cols`` scales (padded)."""
    if layout == SfLayout.layout_linear:
        return rows, cols
    return _round_up(rows, 128 if layout == SfLayout.layout_128x4 else 8), _round_up(cols, 4)


def sf_offsets(rows: int, cols: int, layout: SfLayout, device=None) -> torch.Tensor:
    """``int64 [rows, cols]``: the flat storage offset of each scale (formulas in the module
    docstring)."""
    r = torch.arange(rows, device=device).unsqueeze(1)
    c = torch.arange(cols, device=device).unsqueeze(0)
    if layout == SfLayout.layout_linear:
        return r * cols + c
    cp = _round_up(cols, 4)
    if layout == SfLayout.layout_128x4:
        return ((r // 128) * (128 * cp) + (c // 4) * 512 + (r % 32) * 16
                + ((r % 128) // 32) * 4 + (c % 4))
    return (r // 8) * (8 * cp) + (c // 4) * 32 + (r % 8) * 4 + (c % 4)


def _to_layout(sf: torch.Tensor, layout: SfLayout) -> torch.Tensor:
    """Linear ``[M, C]`` scales -> the storage tensor of ``layout`` (padding zero)."""
    rows, cols = sf.shape
    if layout == SfLayout.layout_linear:
        return sf.contiguous()
    shape = sf_storage_shape(rows, cols, layout)
    flat = torch.zeros(shape[0] * shape[1], dtype=torch.uint8, device=sf.device)
    flat[sf_offsets(rows, cols, layout, sf.device).reshape(-1)] = sf.view(torch.uint8).reshape(-1)
    return flat.view(sf.dtype).reshape(shape)


def _from_layout(storage: torch.Tensor, rows: int, cols: int, layout: SfLayout) -> torch.Tensor:
    """Any-shape storage of ``layout`` -> linear ``[rows, cols]`` scales (same dtype)."""
    flat = storage.reshape(-1)
    raw = flat.view(torch.uint8) if flat.element_size() == 1 else flat
    return raw[sf_offsets(rows, cols, layout, storage.device)].view(storage.dtype)


def _layout_of(swizzled: bool, eight_by_four: bool) -> SfLayout:
    if not swizzled:
        return SfLayout.layout_linear
    return SfLayout.layout_8x4 if eight_by_four else SfLayout.layout_128x4


def _check_layout(name: str, value) -> SfLayout:
    try:
        return SfLayout(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an SfLayout; allowed: "
                         f"{', '.join(m.name for m in SfLayout)}") from None


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


def _float_to_ue8m0(v: torch.Tensor) -> torch.Tensor:
    """Smallest power of two >= v (v >= 0, float32) as a biased exponent, clamped to 0..254
    (inf saturates to 254); NaN gives 255, UE8M0's NaN."""
    mant, exp = torch.frexp(v)
    exp = exp - (mant == 0.5).to(exp.dtype)  # an exact power of two keeps its exponent
    exp = torch.where(v > 0, exp, torch.full_like(exp, -127))
    exp = torch.where(torch.isinf(v), torch.full_like(exp, 127), exp)
    code = (exp + 127).clamp(0, 254).to(torch.uint8)
    return code.masked_fill(torch.isnan(v), 255)


# --------------------------------------------------------------------------------------------
# quantisers


def _check_input(name: str, x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _SOURCES:
        raise ValueError(f"{name} has unsupported dtype {x.dtype}; allowed: float16, bfloat16, "
                         "float32")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D [M, K], got shape {tuple(x.shape)}")
    return x


def _check_backend(backend) -> None:
    if backend not in _UPSTREAM_BACKENDS:
        raise ValueError(f"backend={backend!r} is not supported; allowed: "
                         f"{', '.join(_UPSTREAM_BACKENDS)} (all run this torch implementation)")


def _global_scale(global_scale, inversed: bool, device, name: str = "global_scale"
                  ) -> torch.Tensor:
    """The global scale as an fp32 0-d tensor on ``device``. A value on the host (a float, a
    CPU tensor) must be finite and > 0 (after the inversion): ``ValueError`` naming ``name``;
    a GPU tensor is not read back (see the module docstring for what a bad one gives)."""
    if global_scale is None:
        return torch.ones((), dtype=torch.float32, device=device)
    if isinstance(global_scale, (int, float)) and not isinstance(global_scale, bool):
        g = torch.tensor(float(global_scale), dtype=torch.float32)
    elif isinstance(global_scale, torch.Tensor) and global_scale.numel() == 1:
        g = global_scale.to(dtype=torch.float32).reshape(())
    else:
        shape = tuple(global_scale.shape) if isinstance(global_scale, torch.Tensor) else ""
        raise ValueError(f"{name} must be None, a float or a one-element tensor, got "
                         f"{type(global_scale).__name__}{shape}")
    given = g
    if inversed:
        g = 1.0 / g
    if g.device.type == "cpu":
        value = float(g)
        if not 0.0 < value < float("inf"):
            used = f" (its inverse, {value!r}, is the scale used)" if inversed else ""
            raise ValueError(f"{name}={float(given)!r} is not allowed{used}: a global scale must "
                             "be finite and > 0 in float32")
    return g.to(device)


def fp4_quantize(input: torch.Tensor, global_scale: Optional[torch.Tensor] = None,
                 sf_vec_size: int = 16, sf_use_ue8m0: bool = False,
                 is_sf_swizzled_layout: bool = True, is_sf_8x4_layout: bool = False,
                 is_global_scale_inversed: bool = False, enable_pdl: Optional[bool] = None,
                 backend: str = "cuda") -> Tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``input [M, K]`` (fp16 / bf16 / fp32) to packed e2m1 with block scales.

    Returns ``(x_q uint8 [M, K/2], sf)``: ``sf`` float8_e4m3fn (``sf_use_ue8m0=False``) or uint8
    UE8M0 exponents (``True``), in the linear (``is_sf_swizzled_layout=False``), 128x4 or 8x4
    (``is_sf_8x4_layout=True``) layout; shapes, formulas and the recipe in the module
    docstring. ``sf_vec_size`` 16 (NVFP4) or 32 (MXFP4); K must be a multiple of it.
    ``global_scale``: None (1), a float or a one-element tensor, used by e4m3 scales only; with
    ``is_global_scale_inversed=True`` its reciprocal is used.
    """
    _check_input("input", input)
    if sf_vec_size not in (16, 32):
        raise ValueError(f"sf_vec_size must be 16 or 32, got {sf_vec_size!r}")
    m, k = input.shape
    if k % sf_vec_size:
        raise ValueError(f"input.shape[-1] = {k} must be a multiple of sf_vec_size = "
                         f"{sf_vec_size}")
    _check_backend(backend)
    layout = _layout_of(is_sf_swizzled_layout, is_sf_8x4_layout)
    blocks = input.float().reshape(m, k // sf_vec_size, sf_vec_size)
    amax = blocks.abs().amax(-1)
    if sf_use_ue8m0:
        sf = _float_to_ue8m0(amax / 6.0)
        inv = torch.where(amax > 0, torch.exp2(127.0 - sf.float()), torch.zeros_like(amax))
    else:
        g = _global_scale(global_scale, is_global_scale_inversed, input.device)
        # a bad global scale on a GPU (not read back): every block scale becomes NaN
        g_bad = ~((g > 0) & (g < float("inf")))
        sf = (g * amax / 6.0).clamp(max=448.0).masked_fill(g_bad, float("nan"))
        sf = sf.to(torch.float8_e4m3fn)
        sf_f = sf.float()
        inv = torch.where(sf_f > 0, g / sf_f, torch.zeros_like(sf_f))
    codes = float_to_e2m1(blocks * inv.unsqueeze(-1)).reshape(m, k)
    return _pack(codes), _to_layout(sf, layout)


def nvfp4_quantize(a: torch.Tensor, a_global_sf: torch.Tensor,
                   sfLayout: SfLayout = SfLayout.layout_128x4, do_shuffle: bool = False,
                   sf_vec_size: int = 16, enable_pdl: Optional[bool] = None,
                   backend: str = "cuda", per_token_activation: bool = False,
                   expanded_idx_to_permuted_idx: Optional[torch.Tensor] = None
                   ) -> Tuple[torch.Tensor, torch.Tensor]:
    """NVFP4: :func:`fp4_quantize` with e4m3 scales in ``sfLayout``. ``a_global_sf`` is
    typically ``448 * 6 / a.abs().max()``. ``do_shuffle=True`` (trtllm's weight shuffle),
    ``per_token_activation`` and ``expanded_idx_to_permuted_idx`` are not supported here."""
    layout = _check_layout("sfLayout", sfLayout)
    if do_shuffle:
        raise ValueError("do_shuffle=True (TRT-LLM's shuffled B operand) is not supported: no "
                         "trtllm FP4 GEMM here; quantise with do_shuffle=False")
    if per_token_activation:
        raise ValueError("per_token_activation=True is not supported")
    if expanded_idx_to_permuted_idx is not None:
        raise ValueError("expanded_idx_to_permuted_idx is not supported (MoE permuted quantise)")
    _global_scale(a_global_sf, False, a.device if isinstance(a, torch.Tensor) else "cpu",
                  "a_global_sf")  # a bad host value raises naming the caller's argument
    return fp4_quantize(a, a_global_sf, sf_vec_size, False, layout != SfLayout.layout_linear,
                        layout == SfLayout.layout_8x4, False, enable_pdl, backend)


def mxfp4_quantize(a: torch.Tensor, backend: str = "cuda", enable_pdl: Optional[bool] = None,
                   sfLayout: SfLayout = SfLayout.layout_128x4
                   ) -> Tuple[torch.Tensor, torch.Tensor]:
    """MXFP4: blocks of 32, UE8M0 scales (uint8) in ``sfLayout``. Returns ``(x_q, sf)``."""
    layout = _check_layout("sfLayout", sfLayout)
    return fp4_quantize(a, None, 32, True, layout != SfLayout.layout_linear,
                        layout == SfLayout.layout_8x4, False, enable_pdl, backend)


# --------------------------------------------------------------------------------------------
# dequantisers


def _check_packed(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.uint8:
        raise ValueError(f"{name} must be uint8 (packed e2m1 pairs), got {t.dtype}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D [M, K/2], got shape {tuple(t.shape)}")
    return t


def _check_scales(name: str, sf, rows: int, cols: int, layout: SfLayout,
                  dtypes=_SCALE_DTYPES) -> torch.Tensor:
    if not isinstance(sf, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(sf).__name__}")
    if sf.dtype not in dtypes:
        raise ValueError(f"{name} has unsupported dtype {sf.dtype}; allowed: "
                         f"{', '.join(str(d).removeprefix('torch.') for d in dtypes)}")
    shape = sf_storage_shape(rows, cols, layout)
    if sf.numel() != shape[0] * shape[1]:
        raise ValueError(f"{name} must hold {shape[0]} x {shape[1]} scales ({layout.name} "
                         f"storage of {rows} rows x {cols} blocks), got shape {tuple(sf.shape)}")
    return sf


def dequantize(x_q: torch.Tensor, sf_linear: torch.Tensor, sf_vec_size: int, ue8m0: bool,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Packed codes ``[R, K/2]`` and linear scales ``[R, K/sf_vec_size]`` -> ``[R, K]`` in
    ``dtype`` (no validation: the GEMM kernels call this)."""
    values = e2m1_to_float(_unpack(x_q), dtype)
    scales = scale_to_float(sf_linear, ue8m0).to(dtype)
    return values * scales.repeat_interleave(sf_vec_size, dim=1)


def e2m1_and_ufp8sf_scale_to_float(e2m1_tensor: torch.Tensor, ufp8_scale_tensor: torch.Tensor,
                                   global_scale_tensor: Optional[torch.Tensor] = None,
                                   sf_vec_size: int = 16, ufp8_type: int = 1,
                                   is_sf_swizzled_layout: bool = True,
                                   is_sf_8x4_layout: bool = False) -> torch.Tensor:
    """Dequantise packed e2m1 ``[M, K/2]`` with block scales to float32 ``[M, K]``:
    ``code * sf / global_scale``. ``ufp8_type``: 1 = e4m3 scales, 0 = UE8M0. The scales may
    have any shape holding the layout's storage (e.g. flattened)."""
    _check_packed("e2m1_tensor", e2m1_tensor)
    if sf_vec_size not in (16, 32):
        raise ValueError(f"sf_vec_size must be 16 or 32, got {sf_vec_size!r}")
    if ufp8_type not in (0, 1):
        raise ValueError(f"ufp8_type must be 1 (e4m3) or 0 (UE8M0), got {ufp8_type!r}")
    m, k = e2m1_tensor.shape[0], 2 * e2m1_tensor.shape[1]
    if k % sf_vec_size:
        raise ValueError(f"K = 2 * e2m1_tensor.shape[1] = {k} must be a multiple of "
                         f"sf_vec_size = {sf_vec_size}")
    layout = _layout_of(is_sf_swizzled_layout, is_sf_8x4_layout)
    sf = _check_scales("ufp8_scale_tensor", ufp8_scale_tensor, m, k // sf_vec_size, layout)
    sf = sf.to(e2m1_tensor.device)
    out = dequantize(e2m1_tensor, _from_layout(sf, m, k // sf_vec_size, layout), sf_vec_size,
                     ufp8_type == 0)
    if global_scale_tensor is not None:
        out = out / _global_scale(global_scale_tensor, False, out.device, "global_scale_tensor")
    return out


def mxfp4_dequantize(a_fp4: torch.Tensor, a_sf: torch.Tensor,
                     sfLayout: SfLayout = SfLayout.layout_128x4) -> torch.Tensor:
    """MXFP4 packed ``[M, K/2]`` with UE8M0 scales in ``sfLayout`` -> float32 ``[M, K]``."""
    layout = _check_layout("sfLayout", sfLayout)
    _check_packed("a_fp4", a_fp4)
    _check_scales("a_sf", a_sf, a_fp4.shape[0], 2 * a_fp4.shape[1] // 32, layout, (torch.uint8,))
    return e2m1_and_ufp8sf_scale_to_float(a_fp4, a_sf, None, 32, 0,
                                          layout != SfLayout.layout_linear,
                                          layout == SfLayout.layout_8x4)


def mxfp4_dequantize_host(weight: torch.Tensor, scale: torch.Tensor,
                          group_size: int = 32) -> torch.Tensor:
    """MXFP4 packed ``weight [M, K/2]`` with linear UE8M0 ``scale [M, K/group_size]`` ->
    float32 ``[M, K]``."""
    _check_packed("weight", weight)
    if not isinstance(group_size, int) or group_size <= 0 or (2 * weight.shape[1]) % group_size:
        raise ValueError(f"group_size must be a positive divisor of K = {2 * weight.shape[1]}, "
                         f"got {group_size!r}")
    m, cols = weight.shape[0], 2 * weight.shape[1] // group_size
    _check_scales("scale", scale, m, cols, SfLayout.layout_linear, (torch.uint8,))
    return dequantize(weight, scale.reshape(m, cols).to(weight.device), group_size, True)


def block_scale_interleave(unswizzled_sf: torch.Tensor) -> torch.Tensor:
    """Linear scales ``[M, C]`` (or ``[E, M, C]``, one matrix per expert) -> the 128x4 swizzled
    storage, flattened: 1-D of ``E * ceil(M/128)*128 * ceil(C/4)*4`` elements, same dtype."""
    if not isinstance(unswizzled_sf, torch.Tensor):
        raise TypeError(f"unswizzled_sf must be a torch.Tensor, got "
                        f"{type(unswizzled_sf).__name__}")
    if unswizzled_sf.dim() not in (2, 3):
        raise ValueError(f"unswizzled_sf must be 2-D [M, C] or 3-D [E, M, C], got shape "
                         f"{tuple(unswizzled_sf.shape)}")
    allowed = _SCALE_DTYPES + (torch.bfloat16,)
    if unswizzled_sf.dtype not in allowed:
        raise ValueError(f"unswizzled_sf has unsupported dtype {unswizzled_sf.dtype}; allowed: "
                         "float8_e4m3fn, uint8, bfloat16")
    mats = unswizzled_sf.reshape(-1, *unswizzled_sf.shape[-2:])
    # moved as raw bytes (one or two per scale): index_put has no float8 kernels
    mats = mats.view(torch.int16 if unswizzled_sf.dtype == torch.bfloat16 else torch.uint8)
    parts = []
    for mat in mats:
        rows, cols = mat.shape
        shape = sf_storage_shape(rows, cols, SfLayout.layout_128x4)
        flat = mat.new_zeros(shape[0] * shape[1])
        index = sf_offsets(rows, cols, SfLayout.layout_128x4, mat.device).reshape(-1)
        flat[index] = mat.reshape(-1)
        parts.append(flat)
    return torch.cat(parts).view(unswizzled_sf.dtype)


nvfp4_block_scale_interleave = block_scale_interleave


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
    a_deq = dequantize(a, _from_layout(a_sf, m, cols, a_layout), block_size, ue8m0, dtype)
    b_deq = dequantize(b.t(), _from_layout(b_sf, n, cols, SfLayout.layout_128x4), block_size,
                       ue8m0, dtype)
    return a_deq, b_deq
