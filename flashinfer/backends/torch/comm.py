"""Fused all-reduce on torch's own ops (record ``torch:all_reduce``): ``torch.distributed.
all_reduce`` of the input in its own dtype (NCCL on GPUs: half the bytes the reference's fp32
copy puts on the wire), then the residual add and ``torch.nn.functional.rms_norm``: what an
engine runs today without a fused kernel, and the baseline the fused kernels are measured
against.

Kernel signature and semantics: :mod:`flashinfer.comm.fusion` (module docstring), with one
difference: the sum is the collective's, in the input dtype (NCCL and gloo round as they
accumulate: a few units in the last place at 8 ranks where the reference rounds once). The
quantising patterns are not in the record (the reference serves them).
"""

from __future__ import annotations

import torch

from ..reference.comm import all_reduce_bounded


def allreduce_fusion(input: torch.Tensor, group, symmetric, output: torch.Tensor | None,
                     residual_in: torch.Tensor | None, residual_out: torch.Tensor | None,
                     rms_gamma: torch.Tensor | None, norm_out: torch.Tensor | None, eps: float,
                     weight_bias: float, quant: str | None, quant_out: torch.Tensor | None,
                     scale_out: torch.Tensor | None, scale_factor: torch.Tensor | float | None,
                     group_size: int) -> None:
    if quant is not None:
        raise ValueError(f"torch:all_reduce has no {quant} quantisation (the reference has)")
    if residual_in is None:  # kAllReduce: the sum in output (the caller's input left as it is)
        output.copy_(input)
        all_reduce_bounded(output, group)
        return
    # the sum in a copy: vLLM passes residual_out = residual_in and norm_out = input, so neither
    # may be written before it is read
    total = input.clone()
    all_reduce_bounded(total, group)
    finish(total, output, residual_in, residual_out, rms_gamma, norm_out, eps, weight_bias)


def finish(total: torch.Tensor, output: torch.Tensor | None, residual_in: torch.Tensor | None,
           residual_out: torch.Tensor | None, rms_gamma: torch.Tensor | None,
           norm_out: torch.Tensor | None, eps: float, weight_bias: float) -> None:
    """After the collective left the sum in ``total`` (not aliasing any argument): store it to
    ``output``, then the residual add and ``rms_norm`` on torch's ops."""
    if output is not None:
        output.copy_(total)
    if residual_in is None:
        return
    torch.add(total, residual_in, out=residual_out)
    weight = rms_gamma if weight_bias == 0.0 else (rms_gamma.float() + weight_bias)
    x = residual_out if weight.dtype == residual_out.dtype else residual_out.float()
    normed = torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)
    if norm_out is not None:
        norm_out.copy_(normed)
