"""Upstream's ``flashinfer.comm.mnnvl`` (multi-node NVLink fabric memory, NVLink multicast): not
provided. Every name of it raises ``NotImplementedError`` saying what to use instead: multicast
is not used by this library (it can put a host's shared GPUs out of service)."""

from __future__ import annotations

_INSTEAD = ("flashinfer.comm.create_allreduce_fusion_workspace(backend='auto') with "
            "allreduce_fusion (NCCL / torch.distributed underneath)")


def unsupported(name: str) -> NotImplementedError:
    """The error for an MNNVL name."""
    return NotImplementedError(f"{name}: MNNVL (NVLink multicast) is not supported here; use "
                               f"{_INSTEAD}")


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise unsupported(f"flashinfer.comm.mnnvl.{name}")
