"""Communication (upstream's module ``flashinfer.comm``): the fused all-reduce
(:mod:`.fusion`). Upstream's MNNVL and NVSHMEM modules answer with a clear error
(:mod:`.mnnvl`, :mod:`.nvshmem`)."""

from .fusion import (  # noqa: F401
    AllReduceFusionPattern, AllReduceFusionWorkspace, MNNVLAllReduceFusionWorkspace,
    TRTLLMAllReduceFusionWorkspace, allreduce_fusion, create_allreduce_fusion_workspace,
)

__all__ = ["AllReduceFusionPattern", "AllReduceFusionWorkspace", "MNNVLAllReduceFusionWorkspace",
           "TRTLLMAllReduceFusionWorkspace", "allreduce_fusion",
           "create_allreduce_fusion_workspace"]
