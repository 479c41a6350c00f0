"""Backend registry: the names, and where each backend's adapter module lives.

Adding a backend
----------------
1. Write ``flashinfer/backends/<name>.py`` (or a package) with a module-level
   ``KERNELS = KernelTable("<name>")`` and one ``@KERNELS.kernel(op, variant)`` function per
   capability record; put checks a table cannot express (strides, alignment) under
   ``@KERNELS.check(op, variant)``. Import vendor packages inside functions, never at module top:
   the dispatcher imports adapters while choosing, on machines without the vendor package.
2. Write ``flashinfer/capability_db/<name>.toml`` declaring what the kernels can run
   (``verified = false`` until run on hardware against the reference).
3. Add one line to ``_ADAPTERS`` below and, if it should be preferred, name it in the
   ``dispatch_rules/<op>.toml`` orders. Tests, ``show-config`` and ``explain`` find it by themselves.
"""

from __future__ import annotations

import importlib
from typing import Callable

from ..backend_names import BACKEND_NAMES
from ..reasons import Reason

#: backend name -> adapter module (relative to this package). Order = tie-break order.
_ADAPTERS = {
    "cudnn": ".cudnn",
    "flash_attn": ".flash_attn",
    "trtllm": ".trtllm",
    "cutlass": ".cutlass",
    "torch": ".torch_native",
    "triton": ".triton_kernels",
    "reference": ".reference",
}

assert tuple(_ADAPTERS) == BACKEND_NAMES, "one adapter per backend name, in the same order"

CheckFn = Callable[..., list[Reason]]


class KernelTable:
    """Per-backend table of kernels and extra checks, keyed by (op, variant)."""

    def __init__(self, backend: str):
        self.backend = backend
        self.kernels: dict[tuple[str, str], Callable] = {}
        self.checks: dict[tuple[str, str], CheckFn] = {}

    def kernel(self, op: str, variant: str = "default"):
        def register(fn: Callable) -> Callable:
            self.kernels[(op, variant)] = fn
            return fn
        return register

    def check(self, op: str, variant: str = "default"):
        def register(fn: CheckFn) -> CheckFn:
            self.checks[(op, variant)] = fn
            return fn
        return register


def adapter_table(backend: str) -> KernelTable:
    module = importlib.import_module(_ADAPTERS[backend], __name__)
    return module.KERNELS


def get_kernel(backend: str, op: str, variant: str) -> Callable:
    table = adapter_table(backend)
    try:
        return table.kernels[(op, variant)]
    except KeyError:
        raise LookupError(
            f"backend {backend!r} declares {op}:{variant} in its capability record "
            f"but its adapter registers no such kernel") from None


def extra_reasons(backend: str, op: str, variant: str, problem) -> list[Reason]:
    check = adapter_table(backend).checks.get((op, variant))
    return list(check(problem)) if check else []
