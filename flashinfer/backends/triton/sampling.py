"""Triton sampling family: launch configuration and the registered kernels.

Kernel signatures and semantics: :mod:`flashinfer.sampling.ops` (the contract in the op module's
docstring). The @triton.jit code lives in modules imported on first use (this module must import
without Triton), one idea each:

* ``_sampling_kernels`` (variant ``default`` of every op): pivot search plus rejection by an
  exponential race, never a sort, a worst-case round count; what the variants below hand on.
* ``_sampling_two_pass_kernels`` (``two_pass`` of sampling_from_probs and of
  top_k_top_p_sampling_from_logits): plain, min-p, a scalar top-k <= Q with top-p, on
  probabilities or logits; the lanes' candidates sorted between two passes.
* ``_nucleus_kernels`` (``nucleus``): top-p alone by lean rejection rounds.
* ``_top_k_two_pass_kernels`` (``two_pass`` of renorm_probs / top_k_mask_logits): top-k.
* ``_top_p_bracket_kernels`` (``bracket`` of renorm_probs): top-p, opt-in until measured.
* ``_logits_draw_kernels`` (``one_pass`` of sampling_from_logits), ``_chain_draw_kernels``
  (chain_speculative_sampling); the streaming softmax: ``softmax.py``.
* ``_stream_kernels``: their shared @triton.jit helpers.

A call is one launch with one program per output row (two where a variant hands on to the
softmax then a sampler, or the softmax splits rows), no host synchronisation, and only
stream-ordered allocations (scratch rows), so each call can be captured in a CUDA graph:
``seed`` / ``offset`` tensors ([1] or [B], int64) are read on the device. A row is read in
blocks of ``4 * Q`` elements (``Q`` lanes); ``_launch_shape`` picks Q and the warps.
"""

from __future__ import annotations


import torch

from ...reasons import Reason
from .launch import device_of, fast, pow2
from .softmax import softmax_args, softmax_streaming

#: (lanes per chunk quarter, warps): a chunk is 4 * Q elements (Q shrinks for small
#: vocabularies). The kernels are latency-bound (a pass over a row is a serial loop of chunks),
#: so wide chunks and many warps win at every batch: ``benchmarks/tune_sampling.py`` on the H200
#: (benchmarks/results/tune_sampling_h200_2026-11-30.json, vocabulary 128k) found (512, 16) the
#: fastest of 9 shapes at batch 1, 16 and 256 for plain, top-k-then-top-p and masking (2.0-2.2x
#: the earlier (128, 4) at batch 256).
LAUNCH_SHAPE = (512, 16)
#: pivots per round: the pending candidate, 3 sample pairs, the bracket's bit-space midpoint.
NP = 8
#: round budget of the pivot search (worst case 65 rounds, see _sampling_kernels.py).
MAX_ROUNDS = 66
#: lanes compared at a time when ranking the per-lane bracket samples.
RANK_CHUNK = 32
#: elements per loop step of the softmax kernel
SOFTMAX_BLOCK = 4096
#: Philox4x32 rounds (7 pass BigCrush, Salmon et al. 2011; Triton's default is 10).
PHILOX_ROUNDS = 7
#: tokens of one block position read at a time by the two-pass sampler's draw (a 128k row in
#: blocks of 2,048 gives 63 per position)
TWO_PASS_COLUMN = 64
#: the two-pass sampler's candidate groups for top-k <= 64: tau is at least the smallest of 64
#: group maxima, and about 64 ln 64 = 266 candidates lie at or above it in a shuffled row
TWO_PASS_GROUPS = 64
#: compacted candidate slots per group (more than fit send the row down the exact path)
TWO_PASS_SLOTS_PER_GROUP = 16


#: rounds of the nucleus sampler (its bracket halves each rejected round: at most ~34 needed)
NUCLEUS_MAX_ROUNDS = 40


def two_pass_groups(k: int, block: int, vocab: int) -> tuple[int, int]:
    """``(G, CAP)`` of the two-pass sampler for top-k ``k`` and a block of ``block`` (``4 k <=
    block``, ``k < vocab``): ``k <= G <= block`` groups, ``CAP`` compacted candidate slots per row
    (no more than the block's candidates or the row's tokens)."""
    g = min(max(TWO_PASS_GROUPS, pow2(k)), block)
    return g, min(TWO_PASS_SLOTS_PER_GROUP * g, 4 * block, pow2(vocab))



def _launch_shape(vocab: int, n_rows: int) -> tuple[int, int]:
    """``(Q, num_warps)`` for ``n_rows`` programs over rows of ``vocab`` elements (one shape
    serves every batch size on the H200, see ``LAUNCH_SHAPE``)."""
    q, warps = LAUNCH_SHAPE
    return max(16, min(q, pow2(-(-vocab // 4)))), warps



def _int64(v: int) -> int:
    """A Python int as the int64 with the same low 64 bits (seeds may use the full 64 bits)."""
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def _rng(value, dummy: torch.Tensor):
    """``(pointer, scalar, stride, is_tensor)`` for a seed or offset given as int or tensor."""
    if isinstance(value, torch.Tensor):
        return value, 0, (0 if value.numel() == 1 else 1), True
    return dummy, _int64(int(value)), 0, False


def _threshold(value, dummy: torch.Tensor, cast):
    """``(pointer, scalar, present, is_tensor)`` for a None / scalar / per-row tensor threshold."""
    if value is None:
        return dummy, cast(0), False, False
    if isinstance(value, torch.Tensor):
        return value, cast(0), True, True
    return dummy, cast(value), True, False


def sampling_from_probs(probs, out, valid, indices, top_k, top_p, min_p, joint, deterministic,
                        seed, offset, passes: torch.Tensor | None = None) -> None:
    """``passes`` (int32 ``[len(out)]``, tests only): the number of passes over each row."""
    from . import _sampling_kernels as K

    n_out = out.numel()
    if n_out == 0:
        return
    probs = probs.contiguous()
    n_rows, vocab = probs.shape
    k_ptr, k_val, has_k, k_t = _threshold(top_k, out, int)
    p_ptr, p_val, has_p, p_t = _threshold(top_p, out, float)
    mp_ptr, mp_val, has_mp, mp_t = _threshold(min_p, out, float)
    s_ptr, s_val, s_stride, s_t = _rng(seed, out)
    o_ptr, o_val, o_stride, o_t = _rng(offset, out)
    idx = indices if indices is not None else out
    q, warps = _launch_shape(vocab, n_out)
    with device_of(probs):
        fast(K.sample_probs_kernel)[(n_out,)](
            probs, out, valid, idx, k_ptr, p_ptr, mp_ptr, k_val, p_val, mp_val,
            s_ptr, o_ptr, s_val, o_val, s_stride, o_stride,
            n_rows, vocab, probs.stride(0), out if passes is None else passes,
            COUNT_PASSES=passes is not None, HAS_IDX=indices is not None, K_T=k_t, P_T=p_t,
            MP_T=mp_t, HAS_K=has_k, HAS_P=has_p, HAS_MP=has_mp, FILTER=has_k or has_p or has_mp,
            JOINT=int(bool(joint)), SEED_T=s_t, OFF_T=o_t,
            NP=NP, CH=min(RANK_CHUNK, q), Q=q, MAX_ROUNDS=MAX_ROUNDS,
            PHILOX_ROUNDS=PHILOX_ROUNDS, num_warps=warps,
        )


def _desc(v) -> str:
    return "a per-row tensor" if isinstance(v, torch.Tensor) else repr(v)


def _refuse(variant: str, check: str, serves: str, **given) -> None:
    """A variant called directly outside its check (the dispatcher never does this): an error,
    never a silent hand-off to another kernel."""
    args = ", ".join(f"{k}={_desc(v)}" for k, v in given.items())
    raise ValueError(f"triton:{variant} was called with {args}; it serves {serves} only: its "
                     f"check ({check}) rejects the rest")


def _two_pass_mode(top_k, top_p, min_p, q: int, vocab: int) -> int | None:
    """The two-pass sampler's MODE for these thresholds (0 plain, 1 min-p, 2 a scalar top-k of at
    most ``q`` with or without top-p), or None when it does not serve them."""
    if top_k is None:
        if top_p is not None:
            return None
        return 0 if min_p is None else 1
    if isinstance(top_k, torch.Tensor) or min_p is not None:
        return None
    return 2 if 1 <= int(top_k) <= q and int(top_k) < vocab else None


def sampling_from_probs_two_pass(probs, out, valid, indices, top_k, top_p, min_p, joint,
                                 deterministic, seed, offset) -> None:
    """Plain sampling (one pass per row), min-p, or a scalar top-k with ``1 <= k <= Q`` and any
    top-p (two light passes per row; ``_sampling_two_pass_kernels``): exactly what
    :func:`two_pass_reasons` admits."""
    n_out = out.numel()
    if n_out == 0:
        return
    vocab = probs.shape[1]
    mode = _two_pass_mode(top_k, top_p, min_p, _launch_shape(vocab, n_out)[0], vocab)
    if mode is None:
        _refuse("two_pass", "two_pass_reasons", "plain sampling, min_p alone, or a scalar "
                "1 <= top_k <= Q below the vocabulary (with or without top_p)", top_k=top_k,
                top_p=top_p, min_p=min_p)
    _launch_two_pass(probs, out, valid, indices, mode, top_k, top_p, min_p, joint, seed, offset,
                     False)


def _launch_two_pass(src, out, valid, indices, mode: int, top_k, top_p, min_p, joint, seed,
                     offset, logits: bool) -> None:
    """One program per output row of ``_sampling_two_pass_kernels.two_pass_sample_kernel`` in
    ``mode`` (``_two_pass_mode``); ``src`` holds probabilities, or logits (``logits``: mode 2,
    top-k first only)."""
    from . import _sampling_two_pass_kernels as K2

    src = src.contiguous()
    n_out, vocab = out.numel(), src.shape[1]
    q, warps = _launch_shape(vocab, n_out)
    p_ptr, p_val, has_p, p_t = _threshold(top_p, out, float)
    mp_ptr, mp_val, _, mp_t = _threshold(min_p, out, float)
    s_ptr, s_val, s_stride, s_t = _rng(seed, out)
    o_ptr, o_val, o_stride, o_t = _rng(offset, out)
    k = int(top_k) if mode == 2 else 1
    groups, cap = two_pass_groups(k, 4 * q, vocab) if mode == 2 else (16, 16)
    scratch = torch.empty(n_out if mode == 2 else 1, cap, dtype=torch.float32, device=src.device)
    with device_of(src):
        fast(K2.two_pass_sample_kernel)[(n_out,)](
            src, out, valid, indices if indices is not None else out, p_ptr, mp_ptr, k, p_val,
            mp_val, s_ptr, o_ptr, s_val, o_val, s_stride, o_stride, src.shape[0], vocab,
            src.stride(0), scratch, MODE=mode, HAS_IDX=indices is not None, HAS_P=has_p,
            P_T=p_t, MP_T=mp_t, JOINT=int(bool(joint)), LOGITS=logits, SEED_T=s_t, OFF_T=o_t,
            BLOCK=4 * q, G=groups, CAP=cap, COL=TWO_PASS_COLUMN, PHILOX_ROUNDS=PHILOX_ROUNDS,
            num_warps=warps,
        )


def _softmax_then(sampler, logits, out, indices, top_k, top_p, joint, deterministic, seed,
                  offset) -> None:
    probs = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    softmax_streaming(logits, probs, None)
    valid = torch.empty(out.shape, dtype=torch.bool, device=out.device)
    sampler(probs, out, valid, indices, top_k, top_p, None, joint, deterministic, seed, offset)


def top_k_top_p_sampling_from_logits(logits, out, indices, top_k, top_p, joint, deterministic,
                                     seed, offset) -> None:
    """The streaming softmax, then the general sampler (any top-k, top-p, joint)."""
    _softmax_then(sampling_from_probs, logits, out, indices, top_k, top_p, joint, deterministic,
                  seed, offset)


def top_k_top_p_sampling_from_logits_softmax_two_pass(logits, out, indices, top_k, top_p, joint,
                                                      deterministic, seed, offset) -> None:
    """The streaming softmax, then the two-pass sampler (a scalar ``1 <= k <= Q``, top-k first
    or joint: what :func:`two_pass_reasons` admits)."""
    _softmax_then(sampling_from_probs_two_pass, logits, out, indices, top_k, top_p, joint,
                  deterministic, seed, offset)


def top_k_top_p_sampling_from_logits_two_pass(logits, out, indices, top_k, top_p, joint,
                                              deterministic, seed, offset) -> None:
    """Top-k first with a scalar ``1 <= k <= Q``: the two-pass sampler on the logits themselves
    (weights ``exp(x - max)``; two reads of the row, no softmax written): what
    :func:`logits_two_pass_reasons` admits."""
    n_out = out.numel()
    if n_out == 0:
        return
    if joint or _two_pass_mode(top_k, top_p, None, _launch_shape(logits.shape[1], n_out)[0],
                               logits.shape[1]) != 2:
        _refuse("two_pass", "logits_two_pass_reasons", "a scalar 1 <= top_k <= Q below the "
                "vocabulary, top-k first", top_k=top_k, top_p=top_p, joint=joint)
    valid = torch.empty(out.shape, dtype=torch.bool, device=out.device)
    _launch_two_pass(logits, out, valid, indices, 2, top_k, top_p, None, False, seed, offset, True)


def logits_two_pass_reasons(problem) -> list[Reason]:
    """A scalar top-k of at most Q (top-k first: the record's features rule out joint and a
    per-row top-k)."""
    return _small_top_k_reasons(problem)


def sampling_from_probs_nucleus(probs, out, valid, indices, top_k, top_p, min_p, joint,
                                deterministic, seed, offset) -> None:
    """Top-p alone (scalar or per row): rejection rounds of one lean pass each
    (``_nucleus_kernels``): what :func:`nucleus_reasons` and the record's features admit."""
    if top_p is None or top_k is not None or min_p is not None:
        _refuse("nucleus", "nucleus_reasons", "top_p alone", top_k=top_k, top_p=top_p,
                min_p=min_p)
    n_out = out.numel()
    if n_out == 0:
        return
    from . import _nucleus_kernels as KN

    probs = probs.contiguous()
    vocab = probs.shape[1]
    q, warps = _launch_shape(vocab, n_out)
    p_ptr, p_val, _, p_t = _threshold(top_p, out, float)
    s_ptr, s_val, s_stride, s_t = _rng(seed, out)
    o_ptr, o_val, o_stride, o_t = _rng(offset, out)
    with device_of(probs):
        fast(KN.nucleus_sample_kernel)[(n_out,)](
            probs, out, valid, indices if indices is not None else out, p_ptr, p_val, s_ptr,
            o_ptr, s_val, o_val, s_stride, o_stride, probs.shape[0], vocab, probs.stride(0),
            HAS_IDX=indices is not None, P_T=p_t, SEED_T=s_t, OFF_T=o_t, BLOCK=4 * q,
            COL=TWO_PASS_COLUMN, MAX_ROUNDS=NUCLEUS_MAX_ROUNDS, PHILOX_ROUNDS=PHILOX_ROUNDS,
            num_warps=warps)


def nucleus_reasons(problem) -> list[Reason]:
    """Top-p alone; the record's features rule out top-k and min-p."""
    if "top_p" not in problem.features:
        return [Reason("feature", "no top_p", "top_p", "the nucleus sampler serves top-p only")]
    return []


def _small_top_k_reasons(problem) -> list[Reason]:
    """Why a scalar top-k (shape fact ``top_k``, bucketed) is too large for the candidates of
    the two-pass kernels: above the lanes Q, or not below the vocabulary."""
    shape = dict(problem.shape)
    k, vocab = shape.get("top_k"), shape["vocab_size"]
    q = _launch_shape(vocab, 1)[0]
    if k == 0:
        return [Reason("shape.top_k", 0, f"1 <= top_k <= {q}",
                       "this top_k filters nothing (k <= 0 or k >= the vocabulary); the two-pass "
                       "kernels serve a real top-k only")]
    if k is not None and (k > q or k >= vocab):
        return [Reason("shape.top_k", k, f"<= {q} and < vocab_size {vocab}",
                       f"top_k {k} (bucketed) exceeds the {q} lanes of the two-pass kernels "
                       f"(each holds four candidates) or the vocabulary")]
    return []


def two_pass_reasons(problem) -> list[Reason]:
    """The two-pass sampler serves plain sampling, min-p alone, and a scalar top-k of at most Q
    (below the vocabulary) with or without top-p; the record's features rule out a per-row
    top-k."""
    feats = problem.features
    if "top_k" not in feats:
        if "top_p" in feats:
            return [Reason("feature", "top_p", "top_p only with a top_k",
                           "the two-pass sampler serves top-p only after a top-k")]
        return []
    if "min_p" in feats:
        return [Reason("feature", "min_p", "min_p only alone",
                       "the two-pass sampler serves min-p only without top-k and top-p")]
    return _small_top_k_reasons(problem)


def sampling_from_logits(logits, out, indices, deterministic, seed, offset) -> None:
    from . import _sampling_kernels as K

    n_out = out.numel()
    if n_out == 0:
        return
    logits = logits.contiguous()
    n_rows, vocab = logits.shape
    s_ptr, s_val, s_stride, s_t = _rng(seed, out)
    o_ptr, o_val, o_stride, o_t = _rng(offset, out)
    idx = indices if indices is not None else out
    q, warps = _launch_shape(vocab, n_out)
    with device_of(logits):
        fast(K.logits_sample_kernel)[(n_out,)](
            logits, out, idx, s_ptr, o_ptr, s_val, o_val, s_stride, o_stride,
            n_rows, vocab, logits.stride(0),
            HAS_IDX=indices is not None, SEED_T=s_t, OFF_T=o_t, Q=q,
            PHILOX_ROUNDS=PHILOX_ROUNDS, num_warps=warps,
        )


def sampling_from_logits_one_pass(logits, out, indices, deterministic, seed, offset) -> None:
    """One read of each row, one exponential per element (``_logits_draw_kernels``)."""
    n_out = out.numel()
    if n_out == 0:
        return
    from . import _logits_draw_kernels as KL

    logits = logits.contiguous()
    n_rows, vocab = logits.shape
    s_ptr, s_val, s_stride, s_t = _rng(seed, out)
    o_ptr, o_val, o_stride, o_t = _rng(offset, out)
    q, warps = _launch_shape(vocab, n_out)
    with device_of(logits):
        fast(KL.logits_draw_kernel)[(n_out,)](
            logits, out, indices if indices is not None else out, s_ptr, o_ptr, s_val, o_val,
            s_stride, o_stride, n_rows, vocab, logits.stride(0), HAS_IDX=indices is not None,
            SEED_T=s_t, OFF_T=o_t, BLOCK=4 * q, COL=TWO_PASS_COLUMN,
            PHILOX_ROUNDS=PHILOX_ROUNDS, num_warps=warps)


def _threshold_launch(src, out, top_k, top_p, is_logits: bool) -> None:
    from . import _sampling_kernels as K

    src = src.contiguous()
    n_rows, vocab = src.shape
    if n_rows == 0:
        return
    dst = out if out.is_contiguous() else torch.empty_like(src)
    k_ptr, k_val, has_k, k_t = _threshold(top_k, src, int)
    p_ptr, p_val, _, p_t = _threshold(top_p, src, float)
    q, warps = _launch_shape(vocab, n_rows)
    with device_of(src):
        fast(K.threshold_kernel)[(n_rows,)](
            src, dst, k_ptr, p_ptr, k_val, p_val, vocab, src.stride(0), dst.stride(0),
            IS_LOGITS=is_logits, NEG=float("-inf") if is_logits else 0.0, HAS_K=has_k,
            K_T=k_t, P_T=p_t, NP=NP, CH=min(RANK_CHUNK, q), Q=q, MAX_ROUNDS=MAX_ROUNDS,
            PHILOX_ROUNDS=PHILOX_ROUNDS, num_warps=warps,
        )
    if dst is not out:
        out.copy_(dst)


def renorm_probs(probs, out, top_k, top_p) -> None:
    _threshold_launch(probs, out, top_k, None if top_k is not None else top_p, False)


def _top_k_two_pass(kernel: str, src, out, top_k) -> None:
    """Launch ``_top_k_two_pass_kernels.<kernel>`` for a scalar ``1 <= k <= Q`` below the
    vocabulary (what :func:`top_k_two_pass_reasons` admits): the lanes' candidates, two reads
    and a write of each row."""
    n_rows, vocab = src.shape
    q, warps = _launch_shape(vocab, max(n_rows, 1))
    if _two_pass_mode(top_k, None, None, q, vocab) != 2:
        _refuse("two_pass", "top_k_two_pass_reasons",
                "a scalar 1 <= top_k <= Q below the vocabulary", top_k=top_k)
    if n_rows == 0:
        return
    from . import _top_k_two_pass_kernels as KT

    src = src.contiguous()
    dst = out if out.is_contiguous() else torch.empty(out.shape, dtype=out.dtype, device=out.device)
    groups, cap = two_pass_groups(int(top_k), 4 * q, vocab)
    scratch = torch.empty(n_rows, cap, dtype=torch.float32, device=src.device)
    with device_of(src):
        getattr(KT, kernel)[(n_rows,)](
            src, dst, scratch, int(top_k), vocab, src.stride(0), dst.stride(0),
            BLOCK=4 * q, G=groups, CAP=cap, num_warps=warps)
    if dst is not out:
        out.copy_(dst)


def renorm_probs_two_pass(probs, out, top_k, top_p) -> None:
    """Top-k renormalisation by candidates (``_top_k_two_pass``; the record serves top-k only)."""
    if top_p is not None:
        _refuse("two_pass", "the record's features", "top_k", top_k=top_k, top_p=top_p)
    _top_k_two_pass("top_k_renorm_kernel", probs, out, top_k)


#: compacted slots per row of the top-p bracket kernel, and its most pivot passes (enough to
#: narrow any fp32 bracket to one value: each pass keeps a fifth of it)
TOP_P_BRACKET_SLOTS, TOP_P_MAX_PIVOT_PASSES = 1024, 16


def renorm_probs_bracket(probs, out, top_k, top_p) -> None:
    """Top-p renormalisation by a shrinking bracket and a sort (``_top_p_bracket_kernels``; the
    record serves top-p only)."""
    if top_k is not None or top_p is None:
        _refuse("bracket", "the record's features", "top_p", top_k=top_k, top_p=top_p)
    n_rows, vocab = probs.shape
    if n_rows == 0:
        return
    from . import _top_p_bracket_kernels as KB

    probs = probs.contiguous()
    dst = out if out.is_contiguous() else torch.empty(out.shape, dtype=out.dtype, device=out.device)
    p_ptr, p_val, _, p_t = _threshold(top_p, probs, float)
    q, warps = _launch_shape(vocab, n_rows)
    cap = min(TOP_P_BRACKET_SLOTS, pow2(vocab))
    scratch = torch.empty(n_rows, cap, dtype=torch.float32, device=probs.device)
    with device_of(probs):
        fast(KB.top_p_renorm_kernel)[(n_rows,)](
            probs, dst, scratch, p_ptr, p_val, vocab, probs.stride(0), dst.stride(0), P_T=p_t,
            BLOCK=4 * q, CAP=cap, MAX_PIVOT_PASSES=TOP_P_MAX_PIVOT_PASSES, num_warps=warps)
    if dst is not out:
        out.copy_(dst)


def top_k_mask_logits_two_pass(logits, out, top_k) -> None:
    """Top-k logit masking by candidates (``_top_k_two_pass``)."""
    _top_k_two_pass("top_k_mask_kernel", logits, out, top_k)


def top_k_two_pass_reasons(problem) -> list[Reason]:
    """A scalar top-k of at most Q; the records' features rule out top-p and a per-row top-k."""
    return _small_top_k_reasons(problem)


def top_k_mask_logits(logits, out, top_k) -> None:
    _threshold_launch(logits, out, top_k, None, True)


def softmax(logits, out, temperature) -> None:
    from . import _sampling_kernels as K

    logits = logits.contiguous()
    n_rows, vocab = logits.shape
    if n_rows == 0:
        return
    dst, t_ptr, t_val, t_t = softmax_args(out, temperature)
    # a streaming kernel: wide chunks keep enough loads in flight (512-element chunks with 4
    # warps read 256 x 128k at 0.46 TB/s on the H200); two fp32 accumulators per element
    block = max(16, min(SOFTMAX_BLOCK, pow2(vocab)))
    with device_of(logits):
        fast(K.softmax_kernel)[(n_rows,)](
            logits, dst, t_ptr, t_val, vocab, logits.stride(0), dst.stride(0),
            T_T=t_t, BLOCK=block, num_warps=8 if block >= 2048 else 4,
        )
    if dst is not out:
        out.copy_(dst)


def chain_speculative_sampling(draft_probs, draft_token_ids, target_probs, output, accepted,
                               emitted, deterministic, seed, offset) -> None:
    """One program per request (``_chain_draw_kernels``): the accept tests, then the
    replacement token by one inverse-CDF draw over the residual row."""
    from . import _chain_draw_kernels as KC

    batch, n_draft, vocab = draft_probs.shape
    if batch == 0:
        return
    s_ptr, s_val, s_stride, s_t = _rng(seed, output)
    o_ptr, o_val, o_stride, o_t = _rng(offset, output)
    q, warps = _launch_shape(vocab, batch)
    with device_of(target_probs):
        fast(KC.chain_one_pass_kernel)[(batch,)](
            draft_probs.contiguous(), draft_token_ids.contiguous(), target_probs.contiguous(),
            output, accepted, emitted, s_ptr, o_ptr, s_val, o_val, s_stride, o_stride,
            n_draft, vocab, SEED_T=s_t, OFF_T=o_t, NPAD=pow2(n_draft + 1), BLOCK=4 * q,
            COL=TWO_PASS_COLUMN, PHILOX_ROUNDS=PHILOX_ROUNDS, num_warps=warps,
        )
