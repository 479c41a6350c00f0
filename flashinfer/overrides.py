"""Backend overrides: spellings, the ``use_backend`` context manager, and precedence.

Precedence, highest first: ``backend=`` argument > ``flashinfer.use_backend(...)`` (innermost
wins, context-local, restored on exit) > ``FLASHINFER_<FAMILY>_BACKEND`` > ``FLASHINFER_BACKEND``
> tuned rules > default rules. ``"auto"`` at any level means "no opinion here", so the next
level decides (upstream's default ``backend="auto"`` therefore never hides an environment
override).

Scope: an argument or a per-family override is strict: if the named backend cannot run the
problem, the call raises with its reasons. Except upstream's names of its own kernels passed as
a ``backend=`` argument (``fa2``, ``fa3``, ``cudnn``, ``cutlass``, ``cublas``, ``trtllm-gen``,
...: :data:`flashinfer.backend_names.UPSTREAM_KERNEL_NAMES`): upstream code passes them where
upstream's kernel runs anything, so they prefer the kernels they map to and, when none of those
can run the problem, let the next level or the rules choose; the Decision notes what was asked,
what ran and why. ``FLASHINFER_STRICT=1`` makes them strict too. A global override (``FLASHINFER_BACKEND=cudnn`` or
``use_backend("cudnn")``) only applies to ops that backend has a capability record for; for
other ops it is skipped and recorded, so forcing cuDNN for attention does not break RMSNorm.

Spellings (:mod:`flashinfer.backend_names`): one canonical name per backend plus
upstream FlashInfer's names as aliases. An alias may stand for several kernels; the override
then allows any of them, in the dispatch rules' order:

========================  ============================================================
spelling                  allowed kernels
========================  ============================================================
``auto``                  no override
``fa2``                   ``flash_attn:fa2``, ``flash_attn:fa2_block_table`` and torch's
                          built-in FlashAttention-2 (``torch:flash_varlen``) — upstream's
                          "fa2" is its own FA2-style kernel, which this library does not
                          ship; these are the FA2 kernels that exist here
``fa3``                   ``flash_attn:fa3`` (FA3 package or the ``fa3_fwd`` wheel)
``cublas``, ``sdpa``      ``torch``
``trtllm-gen``, ``xqa``   ``trtllm``
``cute-dsl``              ``cutlass``
``pytorch``, ``ref``      ``reference``
========================  ============================================================
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Iterator

from . import envs
from .backend_names import names_upstream_kernel, resolve_spelling
from .op_catalog import FAMILIES

@dataclass(frozen=True)
class Override:
    """One override level: what it allows, how it was spelled, where it came from."""

    allowed: tuple[str, ...]  # "backend" or "backend:variant" specs
    spelling: str
    source: str  # "argument" | "context" | "environment"
    scope: str  # "op" (strict) | "global" (skipped for ops the backend has no record for)
    origin: str  # human-readable: "backend= argument", "FLASHINFER_NORM_BACKEND", ...
    preference: bool = False  # an upstream kernel name as backend=: falls through when unusable

    def allows(self, backend: str, variant: str) -> bool:
        return any(spec == backend or spec == f"{backend}:{variant}" for spec in self.allowed)

    def backends(self) -> frozenset[str]:
        return frozenset(spec.split(":", 1)[0] for spec in self.allowed)


_CONTEXT: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar(
    "flashinfer_backend_overrides", default={})


@contextlib.contextmanager
def use_backend(default: str | None = None, **per_family: str) -> Iterator[None]:
    """Force backends inside a ``with`` block.

    ``use_backend("cudnn")`` applies to every op cuDNN serves; ``use_backend(norm="triton",
    attention="torch")`` per op family (families: attention, norm, rope, activation, gemm, moe,
    sampling, comm). Context-local (threads and asyncio tasks each see their own), nests (the
    innermost wins per family), and is restored on exit even when the block raises.
    """
    for family in per_family:
        if family not in FAMILIES:
            raise ValueError(f"use_backend: unknown op family {family!r}; valid: {', '.join(FAMILIES)}")
    updates = {"*": default} if default is not None else {}
    updates.update(per_family)
    for key, spelling in updates.items():
        resolve_spelling(spelling, what=f"use_backend({key})")
    token = _CONTEXT.set({**_CONTEXT.get(), **updates})
    try:
        yield
    finally:
        _CONTEXT.reset(token)


#: the active overrides' dict itself (a new dict per ``use_backend`` block, never mutated, so
#: its identity tells whether the overrides changed): the hot path's cheap comparison
current_context = _CONTEXT.get


def context_key() -> tuple:
    """A hashable snapshot of the active ``use_backend`` overrides (``()`` outside any)."""
    context = _CONTEXT.get()
    return tuple(context.items()) if context else ()


def collect(family: str, argument: str | None) -> tuple[Override, ...]:
    """All override levels that have an opinion for ``family``, highest precedence first."""
    levels: list[Override] = []

    def add(spelling: str | None, source: str, scope: str, origin: str) -> None:
        if spelling is None:
            return
        allowed = resolve_spelling(spelling, what=origin)
        if allowed is not None:
            preference = source == "argument" and names_upstream_kernel(spelling)
            levels.append(Override(allowed, spelling, source, scope, origin, preference))

    add(argument, "argument", "op", "backend")
    context = _CONTEXT.get()
    if context:
        add(context.get(family), "context", "op", f"use_backend({family}=...)")
        add(context.get("*"), "context", "global", "use_backend(...)")
    add(envs.family_backend(family).get(), "environment", "op", envs.family_backend(family).name)
    add(envs.BACKEND.get(), "environment", "global", envs.BACKEND.name)
    return tuple(levels)
