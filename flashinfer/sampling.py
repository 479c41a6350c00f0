"""Token sampling (upstream module ``flashinfer.sampling``): sampling from probabilities or logits
with top-k / top-p / min-p filters, renormalisation, top-k masking, softmax and chain
speculative sampling. Names, argument order, defaults and return conventions are upstream's
(api-spec.md §6), plus our trailing ``backend="auto"``.

Keep rules (strict comparisons; a zero-probability token is never kept nor sampled)
------------------------------------------------------------------------------------
* top-k: ``x`` is kept iff fewer than ``k`` entries are strictly more probable; ``k <= 0`` or
  ``k >= vocab`` disables the filter; ties at the boundary are all kept.
* top-p: ``x`` is kept iff the mass strictly more probable than ``x`` is ``< top_p * sum(p)``, or
  ``x`` is a most probable token; ``top_p >= 1`` keeps every positive token.
* min-p: ``x`` is kept iff ``p_x >= min_p * max(p)``.
* top-k with top-p: ``filter_apply_order="top_k_first"`` applies top-p to the top-k renormalised
  distribution; ``"joint"`` applies both rules to the original distribution.
* The token is drawn with probability ``p_x / sum(kept p)``.
* An invalid row (NaN, ±inf, a negative entry, sum <= 0) or an ``indices[i]`` outside the rows
  gives token 0 and ``valid[i] = False`` (``return_valid=True``); never an id outside the vocab.
  ``check_nan=True`` raises ValueError on NaN instead; that check reads the tensor back to the
  host (a sync, and a graph break under torch.compile).

Canonical kernel signatures (every backend registers exactly these)
--------------------------------------------------------------------
``R`` rows in, ``V`` vocab, ``B`` outputs (``indices.numel()`` if given, else ``R``). Kernels write
every output element. ``seed``/``offset``: Python ints, or int64 tensors ``[1]`` or ``[B]`` on the
input's device (one value per output row). Same (seed, offset, input) gives the same bits on
the same backend and device; backends agree in distribution only. Thresholds are read at the
mapped row ``indices[i]``: ``top_k`` None, int or int32 ``[R]``; ``top_p``/``min_p``/
``temperature`` None, float or fp32 ``[R]``.

* ``sampling_from_probs``: ``kernel(probs, out, valid, indices, top_k, top_p, min_p, joint,
  deterministic, seed, offset)``; probs fp32 ``[R, V]`` contiguous; out int32/int64 ``[B]``;
  valid bool ``[B]``; indices None or int32/int64 ``[B]``.
* ``sampling_from_logits``: ``kernel(logits, out, indices, deterministic, seed, offset)``;
  logits fp32/fp16/bf16 ``[R, V]`` contiguous; samples softmax(logits); a NaN or all ``-inf``
  row gives 0.
* ``renorm_probs``: ``kernel(probs, out, top_k, top_p)``; exactly one of top_k/top_p given; out
  (probs' dtype) = p / sum(kept) on kept entries, 0 elsewhere (fp32 math, one rounding); an
  invalid row gives zeros.
* ``top_k_mask_logits``: ``kernel(logits, out, top_k)``: non-kept logits become ``-inf``.
* ``softmax``: ``kernel(logits, out, temperature)``; out fp32 = softmax(logits / temperature).
* ``chain_speculative_sampling``: ``kernel(draft_probs, draft_token_ids, target_probs, output,
  accepted, emitted, deterministic, seed, offset)``; fp32 ``[B, n, V]``, ids ``[B, n]``, fp32
  ``[B, n+1, V]``; output int32 ``[B, n+1]``; draft ``i`` is accepted iff
  ``u_i * p_draft[i, d_i] < p_target[i, d_i]`` (ids outside the vocab are rejected); at the
  first rejection ``pos`` the token is drawn from ``relu(p_target - p_draft)`` (``p_target`` if
  that is all zero; ``p_target[n]`` when all are accepted); slots after it are -1.
  ``emitted += pos``; ``accepted +=`` the number of drafts whose own test accepts.

Random numbers and generators
-----------------------------
With ``seed``/``offset`` both None they come from ``generator`` (default: the default generator of
the input's device), as upstream: a CUDA (Philox) generator gives its seed and offset and its
offset is advanced by ``ceil4(increment)`` (``batch`` for sampling_from_probs and min-p,
``batch*32`` for top-p/top-k/top-k-top-p, ``batch*vocab`` for sampling_from_logits,
``B*(n+1)`` for chain speculative sampling). A CPU (Mersenne Twister) generator has no offset:
one 63-bit integer is drawn from it as the seed and the offset is 0, so every call advances it
and ``manual_seed`` replays the sequence. Under torch.compile the default generator is read
inside the op at run time; pass ``seed``/``offset`` (ints or tensors) rather than a
``generator`` object there. Tensor seeds keep a call free of host syncs (CUDA-graph safe) on
backends that declare ``seed_tensor``.
"""

from __future__ import annotations

import numbers
from typing import Optional, Tuple, Union

import torch

from . import dispatch
from .api_logging import flashinfer_api
from .custom_op import custom_op
from .dispatch import Problem

__all__ = [
    "softmax", "sampling_from_logits", "sampling_from_probs", "top_p_sampling_from_probs",
    "top_k_sampling_from_probs", "min_p_sampling_from_probs", "top_k_top_p_sampling_from_probs",
    "top_k_top_p_sampling_from_logits", "top_p_renorm_probs", "top_p_renorm_prob",
    "top_k_renorm_probs", "top_k_renorm_prob", "top_k_mask_logits", "chain_speculative_sampling",
    "get_seed_and_offset",
]

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_INDEX = (torch.int32, torch.int64)
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


def _dist(name: str, t, rank: int = 2, dtypes=_FLOATS) -> torch.Tensor:
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


def _vector(name: str, t, length: int, device, dtypes) -> torch.Tensor:
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


def _indices(indices, device) -> Optional[torch.Tensor]:
    if indices is None:
        return None
    if not isinstance(indices, torch.Tensor) or indices.dim() != 1:
        raise ValueError(f"indices must be a 1-D int32/int64 tensor, got "
                         f"{getattr(indices, 'shape', type(indices).__name__)}")
    return _vector("indices", indices, indices.shape[0], device, _INDEX).contiguous()


def _top_k(top_k, rows: int, device):
    """-> (tensor int32 [R] or None, int)."""
    if isinstance(top_k, torch.Tensor):
        t = _vector("top_k", top_k, rows, device, _INDEX)
        return t.to(torch.int32).contiguous(), 0
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral):
        raise TypeError(f"top_k must be an int or an int32/int64 tensor, got {type(top_k).__name__}")
    return None, int(top_k)


def _fraction(name: str, value, rows: int, device):
    """-> (tensor fp32 [R] or None, float) for top_p / min_p in [0, 1]."""
    if isinstance(value, torch.Tensor):
        t = _vector(name, value, rows, device, _FLOATS + (torch.float64,))
        return t.to(torch.float32).contiguous(), 0.0
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float or a float tensor, got {type(value).__name__}")
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return None, float(value)


def _seed_kind(seed, offset, count: int, device):
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


def _resolve_seed(generator, increment: int, seeds, device):
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


def _check_nan(name: str, t: torch.Tensor, check_nan: bool) -> None:
    if check_nan and bool(torch.isnan(t).any()):
        raise ValueError(f"Input {name} contains NaN.")


def _check_backend(backend) -> None:
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {type(backend).__name__}")


# --------------------------------------------------------------------------------------------
# custom ops (dispatch + kernel call; opaque to torch.compile)


def _seed_args(seed_t, offset_t, seed_v, offset_v, use_default, increment, device):
    if use_default:
        seed_v, offset_v = get_seed_and_offset(increment, None, device)
    return (seed_t, offset_t) if seed_t is not None else (seed_v, offset_v)


def _shape(rows_out: int, vocab: int) -> dict:
    return {"batch_size": dispatch.length_bucket(rows_out), "vocab_size": dispatch.length_bucket(vocab)}


def _fake_samples(probs, indices, *args):
    count = indices.shape[0] if indices is not None else probs.shape[0]
    dtype = indices.dtype if indices is not None else torch.int32
    return (torch.empty(count, dtype=dtype, device=probs.device),
            torch.empty(count, dtype=torch.bool, device=probs.device))


@custom_op("sampling_from_probs", fake=_fake_samples)
def _sampling_from_probs_op(
        probs: torch.Tensor, indices: Optional[torch.Tensor], top_k_arr: Optional[torch.Tensor],
        top_k_val: Optional[int], top_p_arr: Optional[torch.Tensor], top_p_val: Optional[float],
        min_p_arr: Optional[torch.Tensor], min_p_val: Optional[float], joint: bool,
        deterministic: bool, seed_arr: Optional[torch.Tensor], offset_arr: Optional[torch.Tensor],
        seed_val: int, offset_val: int, use_default: bool, increment: int, backend: str
) -> Tuple[torch.Tensor, torch.Tensor]:
    probs = probs.float().contiguous()
    count = indices.shape[0] if indices is not None else probs.shape[0]
    out = torch.empty(count, dtype=indices.dtype if indices is not None else torch.int32,
                      device=probs.device)
    valid = torch.empty(count, dtype=torch.bool, device=probs.device)
    if count == 0:
        return out, valid
    top_k = top_k_arr if top_k_arr is not None else top_k_val
    top_p = top_p_arr if top_p_arr is not None else top_p_val
    min_p = min_p_arr if min_p_arr is not None else min_p_val
    features = [f for f, v in (("top_k", top_k), ("top_p", top_p), ("min_p", min_p),
                               ("indices", indices), ("seed_tensor", seed_arr)) if v is not None]
    if joint and top_k is not None and top_p is not None:
        features.append("joint")
    problem = Problem.make("sampling_from_probs", probs.device, dtypes={"probs": probs.dtype},
                           shape=_shape(count, probs.shape[1]), features=features)
    seed, offset = _seed_args(seed_arr, offset_arr, seed_val, offset_val, use_default, increment,
                              probs.device)
    dispatch.decide(problem, backend).kernel(probs, out, valid, indices, top_k, top_p, min_p,
                                             joint, deterministic, seed, offset)
    return out, valid


def _fake_logit_samples(logits, indices, *args):
    return _fake_samples(logits, indices)[0]


@custom_op("sampling_from_logits", fake=_fake_logit_samples)
def _sampling_from_logits_op(
        logits: torch.Tensor, indices: Optional[torch.Tensor], deterministic: bool,
        seed_arr: Optional[torch.Tensor], offset_arr: Optional[torch.Tensor], seed_val: int,
        offset_val: int, use_default: bool, backend: str) -> torch.Tensor:
    logits = logits.contiguous()
    count = indices.shape[0] if indices is not None else logits.shape[0]
    out = torch.empty(count, dtype=indices.dtype if indices is not None else torch.int32,
                      device=logits.device)
    if count == 0:
        return out
    features = [f for f, v in (("indices", indices), ("seed_tensor", seed_arr)) if v is not None]
    problem = Problem.make("sampling_from_logits", logits.device, dtypes={"logits": logits.dtype},
                           shape=_shape(count, logits.shape[1]), features=features)
    seed, offset = _seed_args(seed_arr, offset_arr, seed_val, offset_val, use_default,
                              count * logits.shape[1], logits.device)
    dispatch.decide(problem, backend).kernel(logits, out, indices, deterministic, seed, offset)
    return out


def _fake_like(x, *args):
    return torch.empty_like(x)


@custom_op("renorm_probs", fake=_fake_like)
def _renorm_op(probs: torch.Tensor, top_k_arr: Optional[torch.Tensor], top_k_val: Optional[int],
               top_p_arr: Optional[torch.Tensor], top_p_val: Optional[float], backend: str
               ) -> torch.Tensor:
    probs = probs.contiguous()
    out = torch.empty_like(probs)
    if probs.numel() == 0:
        return out
    top_k = top_k_arr if top_k_arr is not None else top_k_val
    top_p = top_p_arr if top_p_arr is not None else top_p_val
    problem = Problem.make("renorm_probs", probs.device, dtypes={"probs": probs.dtype},
                           shape=_shape(*probs.shape),
                           features=["top_k"] if top_k is not None else ["top_p"])
    dispatch.decide(problem, backend).kernel(probs, out, top_k, top_p)
    return out


@custom_op("top_k_mask_logits", fake=_fake_like)
def _mask_op(logits: torch.Tensor, top_k_arr: Optional[torch.Tensor], top_k_val: int,
             backend: str) -> torch.Tensor:
    logits = logits.contiguous()
    out = torch.empty_like(logits)
    if logits.numel() == 0:
        return out
    problem = Problem.make("top_k_mask_logits", logits.device, dtypes={"logits": logits.dtype},
                           shape=_shape(*logits.shape))
    dispatch.decide(problem, backend).kernel(logits, out,
                                             top_k_arr if top_k_arr is not None else top_k_val)
    return out


def _fake_softmax(logits, *args):
    return torch.empty_like(logits, dtype=torch.float32)


@custom_op("softmax", fake=_fake_softmax)
def _softmax_op(logits: torch.Tensor, temperature_arr: Optional[torch.Tensor],
                temperature_val: Optional[float], backend: str) -> torch.Tensor:
    logits = logits.contiguous()
    out = torch.empty_like(logits, dtype=torch.float32)
    if logits.numel() == 0:
        return out
    temperature = temperature_arr if temperature_arr is not None else temperature_val
    problem = Problem.make("softmax", logits.device, dtypes={"logits": logits.dtype},
                           shape=_shape(*logits.shape),
                           features=["temperature"] if temperature is not None else [])
    dispatch.decide(problem, backend).kernel(logits, out, temperature)
    return out


def _fake_chain(draft_probs, draft_token_ids, *args):
    batch, n = draft_token_ids.shape
    return torch.empty(batch, n + 1, dtype=torch.int32, device=draft_probs.device)


@custom_op("chain_speculative_sampling", mutates_args=("accepted", "emitted"), fake=_fake_chain)
def _chain_op(draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
              target_probs: torch.Tensor, accepted: torch.Tensor, emitted: torch.Tensor,
              deterministic: bool, seed_arr: Optional[torch.Tensor],
              offset_arr: Optional[torch.Tensor], seed_val: int, offset_val: int,
              use_default: bool, backend: str) -> torch.Tensor:
    batch, n, vocab = draft_probs.shape
    output = torch.empty(batch, n + 1, dtype=torch.int32, device=draft_probs.device)
    if batch == 0:
        return output
    problem = Problem.make("chain_speculative_sampling", draft_probs.device,
                           dtypes={"probs": torch.float32},
                           shape={**_shape(batch, vocab), "num_draft": n},
                           features=["seed_tensor"] if seed_arr is not None else [])
    seed, offset = _seed_args(seed_arr, offset_arr, seed_val, offset_val, use_default,
                              batch * (n + 1), draft_probs.device)
    dispatch.decide(problem, backend).kernel(
        draft_probs.float().contiguous(), draft_token_ids.contiguous(),
        target_probs.float().contiguous(), output, accepted, emitted, deterministic, seed, offset)
    return output


# --------------------------------------------------------------------------------------------
# public API

_Seed = Optional[Union[int, torch.Tensor]]
_ORDERS = ("top_k_first", "joint")


def _sample_probs(probs, indices, top_k, top_p, min_p, joint, deterministic, generator,
                  check_nan, seed, offset, return_valid, per_row_draws: int, backend):
    _dist("probs", probs)
    _check_backend(backend)
    rows, device = probs.shape[0], probs.device
    indices = _indices(indices, device)
    count = indices.shape[0] if indices is not None else rows
    k_arr, k_val = _top_k(top_k, rows, device) if top_k is not None else (None, None)
    p_arr, p_val = _fraction("top_p", top_p, rows, device) if top_p is not None else (None, None)
    m_arr, m_val = _fraction("min_p", min_p, rows, device) if min_p is not None else (None, None)
    seeds = _resolve_seed(generator, count * per_row_draws, _seed_kind(seed, offset, count, device),
                          device)
    _check_nan("probs", probs, check_nan)
    out, valid = _sampling_from_probs_op(probs, indices, k_arr, k_val, p_arr, p_val, m_arr, m_val,
                                         bool(joint), bool(deterministic), *seeds,
                                         count * per_row_draws, backend)
    return (out, valid) if return_valid else out


@flashinfer_api
def softmax(logits: torch.Tensor, temperature: Optional[Union[torch.Tensor, float]] = None,
            enable_pdl: Optional[bool] = None, *, backend: str = "auto") -> torch.Tensor:
    """Row softmax of ``logits / temperature`` in fp32. ``logits`` ``[batch, vocab]``
    fp32/fp16/bf16; ``temperature`` None, a float > 0 or a ``[batch]`` float tensor.
    Returns fp32 ``[batch, vocab]``. ``enable_pdl`` is accepted and ignored."""
    _dist("logits", logits)
    _check_backend(backend)
    t_arr, t_val = None, None
    if isinstance(temperature, torch.Tensor):
        t_arr = _vector("temperature", temperature, logits.shape[0], logits.device,
                        _FLOATS + (torch.float64,)).to(torch.float32).contiguous()
    elif temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
            raise TypeError(f"temperature must be None, a float or a float tensor, got "
                            f"{type(temperature).__name__}")
        if not 0.0 < float(temperature) < float("inf"):
            raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
        t_val = float(temperature)
    return _softmax_op(logits, t_arr, t_val, backend)


@flashinfer_api
def sampling_from_logits(logits: torch.Tensor, indices: Optional[torch.Tensor] = None,
                         deterministic: bool = True, generator: Optional[torch.Generator] = None,
                         check_nan: bool = False, seed: _Seed = None, offset: _Seed = None, *,
                         backend: str = "auto") -> torch.Tensor:
    """Sample one token per output from ``softmax(logits)``. ``logits`` ``[rows, vocab]``
    fp32/fp16/bf16; ``indices`` optional ``[batch]`` int32/int64 (output ``i`` reads row
    ``indices[i]``). Returns int32 ``[batch]`` (``indices.dtype`` with indices)."""
    _dist("logits", logits)
    _check_backend(backend)
    device = logits.device
    indices = _indices(indices, device)
    count = indices.shape[0] if indices is not None else logits.shape[0]
    seeds = _resolve_seed(generator, count * logits.shape[1], _seed_kind(seed, offset, count, device),
                          device)
    _check_nan("logits", logits, check_nan)
    return _sampling_from_logits_op(logits, indices, bool(deterministic), *seeds, backend)


@flashinfer_api
def sampling_from_probs(probs: torch.Tensor, indices: Optional[torch.Tensor] = None,
                        deterministic: bool = True, generator: Optional[torch.Generator] = None,
                        check_nan: bool = False, seed: _Seed = None, offset: _Seed = None,
                        return_valid: bool = False, *, backend: str = "auto"):
    """Sample one token per output from ``probs`` ``[rows, vocab]`` (cast to fp32; need not be
    normalised). Returns int32 ``[batch]`` (``indices.dtype`` with indices), or
    ``(samples, valid)`` with ``return_valid=True``."""
    return _sample_probs(probs, indices, None, None, None, False, deterministic, generator,
                         check_nan, seed, offset, return_valid, 1, backend)


@flashinfer_api
def top_p_sampling_from_probs(probs: torch.Tensor, top_p: Union[torch.Tensor, float],
                              indices: Optional[torch.Tensor] = None, deterministic: bool = True,
                              generator: Optional[torch.Generator] = None, check_nan: bool = False,
                              seed: _Seed = None, offset: _Seed = None, return_valid: bool = False,
                              *, backend: str = "auto"):
    """Top-p (nucleus) sampling; ``top_p`` a float in [0, 1] or a ``[rows]`` tensor. See
    :func:`sampling_from_probs` for the other arguments and the return value."""
    return _sample_probs(probs, indices, None, top_p, None, False, deterministic, generator,
                         check_nan, seed, offset, return_valid, 32, backend)


@flashinfer_api
def top_k_sampling_from_probs(probs: torch.Tensor, top_k: Union[torch.Tensor, int],
                              indices: Optional[torch.Tensor] = None, deterministic: bool = True,
                              generator: Optional[torch.Generator] = None, check_nan: bool = False,
                              seed: _Seed = None, offset: _Seed = None, return_valid: bool = False,
                              *, backend: str = "auto"):
    """Top-k sampling; ``top_k`` an int or a ``[rows]`` int tensor (``k <= 0`` or
    ``k >= vocab``: no filter). See :func:`sampling_from_probs`."""
    return _sample_probs(probs, indices, top_k, None, None, False, deterministic, generator,
                         check_nan, seed, offset, return_valid, 32, backend)


@flashinfer_api
def min_p_sampling_from_probs(probs: torch.Tensor, min_p: Union[torch.Tensor, float],
                              indices: Optional[torch.Tensor] = None, deterministic: bool = True,
                              generator: Optional[torch.Generator] = None, check_nan: bool = False,
                              seed: _Seed = None, offset: _Seed = None, return_valid: bool = False,
                              *, backend: str = "auto"):
    """Min-p sampling: keep ``p >= min_p * max(p)``; ``min_p`` a float in [0, 1] or a
    ``[rows]`` tensor. See :func:`sampling_from_probs`."""
    return _sample_probs(probs, indices, None, None, min_p, False, deterministic, generator,
                         check_nan, seed, offset, return_valid, 1, backend)


def _joint(filter_apply_order) -> bool:
    if filter_apply_order not in _ORDERS:
        raise ValueError(f"filter_apply_order must be one of {', '.join(map(repr, _ORDERS))}, "
                         f"got {filter_apply_order!r}")
    return filter_apply_order == "joint"


@flashinfer_api
def top_k_top_p_sampling_from_probs(probs: torch.Tensor, top_k: Union[torch.Tensor, int],
                                    top_p: Union[torch.Tensor, float],
                                    indices: Optional[torch.Tensor] = None,
                                    filter_apply_order: str = "top_k_first",
                                    deterministic: bool = True,
                                    generator: Optional[torch.Generator] = None,
                                    check_nan: bool = False, seed: _Seed = None,
                                    offset: _Seed = None, return_valid: bool = False, *,
                                    backend: str = "auto"):
    """Top-k and top-p sampling in one call (``filter_apply_order``: ``"top_k_first"`` or
    ``"joint"``, module docstring). See :func:`sampling_from_probs`."""
    return _sample_probs(probs, indices, top_k, top_p, None, _joint(filter_apply_order),
                         deterministic, generator, check_nan, seed, offset, return_valid, 32,
                         backend)


@flashinfer_api
def top_k_top_p_sampling_from_logits(logits: torch.Tensor, top_k: Union[torch.Tensor, int],
                                     top_p: Union[torch.Tensor, float],
                                     indices: Optional[torch.Tensor] = None,
                                     filter_apply_order: str = "top_k_first",
                                     deterministic: bool = True,
                                     generator: Optional[torch.Generator] = None,
                                     check_nan: bool = False, seed: _Seed = None,
                                     offset: _Seed = None, *, backend: str = "auto") -> torch.Tensor:
    """:func:`softmax` of ``logits`` then :func:`top_k_top_p_sampling_from_probs` (no
    ``return_valid``, as upstream)."""
    _dist("logits", logits)
    joint = _joint(filter_apply_order)
    _check_nan("logits", logits, check_nan)
    probs = softmax(logits, backend=backend)
    return _sample_probs(probs, indices, top_k, top_p, None, joint, deterministic, generator,
                         False, seed, offset, False, 32, backend)


@flashinfer_api
def top_p_renorm_probs(probs: torch.Tensor, top_p: Union[torch.Tensor, float],
                       is_deterministic: bool = False, *, backend: str = "auto") -> torch.Tensor:
    """Zero the probabilities outside the top-p nucleus and renormalise. ``probs``
    ``[rows, vocab]`` fp32/fp16/bf16; returns the same shape and dtype. ``is_deterministic`` is
    accepted; every kernel here is deterministic."""
    _dist("probs", probs)
    _check_backend(backend)
    p_arr, p_val = _fraction("top_p", top_p, probs.shape[0], probs.device)
    return _renorm_op(probs, None, None, p_arr, p_val, backend)


@flashinfer_api
def top_k_renorm_probs(probs: torch.Tensor, top_k: Union[torch.Tensor, int],
                       is_deterministic: bool = False, *, backend: str = "auto") -> torch.Tensor:
    """Zero the probabilities outside the top-k and renormalise (same shape and dtype)."""
    _dist("probs", probs)
    _check_backend(backend)
    k_arr, k_val = _top_k(top_k, probs.shape[0], probs.device)
    return _renorm_op(probs, k_arr, k_val, None, None, backend)


top_p_renorm_prob = top_p_renorm_probs
top_k_renorm_prob = top_k_renorm_probs


@flashinfer_api
def top_k_mask_logits(logits: torch.Tensor, top_k: Union[torch.Tensor, int], *,
                      backend: str = "auto") -> torch.Tensor:
    """Set the logits outside the top-k to ``-inf`` (same shape and dtype)."""
    _dist("logits", logits)
    _check_backend(backend)
    k_arr, k_val = _top_k(top_k, logits.shape[0], logits.device)
    return _mask_op(logits, k_arr, k_val, backend)


@flashinfer_api
def chain_speculative_sampling(draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
                               target_probs: torch.Tensor,
                               maybe_output_accepted_token_num: Optional[torch.Tensor] = None,
                               maybe_output_emitted_draft_token_num: Optional[torch.Tensor] = None,
                               deterministic: bool = True,
                               generator: Optional[torch.Generator] = None, seed: _Seed = None,
                               offset: _Seed = None, *, backend: str = "auto"):
    """Accept/reject a chain of ``n`` draft tokens per request (module docstring). Returns the
    3-tuple ``(output_token_ids int32 [B, n+1] (-1 after the first rejection), accepted [B],
    emitted [B])``; the counts are added into the given counter tensors (int32 ``[B]``)."""
    _dist("draft_probs", draft_probs, rank=3)
    _check_backend(backend)
    batch, n, vocab = draft_probs.shape
    device = draft_probs.device
    _dist("target_probs", target_probs, rank=3)
    if tuple(target_probs.shape) != (batch, n + 1, vocab):
        raise ValueError(f"target_probs must have shape {(batch, n + 1, vocab)} (draft_probs "
                         f"with one more position), got {tuple(target_probs.shape)}")
    if target_probs.device != device:
        raise ValueError(f"target_probs is on {target_probs.device} but draft_probs is on {device}")
    if not isinstance(draft_token_ids, torch.Tensor) or draft_token_ids.dtype not in _INDEX:
        raise TypeError(f"draft_token_ids must be an int32/int64 tensor, got "
                        f"{getattr(draft_token_ids, 'dtype', type(draft_token_ids).__name__)}")
    if tuple(draft_token_ids.shape) != (batch, n):
        raise ValueError(f"draft_token_ids must have shape {(batch, n)}, got "
                         f"{tuple(draft_token_ids.shape)}")
    if draft_token_ids.device != device:
        raise ValueError(f"draft_token_ids is on {draft_token_ids.device} but draft_probs is on {device}")
    counters = []
    for name, t in (("maybe_output_accepted_token_num", maybe_output_accepted_token_num),
                    ("maybe_output_emitted_draft_token_num", maybe_output_emitted_draft_token_num)):
        counters.append(torch.zeros(batch, dtype=torch.int32, device=device) if t is None else
                        _vector(name, t, batch, device, (torch.int32,)))
    seeds = _resolve_seed(generator, batch * (n + 1), _seed_kind(seed, offset, batch, device), device)
    output = _chain_op(draft_probs, draft_token_ids, target_probs, counters[0], counters[1],
                       bool(deterministic), *seeds, backend)
    return output, counters[0], counters[1]
