"""``Reason``: one readable cause why a backend cannot serve a problem."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Reason:
    """Why a backend was rejected: the field checked, the value seen, what is allowed."""

    field: str
    actual: Any
    allowed: Any
    message: str

    def __str__(self) -> str:
        return self.message
