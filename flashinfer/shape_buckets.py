"""How lengths enter a dispatch Problem: rounded up to powers of two, so the Decision cache (and a
backend's plan cache) stays small. Imports nothing of the package."""

from __future__ import annotations


def length_bucket(n: int) -> int:
    """Round a sequence length up to a power of two (``1`` for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()
