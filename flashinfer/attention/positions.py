"""``pos_encoding_mode="ROPE_LLAMA"`` on kernels that do not apply RoPE themselves.

Upstream rotates q and k inside its attention kernels (rotate-half over the whole head dim, query
row ``r`` of a request at position ``kv_len - qo_len + r``, key ``j`` at ``j``; the rotated values
are stored in the input dtype before the products). Here only the reference applies it inside
its kernel. When the dispatcher's choice for the same call *without* positional encoding is
another kernel, the family rotates copies of q and k with the ``rope`` op (dispatched itself:
the Triton kernel on a GPU, in float32, stored in the input dtype as upstream does) and runs that
kernel on them with ``pos_encoding_mode="NONE"``. So a ROPE_LLAMA call runs at the speed of
the plain call plus one rotation of q and of the keys it reads; on a CPU (where the plain
choice is the reference) the reference rotates in float32 inside the kernel, the oracle the
tests compare the rotated path with.

ALiBi needs a bias inside the softmax: kernels that declare the ``alibi`` feature apply it,
else the reference does (no rotation-like rewrite exists).
"""

from __future__ import annotations

import torch

from .. import dispatch
from ..rope_params import RopeParams


def rope_kernel(device: torch.device, dtype: torch.dtype, rows: int, heads: int, head_dim: int,
                pos_dtype: torch.dtype = torch.int64):
    """The ``rope`` kernel that rotates ``[rows, heads, head_dim]`` rows of ``dtype`` (a
    keyed Decision lookup: a batch plan asks once and keeps it, so run() decides nothing)."""
    bucket = dispatch.length_bucket(rows)

    def problem() -> dispatch.Problem:
        return dispatch.Problem.make(
            "rope", device, dtypes={"input": dtype, "pos": pos_dtype},
            shape={"head_dim": head_dim, "rotary_dim": head_dim, "num_q_heads": heads,
                   "num_k_heads": 0, "num_tokens": bucket})

    key = ("rope", device, dtype, pos_dtype, head_dim, heads, bucket)
    return dispatch.decide_keyed(key, problem).kernel


def rotate(x: torch.Tensor, positions: torch.Tensor, rope_scale: float, rope_theta: float,
           kernel=None) -> torch.Tensor:
    """A RoPE-rotated copy of ``x [n, heads, head_dim]`` (rotate-half over the whole head dim,
    ``head_dim`` even) at ``positions [n]`` (int32/int64 on ``x``'s device), in ``x``'s dtype.
    ``kernel``: a :func:`rope_kernel` kept by the caller (else looked up here)."""
    if kernel is None:
        kernel = rope_kernel(x.device, x.dtype, x.shape[0], x.shape[1], x.shape[2],
                             positions.dtype)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    params = RopeParams(x.shape[2], False, rope_scale, rope_theta)
    # the rope kernels rotate a q and a k of one token count: k is an empty head slice here
    kernel(x, x[:, :0], out, out[:, :0], positions, params, None)
    return out


def runs_rotated(decision: dispatch.Decision) -> bool:
    """Whether the plain call's kernel ``decision`` is worth rotated copies: every kernel but
    the reference (which rotates inside, without the copies)."""
    return decision.backend != "reference"


def choose(with_rope: tuple, plain: tuple, backend) -> tuple[dispatch.Decision, bool]:
    """``(decision, rotate_first)`` for a ROPE_LLAMA call. ``with_rope`` / ``plain``: the
    ``(key, make_problem)`` of :func:`~flashinfer.dispatch.decide_keyed` for the call with and
    without positional encoding. A kernel other than the reference that applies RoPE itself
    wins; else a kernel other than the reference for the plain call, on rotated inputs; else
    the reference, rotating inside. Raises what deciding the call with RoPE raises when neither
    can run (e.g. an override naming a kernel that serves neither). The caller records the
    chosen Decision once more when its kernel runs (:func:`flashinfer.dispatch.record`), so a
    ``record_decisions()`` block ends with the kernel that ran."""
    try:
        native = dispatch.decide_keyed(*with_rope, backend)
        if native.backend != "reference":
            return native, False
    except dispatch.NoBackendError:  # also strict mode on a GPU: only the reference rotates inside
        native = None
    try:
        rotated = dispatch.decide_keyed(*plain, backend)
        if runs_rotated(rotated):
            return rotated, True
    except dispatch.NoBackendError:
        if native is None:
            raise
    if native is None:
        native = dispatch.decide_keyed(*with_rope, backend)  # raises why
    return native, False


__all__ = ["choose", "rope_kernel", "rotate", "runs_rotated"]
