"""Reference fused all-reduce: ``torch.distributed.all_reduce`` (any process-group backend,
gloo included) of the input in fp32, then the residual add and our reference RMSNorm.

Kernel signature and semantics: :mod:`flashinfer.comm.fusion` (module docstring).
"""

from __future__ import annotations

import torch

from .norm import rmsnorm


def allreduce_fusion(input: torch.Tensor, group, output: torch.Tensor | None,
                     residual_in: torch.Tensor | None, residual_out: torch.Tensor | None,
                     rms_gamma: torch.Tensor | None, norm_out: torch.Tensor | None, eps: float,
                     weight_bias: float) -> None:
    import torch.distributed as dist

    total = input.to(torch.float32, copy=True)  # (the caller's input is left as it is)
    dist.all_reduce(total, group=group)
    if output is not None:
        output.copy_(total)
    if residual_in is not None:
        residual_out.copy_(total + residual_in.float())  # rounded once, as stored
        rmsnorm(residual_out, rms_gamma, norm_out, None, eps, weight_bias)
