"""Communication (upstream's module ``flashinfer.comm``): the fused all-reduce (:mod:`.fusion`),
upstream's legacy TRT-LLM all-reduce names (:mod:`.trtllm_ar`) and its port of vLLM's custom
all-reduce (:mod:`.vllm_ar`, exported with a ``vllm_`` prefix), all over ``torch.distributed``.
Upstream's MNNVL and NVSHMEM modules answer with a clear error (:mod:`.mnnvl`, :mod:`.nvshmem`).
"""

from .fusion import (  # noqa: F401
    AllReduceFusionPattern, AllReduceFusionWorkspace, MNNVLAllReduceFusionWorkspace,
    QuantizationSFLayout, TRTLLMAllReduceFusionWorkspace, allreduce_fusion,
    create_allreduce_fusion_workspace,
)
from .trtllm_ar import (  # noqa: F401
    AllReduceFusionOp, AllReduceStrategyConfig, AllReduceStrategyType,
    compute_fp4_swizzled_layout_sf_size, trtllm_allreduce_fusion,
    trtllm_create_ipc_workspace_for_all_reduce, trtllm_create_ipc_workspace_for_all_reduce_fusion,
    trtllm_custom_all_reduce, trtllm_destroy_ipc_workspace_for_all_reduce,
    trtllm_destroy_ipc_workspace_for_all_reduce_fusion, trtllm_lamport_initialize,
    trtllm_lamport_initialize_all, trtllm_moe_allreduce_fusion,
    trtllm_moe_finalize_allreduce_fusion,
)
from .vllm_ar import all_reduce as vllm_all_reduce  # noqa: F401
from .vllm_ar import dispose as vllm_dispose  # noqa: F401
from .vllm_ar import get_graph_buffer_ipc_meta as vllm_get_graph_buffer_ipc_meta  # noqa: F401
from .vllm_ar import init_custom_ar as vllm_init_custom_ar  # noqa: F401
from .vllm_ar import meta_size as vllm_meta_size  # noqa: F401
from .vllm_ar import register_buffer as vllm_register_buffer  # noqa: F401
from .vllm_ar import register_graph_buffers as vllm_register_graph_buffers  # noqa: F401

__all__ = [
    "AllReduceFusionOp", "AllReduceFusionPattern", "AllReduceFusionWorkspace",
    "AllReduceStrategyConfig", "AllReduceStrategyType", "MNNVLAllReduceFusionWorkspace",
    "QuantizationSFLayout", "TRTLLMAllReduceFusionWorkspace", "allreduce_fusion",
    "compute_fp4_swizzled_layout_sf_size", "create_allreduce_fusion_workspace",
    "trtllm_allreduce_fusion", "trtllm_create_ipc_workspace_for_all_reduce",
    "trtllm_create_ipc_workspace_for_all_reduce_fusion", "trtllm_custom_all_reduce",
    "trtllm_destroy_ipc_workspace_for_all_reduce",
    "trtllm_destroy_ipc_workspace_for_all_reduce_fusion", "trtllm_lamport_initialize",
    "trtllm_lamport_initialize_all", "trtllm_moe_allreduce_fusion",
    "trtllm_moe_finalize_allreduce_fusion", "vllm_all_reduce", "vllm_dispose",
    "vllm_get_graph_buffer_ipc_meta", "vllm_init_custom_ar", "vllm_meta_size",
    "vllm_register_buffer", "vllm_register_graph_buffers",
]
