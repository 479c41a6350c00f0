"""Upstream's ``flashinfer.jit.core`` probe that engines call before using FlashInfer kernels."""

from __future__ import annotations

import torch

__all__ = ["check_cuda_arch"]


def check_cuda_arch() -> None:
    """Raise ``RuntimeError`` when a visible GPU is older than SM 7.5 (upstream's minimum and
    ours); return None otherwise, and on a machine without a GPU (the CPU paths serve it)."""
    if not torch.cuda.is_available():
        return None
    for index in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(index)
        if (major, minor) < (7, 5):
            raise RuntimeError(f"FlashInfer requires GPUs with SM 7.5 or newer; GPU {index} is "
                               f"SM {major}.{minor}")
    return None
