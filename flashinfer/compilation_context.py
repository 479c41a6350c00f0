"""Upstream's ``flashinfer.compilation_context``: the GPU architectures its JIT would target.
Nothing is compiled here; engines call :meth:`CompilationContext._normalize_cuda_arch` to probe
which target a GPU maps to, and it answers with upstream's rule."""

from __future__ import annotations

import os

import torch

__all__ = ["CompilationContext"]


def _cuda_at_least(major: int, minor: int) -> bool:
    version = torch.version.cuda
    if not version:
        return False
    parts = [int(p) for p in version.split(".")[:2]]
    return tuple(parts) >= (major, minor)


class CompilationContext:
    """``TARGET_CUDA_ARCHS``: ``{(major, minor_with_suffix)}`` from
    ``FLASHINFER_CUDA_ARCH_LIST`` (``"9.0 12.0f"``, a given suffix kept) or the visible GPUs."""

    @staticmethod
    def _normalize_cuda_arch(major: int, minor: int) -> tuple[int, str]:
        """``(major, minor)`` -> ``(major, minor + suffix)`` for nvcc targets: SM 9.x and 10+
        take ``a``; SM 12.0 takes ``0f`` and other SM 12.x ``a`` (needs CUDA >= 12.9, else
        RuntimeError); older GPUs no suffix."""
        if major == 9:
            return major, f"{minor}a"
        if major == 12:
            if not _cuda_at_least(12, 9):
                raise RuntimeError("SM 12.x requires CUDA >= 12.9")
            return major, ("0f" if minor == 0 else f"{minor}a")
        if major >= 10:
            return major, f"{minor}a"
        return major, str(minor)

    def __init__(self):
        self.TARGET_CUDA_ARCHS: set[tuple[int, str]] = set()
        listed = os.environ.get("FLASHINFER_CUDA_ARCH_LIST")
        if listed:
            for arch in listed.split():
                major, minor = arch.split(".")
                self.TARGET_CUDA_ARCHS.add(
                    (int(major), minor) if minor[-1].isalpha()
                    else self._normalize_cuda_arch(int(major), int(minor)))
        elif torch.cuda.is_available():
            for index in range(torch.cuda.device_count()):
                self.TARGET_CUDA_ARCHS.add(
                    self._normalize_cuda_arch(*torch.cuda.get_device_capability(index)))
