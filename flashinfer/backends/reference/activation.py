"""Reference gated activations: plain PyTorch, fp32 math, one rounding to the output dtype.

Kernel signature and semantics: :mod:`flashinfer.activation` (module docstring).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


_ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def act_and_mul(input: torch.Tensor, out: torch.Tensor, activation: str) -> None:
    d = input.shape[-1] // 2
    gate, up = input[..., :d].float(), input[..., d:].float()
    out.copy_(_ACTIVATIONS[activation](gate) * up)
