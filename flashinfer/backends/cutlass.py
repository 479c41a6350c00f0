"""cutlass adapter: no kernels yet; the capability record says what is planned and true today."""

from __future__ import annotations

from ..reasons import Reason
from . import KernelTable

KERNELS = KernelTable("cutlass")


@KERNELS.kernel("mm_fp4")
def mm_fp4(a, b, a_sf, b_sf, alpha, block_size, a_sf_8x4, out) -> None:
    """Declared (capability record, ``verified = false``), not wired: refused."""
    raise RuntimeError("the CUTLASS native FP4 GEMM is declared but not wired into this library "
                       "(no native FP4 adapter here); use backend='torch' or 'reference'")


@KERNELS.check("mm_fp4")
def _fp4_not_wired(problem) -> list[Reason]:
    """Never chosen: the record documents what upstream's CUTLASS FP4 GEMM serves (explain shows
    it), but no call into a native FP4 kernel exists yet."""
    return [Reason("adapter", "not wired", "a tested native FP4 GEMM call",
                   "no native FP4 adapter here: the CUTLASS block-scaled FP4 GEMM is declared "
                   "only, not written and tested against the reference")]
