"""Argument handling of :mod:`flashinfer.sampling.ops`: generators to (seed, offset), and the checks of
distributions, index arrays, thresholds and seeds (metadata only, so they run on fake tensors
while tracing too; :func:`check_rows`, which reads a CPU threshold tensor's values, is called by
the ops themselves, on real tensors). The rules are stated in :mod:`flashinfer.sampling.ops`'s
docstring."""

from __future__ import annotations

import numbers
from typing import Optional, Tuple

import torch

from ..index_checks import Check, enforce, fault

#: ``indices`` of the sampling functions: output ``i`` reads input row ``indices[i]``
INDICES_FAULT = fault("flashinfer.sampling", "indices",
                      "a row of the input (probs or logits) in [0, {bound})")

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
_M64 = 1 << 64
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1


# --------------------------------------------------------------------------------------------
# generators


def get_seed_and_offset(increment: int, generator: Optional[torch.Generator] = None,
                        device: Optional[torch.device] = None) -> Tuple[int, int]:
    """``(seed, offset)`` for a call consuming ``increment`` random numbers; advances the
    generator (CUDA: offset += ceil4(increment); CPU: one draw, offset 0 — module docstring)."""
    if generator is None:
        generator = default_generator(device)
    if generator.device.type == "cpu":
        seed = int(torch.randint(0, 1 << 62, (1,), generator=generator).item())
        return seed, 0
    # the Philox generator's (seed, offset) as Python ints: no state tensor is made or parsed
    seed, offset = generator.initial_seed(), generator.get_offset()
    generator.set_offset(offset + (int(increment) + 3) // 4 * 4)
    return seed, offset


#: torch.device -> its default generator (the same object for the process's life: manual_seed
#: reseeds it in place)
_DEFAULT_GENERATORS: dict = {}


def default_generator(device) -> torch.Generator:
    """``device``'s default generator (CUDA: that GPU's, the current one for an index-less
    ``"cuda"``; the CPU's for None without CUDA)."""
    found = _DEFAULT_GENERATORS.get(device)
    return found if found is not None else _default_generator(device)


def _default_generator(device) -> torch.Generator:
    given = device
    device = torch.device(device) if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    if device.type == "cuda":
        if device.index is None:  # the current device's: not kept (it may change)
            return torch.cuda.default_generators[torch.cuda.current_device()]
        generator = torch.cuda.default_generators[device.index]
    else:
        generator = torch.default_generator
    if isinstance(given, torch.device):
        _DEFAULT_GENERATORS[given] = generator
    return generator


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
    """-> (tensor int32 [R] or None, int). Every integer is a valid top-k (``k <= 0`` and ``k >=
    vocab`` filter nothing), so values are saturated to int32 rather than wrapped (an int64
    ``2**32 + 1`` must not become 1)."""
    if isinstance(top_k, torch.Tensor):
        t = vector_arg("top_k", top_k, rows, device, INDEX_DTYPES)
        if t.dtype == torch.int64:
            t = t.clamp(_I32_MIN, _I32_MAX)
        return t.to(torch.int32).contiguous(), 0
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral):
        raise TypeError(f"top_k must be an int or an int32/int64 tensor, got {type(top_k).__name__}")
    return None, min(max(int(top_k), _I32_MIN), _I32_MAX)


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


def temperature_arg(value, rows: int, device):
    """-> (tensor fp32 [R] or None, float or None) for softmax's temperature: a finite number >
    0 (a tensor is checked row by row on the host when it lives on the CPU: check_rows)."""
    if value is None:
        return None, None
    if isinstance(value, torch.Tensor):
        t = vector_arg("temperature", value, rows, device, FLOAT_DTYPES + (torch.float64,))
        return t.to(torch.float32).contiguous(), None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"temperature must be None, a float or a float tensor, got "
                        f"{type(value).__name__}")
    if not 0.0 < float(value) < float("inf"):
        raise ValueError(f"temperature must be a finite number > 0, got {value!r}")
    return None, float(value)


#: the per-row rules of the threshold tensors, as read by the kernels (float32 values):
#: (test on a tensor -> bool mask of the good rows, what is allowed)
_ROW_RULES = {
    "top_p": (lambda t: (t >= 0) & (t <= 1), "in [0, 1]"),
    "min_p": (lambda t: (t >= 0) & (t <= 1), "in [0, 1]"),
    "temperature": (lambda t: (t > 0) & (t < float("inf")), "a finite number > 0"),
}


def check_index_rows(indices: Optional[torch.Tensor], rows: int) -> None:
    """The index contract (:mod:`flashinfer.index_checks`) for ``indices``: on the CPU (and with
    ``FLASHINFER_CHECK_INDICES=1``) an entry outside ``[0, rows)`` raises ValueError; on a GPU it
    is recorded for ``flashinfer.check_errors()`` (device ops, no synchronisation), while the
    kernels return its output invalid (token 0, ``valid=False``). Called inside the ops."""
    if indices is None or indices.numel() == 0:
        return
    enforce([Check(INDICES_FAULT, (indices < 0) | (indices >= rows), indices, rows)],
            indices.device)


def check_rows(name: str, t: Optional[torch.Tensor]) -> None:
    """Host check of a per-row threshold tensor (fp32, as the kernels read it) that lives on the
    CPU: ValueError naming the argument, the first bad row, its value and what is allowed. No
    synchronisation is involved. A tensor on a GPU is not read back (that would wait for the
    GPU and break CUDA-graph capture): there the kernels return such a row invalid (module
    docstring of :mod:`flashinfer.sampling.ops`). Called inside the ops, on real tensors."""
    if t is None or t.device.type != "cpu":
        return
    good, allowed = _ROW_RULES[name]
    ok = good(t)
    if bool(ok.all()):
        return
    row = int((~ok).nonzero()[0, 0])
    raise ValueError(f"{name} must be {allowed} in every row, got {name}[{row}] = "
                     f"{float(t[row]):.7g} (a CPU tensor is checked on the host; on a GPU such "
                     f"a row gets the result of an invalid row)")


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
