"""flashinfer: FlashInfer's public API on top of a backend-dispatch facade.

Every call is routed by the capability database and dispatch rules to the best available kernel
(cuDNN, FlashAttention, CUTLASS, TensorRT-LLM, torch, our Triton kernels, or the PyTorch
reference). See :mod:`flashinfer.dispatch` for how, and ``flashinfer explain`` for why.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .dispatch import (  # noqa: F401
    BackendUnavailableError, Decision, NoBackendError, Problem, Reason, StrictModeError, record_decisions, select,
)
from .overrides import use_backend  # noqa: F401
