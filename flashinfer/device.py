"""GPU facts the dispatcher keys on: device kind and SM version, real or simulated.

The dispatcher never asks CUDA directly: it reads a ``DeviceFacts`` value, so a test or
``flashinfer explain --sm 9.0`` can decide for an H100 on a laptop. Real facts are cached per
device index (``torch.cuda.get_device_capability`` is not free on the hot path).
"""

from __future__ import annotations

import functools
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


def parse_sm(text: str) -> tuple[int, int]:
    """``"9.0"`` / ``"90"`` / ``"sm_90"`` / ``"12.0"`` → ``(major, minor)``."""
    raw = text.strip().lower().removeprefix("sm_").removeprefix("sm").rstrip("af")
    try:
        if "." in raw:
            major, minor = raw.split(".", 1)
            return int(major), int(minor)
        value = int(raw)
    except ValueError:
        raise ValueError(f"SM version {text!r} is not valid; write it as 9.0, 90 or sm_90") from None
    return (value // 10, value % 10)


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
    """Facts for a device that is not here: ``simulated("9.0")``; ``None`` means CPU."""
    if sm is None or sm == "cpu":
        return DeviceFacts("cpu", None, "cpu")
    parsed = parse_sm(sm) if isinstance(sm, str) else tuple(sm)
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
