"""Argument handling of :mod:`flashinfer.sampling`: generators to (seed, offset), and the checks of
distributions, index arrays, thresholds and seeds (metadata only, so they run on fake tensors
while tracing too). The rules are stated in :mod:`flashinfer.sampling`'s docstring."""

from __future__ import annotations

import numbers
from typing import Optional, Tuple

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
_M64 = 1 << 64


# --------------------------------------------------------------------------------------------
# generators


def get_seed_and_offset(increment: int, generator: Optional[torch.Generator] = None,
                        device: Optional[torch.device] = None) -> Tuple[int, int]:
    """``(seed, offset)`` for a call consuming ``increment`` random numbers; advances the
    generator (CUDA: offset += ceil4(increment); CPU: one draw, offset 0 — module docstring)."""
    if generator is None:
        device = torch.device(device) if device is not None else (
            torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
        if device.type == "cuda":
            generator = torch.cuda.default_generators[
                device.index if device.index is not None else torch.cuda.current_device()]
        else:
            generator = torch.default_generator
    if generator.device.type == "cpu":
        seed = int(torch.randint(0, 1 << 62, (1,), generator=generator).item())
        return seed, 0
    seed, offset = (int(v) for v in generator.get_state().view(torch.int64))
    new_offset = offset + (int(increment) + 3) // 4 * 4
    generator.set_state(torch.tensor([seed, new_offset], dtype=torch.int64).view(torch.uint8))
    return seed, offset


# --------------------------------------------------------------------------------------------
# validation (metadata only: runs on fake tensors too)


def distribution(name: str, t, rank: int = 2, dtypes=FLOAT_DTYPES) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} dtype {t.dtype} is not supported; allowed: "
                        f"{', '.join(str(d).removeprefix('torch.') for d in dtypes)}")
    if t.dim() != rank:
        raise ValueError(f"{name} must be {rank}-D, got shape {tuple(t.shape)}")
    if t.shape[-1] == 0:
        raise ValueError(f"{name} vocabulary (last dim) must be >= 1, got shape {tuple(t.shape)}")
    return t


def vector_arg(name: str, t, length: int, device, dtypes) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} dtype {t.dtype} is not supported; allowed: "
                        f"{', '.join(str(d).removeprefix('torch.') for d in dtypes)}")
    if t.dim() != 1 or t.shape[0] != length:
        raise ValueError(f"{name} must have shape ({length},), got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the input is on {device}")
    return t


def index_map(indices, device) -> Optional[torch.Tensor]:
    if indices is None:
        return None
    if not isinstance(indices, torch.Tensor) or indices.dim() != 1:
        raise ValueError(f"indices must be a 1-D int32/int64 tensor, got "
                         f"{getattr(indices, 'shape', type(indices).__name__)}")
    return vector_arg("indices", indices, indices.shape[0], device, INDEX_DTYPES).contiguous()


def top_k_arg(top_k, rows: int, device):
    """-> (tensor int32 [R] or None, int)."""
    if isinstance(top_k, torch.Tensor):
        t = vector_arg("top_k", top_k, rows, device, INDEX_DTYPES)
        return t.to(torch.int32).contiguous(), 0
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral):
        raise TypeError(f"top_k must be an int or an int32/int64 tensor, got {type(top_k).__name__}")
    return None, int(top_k)


def fraction_arg(name: str, value, rows: int, device):
    """-> (tensor fp32 [R] or None, float) for top_p / min_p in [0, 1]."""
    if isinstance(value, torch.Tensor):
        t = vector_arg(name, value, rows, device, FLOAT_DTYPES + (torch.float64,))
        return t.to(torch.float32).contiguous(), 0.0
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float or a float tensor, got {type(value).__name__}")
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return None, float(value)


def seed_kind(seed, offset, count: int, device):
    """-> (seed tensor, offset tensor, seed int, offset int, use_default_generator)."""
    if (seed is None) != (offset is None):
        raise ValueError("seed and offset must be given together (both None: use the generator)")
    if seed is None:
        return None, None, 0, 0, True
    if isinstance(seed, torch.Tensor) != isinstance(offset, torch.Tensor):
        raise ValueError("seed and offset must both be tensors or both be ints, got "
                         f"{type(seed).__name__} and {type(offset).__name__}")
    if isinstance(seed, torch.Tensor):
        out = []
        for name, t in (("seed", seed), ("offset", offset)):
            if t.dtype not in (torch.int64, torch.uint64):
                raise TypeError(f"{name} tensor dtype {t.dtype} is not supported; allowed: int64, uint64")
            if t.dim() != 1 or t.shape[0] not in (1, count):
                raise ValueError(f"{name} tensor must have shape (1,) or ({count},), got {tuple(t.shape)}")
            if t.device != device:
                raise ValueError(f"{name} tensor is on {t.device} but the input is on {device}")
            out.append(t.view(torch.int64) if t.dtype == torch.uint64 else t)
        return out[0], out[1], 0, 0, False
    vals = []
    for name, v in (("seed", seed), ("offset", offset)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{name} must be an int or an int64 tensor, got {type(v).__name__}")
        if not 0 <= int(v) < _M64:
            raise ValueError(f"{name} must be in [0, 2**64), got {v}")
        vals.append(int(v) - _M64 if int(v) >= 1 << 63 else int(v))  # as int64 bits
    return None, None, vals[0], vals[1], False


def resolve_seed(generator, increment: int, seeds, device):
    """Resolve an explicit generator here (outside the op); the default one inside the op."""
    seed_t, offset_t, seed_v, offset_v, use_default = seeds
    if use_default and generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        if generator.device.type != device.type:
            raise ValueError(f"generator is on {generator.device} but the input is on {device}")
        seed_v, offset_v = get_seed_and_offset(increment, generator, device)
        seed_v, use_default = (seed_v - _M64 if seed_v >= 1 << 63 else seed_v), False
    return seed_t, offset_t, seed_v, offset_v, use_default


def check_nan_arg(name: str, t: torch.Tensor, check_nan: bool) -> None:
    if check_nan and bool(torch.isnan(t).any()):
        raise ValueError(f"Input {name} contains NaN.")


def check_backend(backend) -> None:
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {type(backend).__name__}")
