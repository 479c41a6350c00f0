"""API logging, controlled by ``FLASHINFER_LOGLEVEL`` and ``FLASHINFER_LOGDEST`` (read at import).

Levels (each includes the lower ones):

* ``0`` (default): :func:`flashinfer_api` returns the function itself — zero wrapper cost.
* ``1``: one line per API call, and every new dispatch Decision once per Problem, with every
  rejected backend and its reasons.
* ``3``: the call's arguments before it runs (tensors as shape, dtype, device, strides), so a crash
  inside a kernel still leaves the inputs in the log.
* ``5``: tensor statistics (min, max, mean, NaN and Inf counts) of every tensor argument.

``FLASHINFER_LOGDEST``: ``stdout`` (default), ``stderr`` or a file path; ``%i`` becomes the pid.
Every line is flushed as it is written.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import os
import sys
from typing import Any, Callable, TextIO

import torch

from . import envs

LEVEL: int = envs.LOGLEVEL.get()
_DEST: str = envs.LOGDEST.get()
_stream: TextIO | None = None


def _out() -> TextIO:
    global _stream
    if _stream is None:
        if _DEST == "stdout":
            _stream = sys.stdout
        elif _DEST == "stderr":
            _stream = sys.stderr
        else:
            _stream = open(_DEST.replace("%i", str(os.getpid())), "a", buffering=1)
    return _stream


def emit(text: str) -> None:
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    stream = _out()
    for line in text.splitlines() or [""]:
        stream.write(f"[{stamp}] FlashInfer: {line}\n")
    stream.flush()


def describe_value(value: Any, stats: bool = False) -> str:
    if isinstance(value, torch.Tensor):
        text = (f"Tensor(shape={tuple(value.shape)}, dtype={str(value.dtype).removeprefix('torch.')}, "
                f"device={value.device}, stride={tuple(value.stride())}, "
                f"contiguous={value.is_contiguous()})")
        if stats and value.numel() and not value.is_meta:
            v = value.detach().float()
            finite = v[torch.isfinite(v)]
            text += (f" stats(min={finite.min().item() if finite.numel() else float('nan'):.4g}, "
                     f"max={finite.max().item() if finite.numel() else float('nan'):.4g}, "
                     f"mean={finite.mean().item() if finite.numel() else float('nan'):.4g}, "
                     f"nan={int(torch.isnan(v).sum())}, inf={int(torch.isinf(v).sum())})")
        return text
    if isinstance(value, (tuple, list)):
        inner = ", ".join(describe_value(v, stats) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    return repr(value)


def flashinfer_api(fn: Callable) -> Callable:
    """Decorator for public API functions; the identity when ``FLASHINFER_LOGLEVEL=0``."""
    if LEVEL <= 0:
        return fn
    name = fn.__qualname__
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        emit(f"API call: {name}")
        if LEVEL >= 3:
            try:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                items = bound.arguments.items()
            except TypeError:
                items = [(f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
            for key, value in items:
                emit(f"  {key} = {describe_value(value, stats=LEVEL >= 5)}")
        result = fn(*args, **kwargs)
        if LEVEL >= 3:
            emit(f"  -> {describe_value(result, stats=LEVEL >= 5)}")
        return result

    return wrapper


def log_decision(decision) -> None:
    """Called by the dispatcher when it makes a new Decision (once per Problem key)."""
    if LEVEL >= 1:
        emit("new dispatch decision:\n" + decision.explain())
