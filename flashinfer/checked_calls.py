"""The steady-state memo of the public functions: eager calls that passed their checks.

A public function checks its arguments' metadata and scalars (shapes, dtypes, devices,
strides, values of the non-tensor arguments) and derives its dispatch facts from them. A call
whose *signature* — exactly what those checks read, with the types of the scalars (``True ==
1 == 1.0`` as dict keys) — equals a call that passed them passes them again and dispatches on
the same facts, so the function keeps what it derived under the signature and a hit skips the
checks. What depends on more than metadata is still done per call: the Decision is looked up
(overrides apply), aliasing between outputs and inputs is checked (it depends on addresses),
generators are read. Failing calls are never stored; each memo is bounded (cleared when full);
under ``torch.compile`` nothing is looked up (the signature is None).
"""

from __future__ import annotations

import operator

__all__ = ["CheckedCalls", "tensor_fact"]


class CheckedCalls:
    """One public function's memo: ``signature -> what its checks and dispatch facts gave``."""

    __slots__ = ("_stored", "limit")

    def __init__(self, limit: int = 4096):
        self._stored: dict[tuple, tuple] = {}
        self.limit = limit

    def get(self, signature: tuple | None):
        """What ``signature`` keeps, or None (also for a signature holding an unhashable
        scalar: such a call is checked every time)."""
        if signature is None:
            return None
        try:
            return self._stored.get(signature)
        except TypeError:
            return None

    def put(self, signature: tuple | None, value) -> None:
        if signature is None:
            return
        if len(self._stored) >= self.limit:
            self._stored.clear()
        try:
            self._stored[signature] = value
        except TypeError:
            pass

    def clear(self) -> None:
        self._stored.clear()

    def __len__(self) -> int:
        return len(self._stored)


#: ``tensor_fact(t) -> (t.shape, t.dtype, t.device)``, in one C call: a signature holds one per
#: tensor argument (after an ``isinstance`` check: a non-tensor makes the signature None, the
#: checks then run and name it), and is None while compiling
tensor_fact = operator.attrgetter("shape", "dtype", "device")
