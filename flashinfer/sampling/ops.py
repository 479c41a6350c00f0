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
* An invalid row (NaN, ±inf, a negative entry, sum <= 0) gives token 0 and ``valid[i] = False``
  (``return_valid=True``); never an id outside the vocab.
* ``indices`` is an index array (the contract of :mod:`flashinfer.index_checks`): on the CPU an
  entry outside the rows raises ValueError naming ``indices[i]``; on a GPU the kernels give that
  output token 0 and ``valid[i] = False`` and the entry is recorded, raised by
  ``flashinfer.check_errors()`` (or at the call with ``FLASHINFER_CHECK_INDICES=1``).
  ``check_nan=True`` raises ValueError on NaN instead; that check reads the tensor back to the
  host (a sync, and a graph break under torch.compile).
* No sampler marks a token valid when the kept set is empty, whatever the cause.

Per-row thresholds follow the scalars' rules
--------------------------------------------
``top_p`` and ``min_p`` must be in [0, 1] (NaN is not), ``temperature`` a finite number > 0,
``top_k`` any integer (int64 tensor values saturate to int32: ``k <= 0`` and ``k >= vocab``
filter nothing). A tensor's rule applies to its values as the kernels read them (float32 /
int32). A scalar that breaks its rule raises ValueError (TypeError for a wrong type) at the
call. A tensor that breaks it in some row:

* on the CPU is checked on the host (no synchronisation): ValueError naming the argument, the
  first bad row, its value and what is allowed;
* on a GPU is not read back (engines pass per-row tensors every step, inside CUDA graphs):
  each kernel tests the value it loads, and the row has a defined result. A sampler returns
  token 0 and ``valid = False`` for every output that reads the row (never a NaN, never a token
  marked valid); ``top_p_renorm_probs`` writes the row as zeros (an invalid row's result);
  ``softmax`` writes the row as zeros for a bad temperature.

Canonical kernel signatures (every backend registers exactly these)
--------------------------------------------------------------------
``R`` rows in, ``V`` vocab, ``B`` outputs (``indices.numel()`` if given, else ``R``). Kernels write
every output element. ``seed``/``offset``: Python ints, or int64 tensors ``[1]`` or ``[B]`` on the
input's device (one value per output row). Same (seed, offset, input) gives the same bits on
the same backend and device; backends agree in distribution only. Thresholds are read at the
mapped row ``indices[i]``: ``top_k`` None, int or int32 ``[R]``; ``top_p``/``min_p``/
``temperature`` None, float or fp32 ``[R]``. A tensor row that breaks its rule gets the result
of an invalid row (token 0 and valid False; zeros from renorm_probs and softmax): each kernel
tests the value where it loads it (scalars are checked before the call).

* ``sampling_from_probs``: ``kernel(probs, out, valid, indices, top_k, top_p, min_p, joint,
  deterministic, seed, offset)``; probs fp32 ``[R, V]`` contiguous; out int32/int64 ``[B]``;
  valid bool ``[B]``; indices None or int32/int64 ``[B]``.
* ``sampling_from_logits``: ``kernel(logits, out, indices, deterministic, seed, offset)``;
  logits fp32/fp16/bf16 ``[R, V]`` contiguous; samples softmax(logits); a NaN or all ``-inf``
  row gives 0.
* ``top_k_top_p_sampling_from_logits``: ``kernel(logits, out, indices, top_k, top_p, joint,
  deterministic, seed, offset)``: ``sampling_from_probs`` of ``softmax(logits)`` with the top-k
  and top-p rules (``top_k`` always given); logits fp32/fp16/bf16 ``[R, V]`` contiguous; an
  invalid row (a NaN or +inf logit, no finite one) or index gives 0.
* ``renorm_probs``: ``kernel(probs, out, top_k, top_p)``; exactly one of top_k/top_p given; out
  (probs' dtype) = p / sum(kept) on kept entries, 0 elsewhere (fp32 math, one rounding); an
  invalid row gives zeros.
* ``top_k_mask_logits``: ``kernel(logits, out, top_k)``: non-kept logits become ``-inf``.
* ``softmax``: ``kernel(logits, out, temperature)``; out fp32 = softmax(logits / temperature),
  computed as ``softmax((x - max x) / T)`` so that a tiny temperature does not overflow (it
  tends to the arg-max); a temperature row not finite and > 0 gives zeros; a NaN or +inf
  logit, or only ``-inf`` ones, give a NaN row (as ``torch.softmax``).
* ``chain_speculative_sampling``: ``kernel(draft_probs, draft_token_ids, target_probs, output,
  accepted, emitted, deterministic, seed, offset)``; fp32 ``[B, n, V]``, ids ``[B, n]``, fp32
  ``[B, n+1, V]``; output int32 ``[B, n+1]``; draft ``i`` is accepted iff
  ``u_i * p_draft[i, d_i] < p_target[i, d_i]`` (ids outside the vocab are rejected); at the
  first rejection ``pos`` the token is drawn from ``relu(p_target - p_draft)`` (``p_target`` if
  that is all zero; ``p_target[n]`` when all are accepted; NaN entries weigh 0, an accept test
  reading a NaN rejects, no weight at all gives token 0); slots after it are -1.
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

from typing import Optional, Tuple, Union

import torch

from .. import dispatch
from ..api_logging import flashinfer_api
from ..checked_calls import CheckedCalls, tensor_fact
from ..custom_op import custom_op
from ..dispatch import Problem
from .args import (
    INDEX_DTYPES, check_backend, check_index_rows, check_nan_arg, check_rows, distribution,
    fraction_arg, index_map, resolve_seed, seed_kind, temperature_arg, top_k_arg, vector_arg,
    default_generator, get_seed_and_offset,
)

__all__ = [
    "softmax", "sampling_from_logits", "sampling_from_probs", "top_p_sampling_from_probs",
    "top_k_sampling_from_probs", "min_p_sampling_from_probs", "top_k_top_p_sampling_from_probs",
    "top_k_top_p_sampling_from_logits", "top_p_renorm_probs", "top_p_renorm_prob",
    "top_k_renorm_probs", "top_k_renorm_prob", "top_k_mask_logits", "chain_speculative_sampling",
    "get_seed_and_offset",
]

# --------------------------------------------------------------------------------------------
# custom ops (dispatch + kernel call; opaque to torch.compile)


def _seed_args(seed_t, offset_t, seed_v, offset_v, use_default, increment, device):
    if use_default:
        seed_v, offset_v = get_seed_and_offset(increment, None, device)
    return (seed_t, offset_t) if seed_t is not None else (seed_v, offset_v)


def _shape(rows_out: int, vocab: int) -> dict:
    return {"batch_size": dispatch.length_bucket(rows_out), "vocab_size": dispatch.length_bucket(vocab)}


def _top_k_facts(shape: dict, features: list, top_k_arr, top_k_val, vocab: int) -> dict:
    """What the dispatcher knows of a top-k: feature ``top_k_per_row`` for a tensor, else the
    scalar's power-of-two bucket as shape fact ``top_k`` (the two-pass kernels' checks read
    it), 0 for a k that filters nothing. Adds to ``features``; returns ``shape``."""
    if top_k_arr is not None:
        features.append("top_k_per_row")
    elif top_k_val is not None:
        # a k that filters nothing (k <= 0 or k >= vocab) is fact 0: the kernels that need a
        # real top-k (the two-pass ones) reject it, the general ones serve it
        enabled = 0 < top_k_val < vocab
        shape["top_k"] = dispatch.length_bucket(top_k_val) if enabled else 0
    return shape


def _samples_out(rows: int, indices, device) -> torch.Tensor:
    """The token output: ``[len(indices)]`` of ``indices.dtype``, else ``[rows]`` int32."""
    count = indices.shape[0] if indices is not None else rows
    return torch.empty(count, dtype=indices.dtype if indices is not None else torch.int32,
                       device=device)


def _present(**named) -> list:
    """The names of the arguments that are not None (the optional features of a call)."""
    return [name for name, value in named.items() if value is not None]


def _dispatch_facts(op: str, device: torch.device, role: str, dtype: torch.dtype, shape: dict,
                    features: list) -> tuple:
    """``(key, make_problem)`` of a call's raw facts for :func:`flashinfer.dispatch.decide_keyed`
    (the Problem is built on a miss only)."""
    key = (op, device, dtype, *shape.values(), *features)
    return key, lambda: Problem.make(op, device, dtypes={role: dtype}, shape=shape,
                                     features=features)


def _decide(op: str, device: torch.device, role: str, dtype: torch.dtype, shape: dict,
            features: list, backend: str) -> dispatch.Decision:
    """The Decision for ``op``, looked up by the call's raw facts."""
    return dispatch.decide_keyed(*_dispatch_facts(op, device, role, dtype, shape, features),
                                 backend)


def _draw_dispatch(probs: torch.Tensor, count: int, indices, top_k_arr, top_k, top_p, min_p,
                   joint: bool, seed_arr) -> tuple:
    """``(key, make_problem)`` of op ``sampling_from_probs`` for fp32 ``probs`` and ``count``
    outputs (:func:`flashinfer.dispatch.decide_keyed`'s first two arguments)."""
    features = _present(top_k=top_k, top_p=top_p, min_p=min_p, indices=indices,
                        seed_tensor=seed_arr)
    if joint and top_k is not None and top_p is not None:
        features.append("joint")
    vocab = probs.shape[1]
    shape = _top_k_facts(_shape(count, vocab), features, top_k_arr,
                         top_k if top_k_arr is None else None, vocab)
    return _dispatch_facts("sampling_from_probs", probs.device, "probs", torch.float32, shape,
                           features)


def _fake_samples(probs, indices, *args):
    out = _samples_out(probs.shape[0], indices, probs.device)
    return out, torch.empty(out.shape[0], dtype=torch.bool, device=probs.device)


@custom_op("sampling_from_probs", fake=_fake_samples)
def _sampling_from_probs_op(
        probs: torch.Tensor, indices: Optional[torch.Tensor], top_k_arr: Optional[torch.Tensor],
        top_k_val: Optional[int], top_p_arr: Optional[torch.Tensor], top_p_val: Optional[float],
        min_p_arr: Optional[torch.Tensor], min_p_val: Optional[float], joint: bool,
        deterministic: bool, seed_arr: Optional[torch.Tensor], offset_arr: Optional[torch.Tensor],
        seed_val: int, offset_val: int, use_default: bool, increment: int, backend: str
) -> Tuple[torch.Tensor, torch.Tensor]:
    check_rows("top_p", top_p_arr)
    check_rows("min_p", min_p_arr)
    check_index_rows(indices, probs.shape[0])
    probs = probs.float().contiguous()
    out = _samples_out(probs.shape[0], indices, probs.device)
    count = out.shape[0]
    valid = torch.empty(count, dtype=torch.bool, device=probs.device)
    if count == 0:
        return out, valid
    top_k = top_k_arr if top_k_arr is not None else top_k_val
    top_p = top_p_arr if top_p_arr is not None else top_p_val
    min_p = min_p_arr if min_p_arr is not None else min_p_val
    decision = dispatch.decide_keyed(*_draw_dispatch(probs, count, indices, top_k_arr, top_k,
                                                     top_p, min_p, joint, seed_arr), backend)
    seed, offset = _seed_args(seed_arr, offset_arr, seed_val, offset_val, use_default, increment,
                              probs.device)
    decision.kernel(probs, out, valid, indices, top_k, top_p, min_p, joint, deterministic, seed,
                    offset)
    return out, valid


def _fake_logit_samples(logits, indices, *args):
    return _fake_samples(logits, indices)[0]


@custom_op("sampling_from_logits", fake=_fake_logit_samples)
def _sampling_from_logits_op(
        logits: torch.Tensor, indices: Optional[torch.Tensor], deterministic: bool,
        seed_arr: Optional[torch.Tensor], offset_arr: Optional[torch.Tensor], seed_val: int,
        offset_val: int, use_default: bool, backend: str) -> torch.Tensor:
    check_index_rows(indices, logits.shape[0])
    logits = logits.contiguous()
    out = _samples_out(logits.shape[0], indices, logits.device)
    count = out.shape[0]
    if count == 0:
        return out
    features = _present(indices=indices, seed_tensor=seed_arr)
    decision = _decide("sampling_from_logits", logits.device, "logits", logits.dtype,
                       _shape(count, logits.shape[1]), features, backend)
    seed, offset = _seed_args(seed_arr, offset_arr, seed_val, offset_val, use_default,
                              count * logits.shape[1], logits.device)
    decision.kernel(logits, out, indices, deterministic, seed, offset)
    return out


@custom_op("top_k_top_p_sampling_from_logits", fake=_fake_logit_samples)
def _top_k_top_p_from_logits_op(
        logits: torch.Tensor, indices: Optional[torch.Tensor], top_k_arr: Optional[torch.Tensor],
        top_k_val: int, top_p_arr: Optional[torch.Tensor], top_p_val: float, joint: bool,
        deterministic: bool, seed_arr: Optional[torch.Tensor], offset_arr: Optional[torch.Tensor],
        seed_val: int, offset_val: int, use_default: bool, increment: int, backend: str
) -> torch.Tensor:
    check_rows("top_p", top_p_arr)
    check_index_rows(indices, logits.shape[0])
    logits = logits.contiguous()
    out = _samples_out(logits.shape[0], indices, logits.device)
    count = out.shape[0]
    if count == 0:
        return out
    features = ["top_k", "top_p"] + _present(indices=indices, seed_tensor=seed_arr)
    if joint:
        features.append("joint")
    shape = _top_k_facts(_shape(count, logits.shape[1]), features, top_k_arr, top_k_val,
                         logits.shape[1])
    decision = _decide("top_k_top_p_sampling_from_logits", logits.device, "logits",
                       logits.dtype, shape, features, backend)
    seed, offset = _seed_args(seed_arr, offset_arr, seed_val, offset_val, use_default, increment,
                              logits.device)
    decision.kernel(
        logits, out, indices, top_k_arr if top_k_arr is not None else top_k_val,
        top_p_arr if top_p_arr is not None else top_p_val, joint, deterministic, seed, offset)
    return out


def _fake_like(x, *args):
    return torch.empty_like(x)


@custom_op("renorm_probs", fake=_fake_like)
def _renorm_op(probs: torch.Tensor, top_k_arr: Optional[torch.Tensor], top_k_val: Optional[int],
               top_p_arr: Optional[torch.Tensor], top_p_val: Optional[float], backend: str
               ) -> torch.Tensor:
    check_rows("top_p", top_p_arr)
    probs = probs.contiguous()
    out = torch.empty_like(probs)
    if probs.numel() == 0:
        return out
    top_k = top_k_arr if top_k_arr is not None else top_k_val
    top_p = top_p_arr if top_p_arr is not None else top_p_val
    features = ["top_k"] if top_k is not None else ["top_p"]
    shape = _top_k_facts(_shape(*probs.shape), features, top_k_arr, top_k_val, probs.shape[1])
    _decide("renorm_probs", probs.device, "probs", probs.dtype, shape, features,
            backend).kernel(probs, out, top_k, top_p)
    return out


@custom_op("top_k_mask_logits", fake=_fake_like)
def _mask_op(logits: torch.Tensor, top_k_arr: Optional[torch.Tensor], top_k_val: int,
             backend: str) -> torch.Tensor:
    logits = logits.contiguous()
    out = torch.empty_like(logits)
    if logits.numel() == 0:
        return out
    features: list[str] = []
    shape = _top_k_facts(_shape(*logits.shape), features, top_k_arr, top_k_val, logits.shape[1])
    _decide("top_k_mask_logits", logits.device, "logits", logits.dtype, shape, features,
            backend).kernel(logits, out,
                                             top_k_arr if top_k_arr is not None else top_k_val)
    return out


def _fake_softmax(logits, *args):
    return torch.empty_like(logits, dtype=torch.float32)


@custom_op("softmax", fake=_fake_softmax)
def _softmax_op(logits: torch.Tensor, temperature_arr: Optional[torch.Tensor],
                temperature_val: Optional[float], backend: str) -> torch.Tensor:
    check_rows("temperature", temperature_arr)
    logits = logits.contiguous()
    out = torch.empty_like(logits, dtype=torch.float32)
    if logits.numel() == 0:
        return out
    temperature = temperature_arr if temperature_arr is not None else temperature_val
    features = ["temperature"] if temperature is not None else []
    _decide("softmax", logits.device, "logits", logits.dtype, _shape(*logits.shape), features,
            backend).kernel(logits, out, temperature)
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
    decision = _decide("chain_speculative_sampling", draft_probs.device, "probs", torch.float32,
                       {**_shape(batch, vocab), "num_draft": n},
                       ["seed_tensor"] if seed_arr is not None else [], backend)
    seed, offset = _seed_args(seed_arr, offset_arr, seed_val, offset_val, use_default,
                              batch * (n + 1), draft_probs.device)
    decision.kernel(
        draft_probs.float().contiguous(), draft_token_ids.contiguous(),
        target_probs.float().contiguous(), output, accepted, emitted, deterministic, seed, offset)
    return output


# --------------------------------------------------------------------------------------------
# public API

_Seed = Optional[Union[int, torch.Tensor]]
_ORDERS = ("top_k_first", "joint")


#: eager sampling_from_probs-family calls with scalar (or no) thresholds and no indices,
#: generator or seed that passed every check -> :class:`_CheckedDraw`; the Decision and the
#: default generator's state are read per call
_CHECKED_DRAWS = CheckedCalls()
_SCALARS = (type(None), int, float)


def _draw_signature(probs, indices, top_k, top_p, min_p, generator, check_nan, seed, offset,
                    rest: tuple) -> tuple | None:
    """The memo key of a call :data:`_CHECKED_DRAWS` can serve, else None."""
    if (indices is not None or generator is not None or seed is not None or offset is not None
            or check_nan or type(top_k) not in _SCALARS or type(top_p) not in _SCALARS
            or type(min_p) not in _SCALARS):
        return None
    if not isinstance(probs, torch.Tensor) or torch.compiler.is_compiling():
        return None
    return (tensor_fact(probs), probs.is_contiguous(), type(top_k), top_k, type(top_p), top_p, type(min_p),
            min_p, rest, tuple(map(type, rest)))


class _CheckedDraw:
    """What a sampling_from_probs-family signature that passed every check keeps: the call's
    KeyedDecision, its checked thresholds and flags, the device's default generator (the same
    object for the process's life: ``manual_seed`` reseeds it in place) and, for calls that do
    not return the valid flags, a ``bool [rows]`` buffer they are written into and nobody reads
    (concurrent writers race on unread bytes only)."""

    __slots__ = ("choice", "rows", "top_k", "top_p", "min_p", "joint", "deterministic",
                 "increment", "widen", "device", "generator", "_unread")

    def __init__(self, choice, rows: int, top_k, top_p, min_p, joint: bool, deterministic: bool,
                 increment: int, widen: bool, device: torch.device):
        self.choice, self.rows, self.increment, self.widen = choice, rows, increment, widen
        self.top_k, self.top_p, self.min_p = top_k, top_p, min_p
        self.joint, self.deterministic, self.device = joint, deterministic, device
        self.generator = default_generator(device)
        self._unread: torch.Tensor | None = None

    def draw(self, probs: torch.Tensor, backend: str, return_valid: bool):
        """The memoised call: outputs, the Decision, the generator's seed and offset, the
        kernel (``probs``: the signature holds its dtype and contiguity)."""
        if self.widen:
            probs = probs.float().contiguous()
        out = torch.empty(self.rows, dtype=torch.int32, device=self.device)
        if return_valid:
            valid = torch.empty(self.rows, dtype=torch.bool, device=self.device)
        else:
            valid = self._unread if self._unread is not None else self._unread_valid()
        decision = self.choice.get(backend)
        seed, offset = get_seed_and_offset(self.increment, self.generator)
        decision.kernel(probs, out, valid, None, self.top_k, self.top_p, self.min_p, self.joint,
                        self.deterministic, seed, offset)
        return (out, valid) if return_valid else out

    def _unread_valid(self) -> torch.Tensor:
        buf = torch.empty(self.rows, dtype=torch.bool, device=self.device)
        if not (self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            self._unread = buf  # (made during a capture it lives in the graph's pool: not kept)
        return buf


def _sample_probs(probs, indices, top_k, top_p, min_p, joint, deterministic, generator,
                  check_nan, seed, offset, return_valid, per_row_draws: int, backend):
    rest = (bool(joint), bool(deterministic), per_row_draws, backend)
    signature = _draw_signature(probs, indices, top_k, top_p, min_p, generator, check_nan, seed,
                                offset, rest)
    entry = _CHECKED_DRAWS.get(signature)
    if entry is not None:  # the steady state of a decode step
        return entry.draw(probs, backend, return_valid)
    distribution("probs", probs)
    check_backend(backend)
    rows, device = probs.shape[0], probs.device
    indices = index_map(indices, device)
    count = indices.shape[0] if indices is not None else rows
    k_arr, k_val = top_k_arg(top_k, rows, device) if top_k is not None else (None, None)
    p_arr, p_val = fraction_arg("top_p", top_p, rows, device) if top_p is not None else (None, None)
    m_arr, m_val = fraction_arg("min_p", min_p, rows, device) if min_p is not None else (None, None)
    seeds = resolve_seed(generator, count * per_row_draws, seed_kind(seed, offset, count, device),
                          device)
    check_nan_arg("probs", probs, check_nan)
    out, valid = _sampling_from_probs_op(probs, indices, k_arr, k_val, p_arr, p_val, m_arr, m_val,
                                         bool(joint), bool(deterministic), *seeds,
                                         count * per_row_draws, backend)
    if signature is not None and count:
        choice = dispatch.KeyedDecision(*_draw_dispatch(probs, count, None, None, k_val, p_val,
                                                        m_val, bool(joint), None))
        widen = probs.dtype != torch.float32 or not probs.is_contiguous()
        _CHECKED_DRAWS.put(signature, _CheckedDraw(choice, count, k_val, p_val, m_val, bool(joint),
                                                   bool(deterministic), count * per_row_draws,
                                                   widen, device))
    return (out, valid) if return_valid else out


@flashinfer_api
def softmax(logits: torch.Tensor, temperature: Optional[Union[torch.Tensor, float]] = None,
            enable_pdl: Optional[bool] = None, *, backend: str = "auto") -> torch.Tensor:
    """Row softmax of ``logits / temperature`` in fp32. ``logits`` ``[batch, vocab]``
    fp32/fp16/bf16; ``temperature`` None, a finite float > 0 or a ``[batch]`` float tensor (a
    bad row: ValueError on the CPU, a row of zeros on a GPU). Returns fp32 ``[batch, vocab]``.
    ``enable_pdl`` is accepted and ignored."""
    distribution("logits", logits)
    check_backend(backend)
    t_arr, t_val = temperature_arg(temperature, logits.shape[0], logits.device)
    return _softmax_op(logits, t_arr, t_val, backend)


@flashinfer_api
def sampling_from_logits(logits: torch.Tensor, indices: Optional[torch.Tensor] = None,
                         deterministic: bool = True, generator: Optional[torch.Generator] = None,
                         check_nan: bool = False, seed: _Seed = None, offset: _Seed = None, *,
                         backend: str = "auto") -> torch.Tensor:
    """Sample one token per output from ``softmax(logits)``. ``logits`` ``[rows, vocab]``
    fp32/fp16/bf16; ``indices`` optional ``[batch]`` int32/int64 (output ``i`` reads row
    ``indices[i]``). Returns int32 ``[batch]`` (``indices.dtype`` with indices)."""
    distribution("logits", logits)
    check_backend(backend)
    device = logits.device
    indices = index_map(indices, device)
    count = indices.shape[0] if indices is not None else logits.shape[0]
    seeds = resolve_seed(generator, count * logits.shape[1], seed_kind(seed, offset, count, device),
                          device)
    check_nan_arg("logits", logits, check_nan)
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
    """Top-p (nucleus) sampling; ``top_p`` a float in [0, 1] or a ``[rows]`` tensor (a row
    outside [0, 1] or NaN: ValueError on the CPU, token 0 and ``valid = False`` on a GPU). See
    :func:`sampling_from_probs` for the other arguments and the return value."""
    return _sample_probs(probs, indices, None, top_p, None, False, deterministic, generator,
                         check_nan, seed, offset, return_valid, 32, backend)


@flashinfer_api
def top_k_sampling_from_probs(probs: torch.Tensor, top_k: Union[torch.Tensor, int],
                              indices: Optional[torch.Tensor] = None, deterministic: bool = True,
                              generator: Optional[torch.Generator] = None, check_nan: bool = False,
                              seed: _Seed = None, offset: _Seed = None, return_valid: bool = False,
                              *, backend: str = "auto"):
    """Top-k sampling; ``top_k`` an int or a ``[rows]`` int tensor (any value: ``k <= 0`` or
    ``k >= vocab``, no filter). See :func:`sampling_from_probs`."""
    return _sample_probs(probs, indices, top_k, None, None, False, deterministic, generator,
                         check_nan, seed, offset, return_valid, 32, backend)


@flashinfer_api
def min_p_sampling_from_probs(probs: torch.Tensor, min_p: Union[torch.Tensor, float],
                              indices: Optional[torch.Tensor] = None, deterministic: bool = True,
                              generator: Optional[torch.Generator] = None, check_nan: bool = False,
                              seed: _Seed = None, offset: _Seed = None, return_valid: bool = False,
                              *, backend: str = "auto"):
    """Min-p sampling: keep ``p >= min_p * max(p)``; ``min_p`` a float in [0, 1] or a
    ``[rows]`` tensor (a row outside [0, 1] or NaN: ValueError on the CPU, token 0 and ``valid =
    False`` on a GPU). See :func:`sampling_from_probs`."""
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
    ``"joint"``, module docstring). Thresholds as in :func:`top_k_sampling_from_probs` and
    :func:`top_p_sampling_from_probs`; see :func:`sampling_from_probs`."""
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
    """:func:`top_k_top_p_sampling_from_probs` of ``softmax(logits)`` (no ``return_valid``, as
    upstream). ``logits`` ``[rows, vocab]`` fp32/fp16/bf16; a bad ``top_p`` row: ValueError on
    the CPU, token 0 on a GPU (module docstring). One op: a kernel may read the logits
    directly (the two-pass Triton sampler does for a scalar top-k, top-k first) or run the
    softmax and then the sampler."""
    distribution("logits", logits)
    check_backend(backend)
    joint = _joint(filter_apply_order)
    rows, device = logits.shape[0], logits.device
    indices = index_map(indices, device)
    count = indices.shape[0] if indices is not None else rows
    k_arr, k_val = top_k_arg(top_k, rows, device)
    p_arr, p_val = fraction_arg("top_p", top_p, rows, device)
    seeds = resolve_seed(generator, count * 32, seed_kind(seed, offset, count, device), device)
    check_nan_arg("logits", logits, check_nan)
    return _top_k_top_p_from_logits_op(logits, indices, k_arr, k_val, p_arr, p_val, bool(joint),
                                       bool(deterministic), *seeds, count * 32, backend)


@flashinfer_api
def top_p_renorm_probs(probs: torch.Tensor, top_p: Union[torch.Tensor, float],
                       is_deterministic: bool = False, *, backend: str = "auto") -> torch.Tensor:
    """Zero the probabilities outside the top-p nucleus and renormalise. ``probs``
    ``[rows, vocab]`` fp32/fp16/bf16; returns the same shape and dtype. ``top_p`` a float in
    [0, 1] or a ``[rows]`` tensor (a row outside [0, 1] or NaN: ValueError on the CPU, a row of
    zeros on a GPU, like an invalid probability row). ``is_deterministic`` is accepted; every
    kernel here is deterministic."""
    distribution("probs", probs)
    check_backend(backend)
    p_arr, p_val = fraction_arg("top_p", top_p, probs.shape[0], probs.device)
    return _renorm_op(probs, None, None, p_arr, p_val, backend)


@flashinfer_api
def top_k_renorm_probs(probs: torch.Tensor, top_k: Union[torch.Tensor, int],
                       is_deterministic: bool = False, *, backend: str = "auto") -> torch.Tensor:
    """Zero the probabilities outside the top-k and renormalise (same shape and dtype);
    ``top_k`` any int or a ``[rows]`` int tensor; an invalid probability row gives zeros."""
    distribution("probs", probs)
    check_backend(backend)
    k_arr, k_val = top_k_arg(top_k, probs.shape[0], probs.device)
    return _renorm_op(probs, k_arr, k_val, None, None, backend)


top_p_renorm_prob = top_p_renorm_probs
top_k_renorm_prob = top_k_renorm_probs


@flashinfer_api
def top_k_mask_logits(logits: torch.Tensor, top_k: Union[torch.Tensor, int], *,
                      backend: str = "auto") -> torch.Tensor:
    """Set the logits outside the top-k to ``-inf`` (same shape and dtype); ``top_k`` any int
    or a ``[rows]`` int tensor (``k <= 0`` or ``k >= vocab``: nothing masked)."""
    distribution("logits", logits)
    check_backend(backend)
    k_arr, k_val = top_k_arg(top_k, logits.shape[0], logits.device)
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
    emitted [B])``; the counts are added into the given counter tensors (int32 ``[B]``). A
    draft id outside the vocabulary is rejected; NaN probabilities weigh nothing: the output
    holds only accepted draft ids, a token in ``[0, vocab)`` and -1."""
    distribution("draft_probs", draft_probs, rank=3)
    check_backend(backend)
    batch, n, vocab = draft_probs.shape
    device = draft_probs.device
    distribution("target_probs", target_probs, rank=3)
    if tuple(target_probs.shape) != (batch, n + 1, vocab):
        raise ValueError(f"target_probs must have shape {(batch, n + 1, vocab)} (draft_probs "
                         f"with one more position), got {tuple(target_probs.shape)}")
    if target_probs.device != device:
        raise ValueError(f"target_probs is on {target_probs.device} but draft_probs is on {device}")
    if not isinstance(draft_token_ids, torch.Tensor) or draft_token_ids.dtype not in INDEX_DTYPES:
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
                        vector_arg(name, t, batch, device, (torch.int32,)))
    seeds = resolve_seed(generator, batch * (n + 1), seed_kind(seed, offset, batch, device), device)
    output = _chain_op(draft_probs, draft_token_ids, target_probs, counters[0], counters[1],
                       bool(deterministic), *seeds, backend)
    return output, counters[0], counters[1]
