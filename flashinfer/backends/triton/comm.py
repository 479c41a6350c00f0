"""Triton one-shot fused all-reduce (records ``triton:one_shot`` and ``triton:one_shot_fp8``):
the all-reduce, the residual add, the RMSNorm and the fp8 quantisation of the normed output in
one kernel, reading every rank's row from the workspace's symmetric buffers
(backends/shared/symmetric_memory.py). Kernel signature and semantics: :mod:`flashinfer.comm.
fusion` (module docstring); the sum is taken in fp32 in rank order, the same bits on every rank.

A call is four launches on the stream: the input copied into this rank's buffer, a barrier (every
rank's copy is done), the kernel, a barrier (every rank has read the buffers, so the next call
may overwrite them). The second barrier makes each call self-contained, so eager calls and
CUDA-graph replays mix freely; overlapping calls through two alternating halves would save it.
On the CPU it runs under ``TRITON_INTERPRET=1`` with the tests' shared-memory stand-in for the
buffers. The @triton.jit code lives in ``_comm_kernels.py`` (imported on first use).
"""

from __future__ import annotations

import torch

from .launch import device_of, fast, pow2

#: the widest row one program holds (fp32, in registers)
MAX_HIDDEN = 16384
#: the per-token dynamic scale's floor (2**-9 / 448, as the reference: backends/reference/comm)
_DYNAMIC_MIN_SCALE = float(torch.tensor(2.0 ** -9, dtype=torch.float32) / 448.0)
_QUANT_CODE = {None: 0, "fp8_dynamic_quant": 3}


def one_shot(input: torch.Tensor, group, symmetric, output: torch.Tensor | None,
             residual_in: torch.Tensor | None, residual_out: torch.Tensor | None,
             rms_gamma: torch.Tensor | None, norm_out: torch.Tensor | None, eps: float,
             weight_bias: float, quant: str | None, quant_out: torch.Tensor | None,
             scale_out: torch.Tensor | None, scale_factor: torch.Tensor | float | None,
             group_size: int) -> None:
    from . import _comm_kernels

    tokens, hidden = input.shape
    numel = tokens * hidden
    if symmetric is None or numel > symmetric.buffer.numel() or hidden > MAX_HIDDEN:
        raise ValueError(f"triton:one_shot needs the workspace's symmetric buffers for "
                         f"{tokens} x {hidden} (hidden <= {MAX_HIDDEN})")
    if quant == "fp8_quant":
        code = 2 if isinstance(scale_factor, torch.Tensor) else 1
    elif quant in _QUANT_CODE:
        code = _QUANT_CODE[quant]
    else:
        raise ValueError(f"triton:one_shot has no {quant} quantisation (the reference has)")
    inv_scale = (float(torch.tensor(scale_factor, dtype=torch.float32).reciprocal())
                 if code == 1 else 1.0)
    residual = residual_in is not None
    args = [_contiguous(t) for t in (output, residual_in, residual_out, rms_gamma, norm_out,
                                     quant_out, scale_out)]
    out, res_in, res_out, gamma, norm, q, s_out = (a if a is not None else symmetric.buffer
                                                   for a in args)
    scale = scale_factor if code == 2 else symmetric.buffer
    symmetric.buffer[:numel].view(tokens, hidden).copy_(input)
    symmetric.barrier()
    block = pow2(hidden)
    with device_of(input):
        fast(_comm_kernels.one_shot_kernel)[(tokens,)](
            symmetric.peer_table, symmetric.buffer, 0,
            out, res_in, res_out, gamma, norm, q, scale, s_out,
            hidden, eps, weight_bias, inv_scale, _DYNAMIC_MIN_SCALE,
            WORLD=symmetric.peer_table.numel(), BLOCK=block, WRITE_SUM=output is not None,
            RESIDUAL=residual, WRITE_NORM=norm_out is not None, QUANT=code,
            ROUND_FP8=not input.is_cuda,
            num_warps=min(16, max(1, block // 512)))
    symmetric.barrier()
    for given, used in zip((output, residual_out, norm_out, quant_out, scale_out),
                           (args[0], args[2], args[4], args[5], args[6])):
        if given is not None and used is not given:
            given.copy_(used)


def _contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None or t.is_contiguous() else t.contiguous()
