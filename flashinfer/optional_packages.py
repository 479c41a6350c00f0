"""Which optional packages import on this machine (the ``requires`` of capability records, the
adapters' own checks, ``show-config``). Imports nothing of the package."""

from __future__ import annotations

import functools
import importlib


@functools.lru_cache(maxsize=None)
def import_error(module: str) -> str | None:
    """``None`` if ``module`` imports, else the import error as text (cached per process)."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure is a reason, never a crash
        return f"import failed: {type(exc).__name__}: {exc}"
    return None
