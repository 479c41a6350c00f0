"""Quickstart: call two ops, see which backend ran and why, and check it against the reference.

Runs on CUDA when available, else on CPU (where the PyTorch reference backend serves every op)::

    python examples/quickstart.py
"""

from __future__ import annotations

from typing import Callable

import torch

import flashinfer
from flashinfer.decode import single_decode_with_kv_cache
from flashinfer.norm import rmsnorm


def run_and_explain(name: str, call: Callable[[str], torch.Tensor]) -> None:
    """Run ``call(backend)`` with ``"auto"``, print the Decision, compare with ``"reference"``."""
    with flashinfer.record_decisions() as decisions:
        out = call("auto")
    decision = decisions[-1]
    expected = call("reference")
    error = (out.float() - expected.float()).abs().max().item()
    print(f"== {name}: ran on backend '{decision.name}' "
          f"(decided by: {decision.source}; {decision.rule})")
    print("\n".join("   " + line for line in decision.explain().splitlines()))
    print(f"   max |auto - reference| = {error:.3g}\n")


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16
    torch.manual_seed(0)
    print(f"flashinfer {flashinfer.__version__} on {device} "
          f"({torch.cuda.get_device_name() if device == 'cuda' else 'no GPU'})\n")

    # Decode attention: one query token, 32 query heads sharing 8 KV heads (GQA), 1000 KV tokens.
    num_qo_heads, num_kv_heads, head_dim, kv_len = 32, 8, 128, 1000
    q = torch.randn(num_qo_heads, head_dim, device=device, dtype=dtype)
    k = torch.randn(kv_len, num_kv_heads, head_dim, device=device, dtype=dtype)
    v = torch.randn(kv_len, num_kv_heads, head_dim, device=device, dtype=dtype)
    run_and_explain("single_decode_with_kv_cache",
                    lambda backend: single_decode_with_kv_cache(q, k, v, backend=backend))

    # RMSNorm over 16 rows of hidden size 4096.
    x = torch.randn(16, 4096, device=device, dtype=dtype)
    weight = torch.randn(4096, device=device, dtype=dtype)
    run_and_explain("rmsnorm", lambda backend: rmsnorm(x, weight, backend=backend))


if __name__ == "__main__":
    main()
