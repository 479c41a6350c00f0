"""Fused all-reduce on torch's symmetric-memory collectives (records ``torch:symm_mem_one_shot``
and ``torch:symm_mem_two_shot``): the sum through the workspace's symmetric buffers
(backends/shared/symmetric_memory.py), then the residual add and ``rms_norm`` on torch's ops
(:func:`.comm.finish`).

* one-shot (``symm_mem.one_shot_all_reduce_copy_out``): one kernel copies the input into this
  rank's buffer, waits for every rank, and reads all buffers; ``W`` times the bytes read, one
  launch: the small-message form.
* two-shot (``symm_mem.two_shot_all_reduce_``, in place on the buffer after the input is copied
  in): each rank reduces ``1 / W`` of the elements and writes that slice into every buffer;
  ``2 (W - 1) / W`` of the bytes per rank, the large-message form.

Both synchronise inside their kernels (torch's signal pads), so a call needs no barrier of ours.
Neither uses NVLink multicast (the ``multimem_*`` ops are never called). torch serves bf16 and
fp32 there; the sum is in the input dtype. Kernel signature and semantics:
:mod:`flashinfer.comm.fusion` (module docstring).
"""

from __future__ import annotations

import torch

from .comm import finish


def _symmetric_view(symmetric, input: torch.Tensor, what: str) -> torch.Tensor:
    numel = input.numel()
    if symmetric is None or numel > symmetric.buffer.numel():
        raise ValueError(f"{what} needs the workspace's symmetric buffers for "
                         f"{list(input.shape)}")
    return symmetric.buffer[:numel].view(input.shape)


def one_shot(input: torch.Tensor, group, symmetric, output: torch.Tensor | None,
             residual_in: torch.Tensor | None, residual_out: torch.Tensor | None,
             rms_gamma: torch.Tensor | None, norm_out: torch.Tensor | None, eps: float,
             weight_bias: float, quant: str | None, quant_out: torch.Tensor | None,
             scale_out: torch.Tensor | None, scale_factor: torch.Tensor | float | None,
             group_size: int) -> None:
    if quant is not None:
        raise ValueError(f"torch:symm_mem_one_shot has no {quant} quantisation")
    view = _symmetric_view(symmetric, input, "torch:symm_mem_one_shot")
    direct = residual_in is None and output.is_contiguous()
    total = output if direct else torch.empty_like(input)
    aligned = input.is_contiguous() and input.storage_offset() * input.element_size() % 16 == 0
    local = input if aligned else input.clone()  # (torch wants it aligned like the buffer)
    torch.ops.symm_mem.one_shot_all_reduce_copy_out(view, local, "sum", symmetric.group_name,
                                                   total)
    if not direct:
        finish(total, output, residual_in, residual_out, rms_gamma, norm_out, eps, weight_bias)


def two_shot(input: torch.Tensor, group, symmetric, output: torch.Tensor | None,
             residual_in: torch.Tensor | None, residual_out: torch.Tensor | None,
             rms_gamma: torch.Tensor | None, norm_out: torch.Tensor | None, eps: float,
             weight_bias: float, quant: str | None, quant_out: torch.Tensor | None,
             scale_out: torch.Tensor | None, scale_factor: torch.Tensor | float | None,
             group_size: int) -> None:
    if quant is not None:
        raise ValueError(f"torch:symm_mem_two_shot has no {quant} quantisation")
    view = _symmetric_view(symmetric, input, "torch:symm_mem_two_shot")
    view.copy_(input)
    torch.ops.symm_mem.two_shot_all_reduce_(view, "sum", symmetric.group_name)
    # (the next call's copy into the buffer is queued after this rank's reads of it; the other
    # ranks write into it only once every rank has entered that call's kernel)
    finish(view, output, residual_in, residual_out, rms_gamma, norm_out, eps, weight_bias)
