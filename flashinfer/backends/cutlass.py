"""cutlass adapter: no kernels yet; the capability record says what is planned and true today."""

from __future__ import annotations

from . import KernelTable

KERNELS = KernelTable("cutlass")
