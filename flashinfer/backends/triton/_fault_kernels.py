"""@triton.jit helpers: write an index fault into the device's error record.

The record and its layout are :mod:`flashinfer.index_checks`'s: int64 ``[code, key, bound,
count]``. A kernel that finds bad entries calls ``report_faults`` (or ``report_fault`` for one)
from the program that found them, with scalar arguments: the first code set wins, the lowest
entry of that code is kept, ``count`` is added to the record's count.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def report_faults(rec_ptr, code, entry, value, bound, count):
    """Record that ``entry`` (its ``value``) broke rule ``code`` (allowed bound ``bound``), one of
    ``count`` bad entries this program found."""
    code64 = tl.cast(code, tl.int64)
    old = tl.atomic_cas(rec_ptr, code64 * 0, code64)
    if (old == 0) | (old == code64):
        v = tl.minimum(tl.maximum(tl.cast(value, tl.int64), -2147483648), 2147483647)
        key = (tl.cast(entry, tl.int64) << 32) | (v & 0xFFFFFFFF)
        tl.atomic_min(rec_ptr + 1, key)
    if old == 0:
        tl.store(rec_ptr + 2, tl.cast(bound, tl.int64))
    tl.atomic_add(rec_ptr + 3, tl.cast(count, tl.int64))


@triton.jit
def report_fault(rec_ptr, code, entry, value, bound):
    """``report_faults`` for a single bad entry."""
    report_faults(rec_ptr, code, entry, value, bound, 1)
