"""Registering public ops as ``torch.library`` custom ops, at no cost in eager mode.

``@custom_op("rmsnorm", mutates_args=(), fake=...)`` registers the decorated function as
``torch.ops.flashinfer.rmsnorm`` with a fake (meta) implementation, so ``torch.compile
(fullgraph=True)`` traces a call as one opaque node. In eager mode the returned callable calls the
function directly: the custom-op dispatcher costs tens of microseconds a call, too much for a
norm on the decode path. The function must carry full type annotations (torch.library needs
them) and may not return a tensor that aliases an input (return ``None`` for in-place ops).
"""

from __future__ import annotations

import functools
from typing import Callable, Iterable

import torch


def custom_op(name: str, *, mutates_args: Iterable[str] = (), fake: Callable | None = None):
    def wrap(fn: Callable) -> Callable:
        op = torch.library.custom_op(f"flashinfer::{name}", mutates_args=tuple(mutates_args))(fn)
        if fake is not None:
            op.register_fake(fake)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if torch.compiler.is_compiling():
                return op(*args, **kwargs)
            return fn(*args, **kwargs)

        call.custom_op = op
        return call

    return wrap
