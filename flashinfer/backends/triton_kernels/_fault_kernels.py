"""@triton.jit helper: write an index fault into the device's error record.

The record and its layout are :mod:`flashinfer.index_checks`'s: int64 ``[code, key, bound,
count]``. A kernel that finds a bad entry calls ``report_fault`` (scalar arguments) from the
program that found it; the first code set wins, the lowest entry of that code is kept.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def report_fault(rec_ptr, code, entry, value, bound):
    """Record that ``entry`` (its ``value``) broke rule ``code`` (allowed bound ``bound``)."""
    old = tl.atomic_cas(rec_ptr, 0, code)
    if (old == 0) | (old == code):
        v = tl.minimum(tl.maximum(value.to(tl.int64), -2147483648), 2147483647)
        key = (entry.to(tl.int64) << 32) | (v & 0xFFFFFFFF)
        tl.atomic_min(rec_ptr + 1, key)
    if old == 0:
        tl.store(rec_ptr + 2, bound.to(tl.int64))
    tl.atomic_add(rec_ptr + 3, 1)
