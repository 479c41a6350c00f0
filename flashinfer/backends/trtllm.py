"""trtllm adapter: no kernels yet; the capability record says what is planned and true today."""

from __future__ import annotations

from ..reasons import Reason
from . import KernelTable

KERNELS = KernelTable("trtllm")


@KERNELS.kernel("fused_moe")
def fused_moe(x, x_scale, w1, w1_scale, w2, w2_scale, ids, weights, spec, out) -> None:
    """Declared (capability record, ``verified = false``), not wired: the call into
    ``tensorrt_llm``'s fused MoE op has never run against the reference, so it is refused."""
    raise RuntimeError("the trtllm fused MoE kernel is declared but not wired into this library "
                       "(tensorrt_llm could not be installed or tested here); use "
                       "backend='torch' or 'reference'")


@KERNELS.check("fused_moe")
def _not_wired(problem) -> list[Reason]:
    """Never chosen: the record documents what TensorRT-LLM would serve (explain shows it), but
    no call into it exists yet."""
    return [Reason("adapter", "not wired", "a tested call into tensorrt_llm",
                   "declared only: the call into tensorrt_llm's fused MoE has not been written "
                   "and tested against the reference")]
