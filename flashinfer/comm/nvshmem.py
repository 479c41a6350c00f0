"""Upstream's ``flashinfer.comm.nvshmem`` (NVSHMEM bootstrap and symmetric allocation): not
provided. Every name of it raises ``NotImplementedError`` saying what to use instead."""

from __future__ import annotations


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotImplementedError(
        f"flashinfer.comm.nvshmem.{name}: NVSHMEM is not supported here; use torch.distributed "
        "(NCCL) for collectives, or torch's symmetric memory "
        "(torch.distributed._symmetric_memory) for symmetric buffers")
