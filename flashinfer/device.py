"""GPU facts the dispatcher keys on: device kind and SM version, real or simulated.

The dispatcher never asks CUDA directly: it reads a ``DeviceFacts`` value, so a test or
``flashinfer explain --sm 9.0`` can decide for an H100 on a laptop. Real facts are cached per
device index (``torch.cuda.get_device_capability`` is not free on the hot path).
"""

from __future__ import annotations

import contextlib
import functools
from contextvars import ContextVar
from dataclasses import dataclass

import torch

#: SM family keys used by the dispatch rules, oldest first.
SM_FAMILIES = ("7.5", "8.0", "8.9", "9.0", "10", "12", "cpu")


@dataclass(frozen=True)
class DeviceFacts:
    kind: str  # "cuda" or "cpu"
    sm: tuple[int, int] | None  # (major, minor) for CUDA, None for CPU
    name: str = ""

    @property
    def sm_str(self) -> str:
        return "cpu" if self.sm is None else f"{self.sm[0]}.{self.sm[1]}"


#: the compute capabilities of the CUDA GPUs there are, by major version (CUDA 12.x / 13.x
#: names; SM 10.1 became 11.0). A major above the last here is a GPU newer than this table.
CUDA_SMS: dict[int, tuple[int, ...]] = {
    5: (0, 2, 3), 6: (0, 1, 2), 7: (0, 2, 5), 8: (0, 6, 7, 9), 9: (0,), 10: (0, 1, 3), 11: (0,),
    12: (0, 1),
}


def parse_sm(text: str) -> tuple[int, int]:
    """An SM version as ``(major, minor)``: ``"9.0"``, ``"9"``, ``"90"``, ``"sm_90a"`` → ``(9, 0)``.

    A bare number below 20 is a major version (``"9"`` is 9.0, ``"12"`` is 12.0); from 20 on it
    is major and minor run together as in ``sm_90`` (``"90"`` is 9.0, ``"100"`` is 10.0).
    Only the syntax is checked (capability records name range ends such as 13.9);
    :func:`cuda_sm` also checks that a GPU of that SM exists.
    """
    raw = text.strip().lower().removeprefix("sm_").removeprefix("sm").rstrip("af")
    major, dot, minor = raw.partition(".")
    if not major.isdigit() or (dot and not (minor.isdigit() and len(minor) == 1)):
        raise ValueError(f"SM version {text!r} is not valid; write it as 9.0, 9, 90 or sm_90")
    if dot:
        return int(major), int(minor)
    value = int(major)
    return (value, 0) if value < 20 else (value // 10, value % 10)


def cuda_sm(sm: str | tuple[int, int]) -> tuple[int, int]:
    """``sm`` parsed (:func:`parse_sm`) and checked to be the SM of a CUDA GPU: ``ValueError``
    for one that cannot exist (SM 0.9, SM 9.9), so a typo is not silently a device on which
    nothing runs. An SM newer than :data:`CUDA_SMS` is taken as given."""
    major, minor = parse_sm(sm) if isinstance(sm, str) else sm
    shown = f"{major}.{minor}"
    if isinstance(sm, str) and sm.strip() != shown:
        shown = f"{sm!r} (read as {shown})"
    if major < min(CUDA_SMS):
        raise ValueError(f"SM {shown} is not the SM of a CUDA GPU (the oldest supported is "
                         f"{min(CUDA_SMS)}.0); write it as 9.0, 9, 90 or sm_90")
    if major in CUDA_SMS and minor not in CUDA_SMS[major]:
        known = ", ".join(f"{major}.{m}" for m in CUDA_SMS[major])
        raise ValueError(f"SM {shown} is not the SM of a CUDA GPU; SM {major} GPUs are {known}")
    return major, minor


def sm_family(sm: tuple[int, int] | None) -> str:
    """Map an SM version to the family key that the dispatch rules use."""
    if sm is None:
        return "cpu"
    major, minor = sm
    if major < 8:
        return "7.5"
    if major == 8:
        return "8.9" if minor >= 9 else "8.0"
    if major == 9:
        return "9.0"
    if major in (10, 11):
        return "10"
    return "12"


def simulated(sm: str | tuple[int, int] | None) -> DeviceFacts:
    """Facts for a device that is not here: ``simulated("9.0")``; ``None`` means CPU.
    ``ValueError`` for an SM no GPU has (:func:`cuda_sm`)."""
    if sm is None or sm == "cpu":
        return DeviceFacts("cpu", None, "cpu")
    parsed = cuda_sm(sm)
    return DeviceFacts("cuda", parsed, f"simulated SM {parsed[0]}.{parsed[1]}")


@functools.lru_cache(maxsize=64)
def _cuda_facts(index: int) -> DeviceFacts:
    major, minor = torch.cuda.get_device_capability(index)
    return DeviceFacts("cuda", (major, minor), torch.cuda.get_device_name(index))


_CPU = DeviceFacts("cpu", None, "cpu")


def facts_of(device: torch.device) -> DeviceFacts:
    """Facts of the device a tensor lives on."""
    if device.type == "cuda":
        return _cuda_facts(device.index if device.index is not None else torch.cuda.current_device())
    return _CPU


def current() -> DeviceFacts:
    """Facts of the current CUDA device, or CPU when there is none."""
    if torch.cuda.is_available():
        return _cuda_facts(torch.cuda.current_device())
    return _CPU


_RESERVED_SMS: ContextVar[int] = ContextVar("flashinfer_reserved_sms", default=0)


def reserved_sms() -> int:
    """How many SMs a kernel launched now should leave free for work on another stream (0
    outside :func:`reserving_sms`). Kernels with such a knob honour it (FA3's ``sm_margin``),
    the others ignore it."""
    return _RESERVED_SMS.get()


@contextlib.contextmanager
def reserving_sms(count: int):
    """Within the block, :func:`reserved_sms` is ``count`` (context-local, restored on exit)."""
    token = _RESERVED_SMS.set(max(0, int(count)))
    try:
        yield
    finally:
        _RESERVED_SMS.reset(token)
