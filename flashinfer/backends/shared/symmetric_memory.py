"""Symmetric buffers of a process group: one allocation per rank that every rank of the group can
read and write (torch symmetric memory, ``torch.distributed._symmetric_memory``), the exchange
area of the one-shot all-reduce kernels (``torch:symm_mem_*``, ``triton:one_shot``).

:func:`make_symmetric_buffers` is collective (every rank of the group calls it with the same
sizes, as upstream's workspace creation is). It never uses NVLink multicast: the buffers are
plain peer mappings, and the kernels that use them read peers with ordinary loads.

The interface the kernels use (tests stand in for it on CPU with shared-memory files):

* ``buffer``: this rank's 1-D tensor of ``dtype`` (at least the workspace's largest call);
* ``peer_table``: int64 ``[world_size]`` on the device, the address of every rank's ``buffer``;
* ``group_name``: the group's name for torch's symmetric-memory ops;
* ``barrier()``: queued on the current stream; when it completes on a rank, every rank's work
  queued before its own barrier is done and visible to all.
"""

from __future__ import annotations

import torch


class SymmetricBuffers:
    """``capacity`` elements of ``dtype`` in torch symmetric memory on ``device``, mapped by every
    rank of ``group``."""

    def __init__(self, group, capacity: int, dtype: torch.dtype, device: torch.device) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self.group_name = group.group_name
        self.buffer = symm_mem.empty(capacity, dtype=dtype, device=device)
        self.handle = symm_mem.rendezvous(self.buffer, group)
        self.world_size, self.rank = self.handle.world_size, self.handle.rank
        ptrs = list(self.handle.buffer_ptrs)
        start = self.buffer.data_ptr() - ptrs[self.rank]  # (the same offset on every rank)
        self.peer_table = torch.tensor([p + start for p in ptrs], dtype=torch.int64,
                                       device=device)

    def barrier(self) -> None:
        """torch's signal-pad barrier, bounded by ``FLASHINFER_COMM_TIMEOUT_S``: a rank that
        died or stopped makes the waiting kernel report it and trap (a CUDA error in this
        process) instead of spinning forever. (torch's one- and two-shot kernels wait without
        a bound.)"""
        from ... import envs

        self.handle.barrier(channel=0, timeout_ms=1000 * envs.COMM_TIMEOUT_S.get())


def capacity_for(numel: int) -> int:
    """``numel`` rounded up to a multiple of 8 elements (16 bytes of bf16: torch's one-shot
    kernels vectorise by the alignment of the size)."""
    return (numel + 7) // 8 * 8


def make_symmetric_buffers(group, numel: int, dtype: torch.dtype
                           ) -> tuple[SymmetricBuffers | None, str]:
    """``(buffers, "")`` for an NCCL ``group`` on this process's current GPU, else ``(None,
    why)``. Collective: every rank of the group calls it with the same ``numel`` and ``dtype``."""
    import torch.distributed as dist

    from ... import envs

    if not envs.COMM_SYMM_MEM.get():
        return None, "FLASHINFER_COMM_SYMM_MEM=0"
    if dist.get_backend(group) != "nccl" or not torch.cuda.is_available():
        return None, f"the group's backend is {dist.get_backend(group)}, not NCCL on GPUs"
    try:
        import torch.distributed._symmetric_memory  # noqa: F401
    except ImportError as exc:
        return None, f"torch symmetric memory does not import: {exc}"
    device = torch.device("cuda", torch.cuda.current_device())
    try:
        return SymmetricBuffers(group, capacity_for(numel), dtype, device), ""
    except (RuntimeError, ValueError, AttributeError) as exc:
        return None, f"torch symmetric memory failed: {type(exc).__name__}: {exc}"
