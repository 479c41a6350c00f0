"""FP4 (e2m1) quantisation: NVFP4 and MXFP4 (upstream ``flashinfer.quantization`` FP4 part).

Pure torch ops on any device; these are the reference implementations (upstream's CUDA kernels
need SM 10.x / 12.x). ``backend`` and ``enable_pdl`` arguments are accepted for compatibility and
ignored: upstream uses them only to pick its CUDA implementation.

The formats (e2m1 codes, block scales, scale layouts) are :mod:`flashinfer.fp4_format`'s.

Non-finite values: a block holding NaN gets a NaN scale (e4m3 NaN, or UE8M0 255, which every
dequantiser here reads as NaN), so it dequantises to NaN (NaN in, NaN out); a block holding
inf saturates (scale 448 for e4m3, 254 for UE8M0; the inf element becomes the largest code,
the block's finite elements may flush to 0). The global scale must be finite and > 0: a float
or CPU tensor that is not raises ``ValueError`` naming it; a GPU tensor is not read back: a
bad value there makes every NVFP4 block scale of the quantisers NaN, and the dequantiser
divides by it (IEEE). Every quantiser writes fresh tensors (no ``out=`` arguments, so no
aliasing to check).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..backend_names import family_spelling
from ..fp4_format import (
    SfLayout, dequantize, e2m1_to_float, float_to_e2m1, float_to_ue8m0, from_layout, pack_e2m1,
    sf_offsets, sf_storage_shape, to_layout,
)

__all__ = [
    "SfLayout", "fp4_quantize", "nvfp4_quantize", "mxfp4_quantize", "mxfp4_dequantize",
    "mxfp4_dequantize_host", "block_scale_interleave", "nvfp4_block_scale_interleave",
    "e2m1_and_ufp8sf_scale_to_float",
]


_SOURCES = (torch.float16, torch.bfloat16, torch.float32)
_SCALE_DTYPES = (torch.float8_e4m3fn, torch.uint8)


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
    family_spelling("fp4_quantization", backend)


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
        sf = float_to_ue8m0(amax / 6.0)
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
    return pack_e2m1(codes), to_layout(sf, layout)


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
    out = dequantize(e2m1_tensor, from_layout(sf, m, k // sf_vec_size, layout), sf_vec_size,
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


