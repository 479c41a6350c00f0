"""Reference RMSNorm and LayerNorm: plain PyTorch, fp32 math, one rounding to the output dtype.

Kernel signatures and semantics: :mod:`flashinfer.norm` (module docstring).
"""

from __future__ import annotations

import torch



def rmsnorm(input: torch.Tensor, weight: torch.Tensor, out: torch.Tensor,
            residual: torch.Tensor | None, eps: float, weight_bias: float) -> None:
    v = input.float()
    if residual is not None:
        summed = (v + residual.float()).to(residual.dtype)  # rounded, as stored
        residual.copy_(summed)
        v = summed.float()
    rstd = torch.rsqrt(v.square().mean(dim=-1, keepdim=True) + eps)
    out.copy_(v * rstd * (weight.float() + weight_bias))


def layernorm(input: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, out: torch.Tensor,
              eps: float) -> None:
    x = input.float()
    centred = x - x.mean(dim=-1, keepdim=True)
    rstd = torch.rsqrt(centred.square().mean(dim=-1, keepdim=True) + eps)
    out.copy_(centred * rstd * gamma.float() + beta.float())
