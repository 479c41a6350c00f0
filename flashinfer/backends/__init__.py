"""Backends: one package per backend, named like it (the names: :mod:`flashinfer.backend_names`).

A capability record (``flashinfer/capability_db/<backend>.toml``) names the function that runs
its kernel, ``kernel = "torch.gemm:bmm_fp8"`` (a module of this package, then the function), and
optionally ``check = "module:function"``: the reasons a problem its table admits still cannot run
(strides, alignment: what a table cannot say). :func:`resolve` imports the module the first time
a Decision needs it; nothing is registered by import side effect, so the Decision names the very
function that runs. A record with ``planned = true`` names no function: it is declared so that
``explain`` and ``show-config`` show what is planned, and is never chosen.

Adding a backend
----------------
1. Write ``flashinfer/backends/<name>/`` with one module per op family, holding the kernel
   functions with the canonical signatures of that op's module docstring. Import vendor
   packages inside functions, never at module top: the dispatcher imports these modules while
   choosing, also on machines without the vendor package. Helpers several backends share go in
   ``backends/shared/``; a backend imports nothing above the kernel contracts (the layering test
   holds it to that).
2. Write ``flashinfer/capability_db/<name>.toml``: one record per kernel, naming it, declaring
   what it can run (``verified = false`` until it ran on hardware against the reference).
3. Add the name to ``backend_names.BACKEND_NAMES`` and, to have it preferred, to the orders of
   ``dispatch_rules/<op>.toml``. The tests, ``show-config`` and ``explain`` find it by themselves.
"""

from __future__ import annotations

import functools
import importlib
from typing import Callable


@functools.lru_cache(maxsize=None)
def resolve(ref: str) -> Callable:
    """``"torch.gemm:bmm_fp8"`` -> the function ``bmm_fp8`` of ``flashinfer.backends.torch.gemm``
    (imported on first use; ``LookupError`` naming the reference when it does not exist)."""
    module_name, _, function = ref.partition(":")
    module = importlib.import_module(f"{__name__}.{module_name}")
    try:
        return getattr(module, function)
    except AttributeError:
        raise LookupError(f"a capability record names kernel {ref!r}, but "
                          f"{module.__name__} has no {function!r}") from None
