"""Activation benchmark: silu_and_mul, gelu_and_mul and gelu_tanh_and_mul (the gated MLP
activation), every kernel the capability database declares and ``auto``.

    python benchmarks/activation.py            # GPU: the full table below; CPU: tiny shapes
    flashinfer bench activation --shapes quick # the same runner through the CLI

Bandwidth-bound: ``tb_per_s`` = bytes that must move (the [rows, 2 d] input read, the [rows, d]
output written) / time, against the H200's 4.1 TB/s device copy. bf16.
"""

from __future__ import annotations

import sys

import torch

import harness
import timing

import flashinfer

FAMILY = "activation"
TIMING = timing.METHOD
ITERS = 50

# ------------------------------------------------------------------------------ shape table
#: (function, rows, d): Llama-3.1-8B's MLP (intermediate 14336) at prefill and decode sizes
FUNCTIONS = ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul")
FULL = [("silu_and_mul", rows, 14336) for rows in (1, 64, 4096)] + [
    (fn, 4096, 14336) for fn in FUNCTIONS[1:]]
QUICK = [("silu_and_mul", 4096, 14336)]
TINY = [(fn, 2, 64) for fn in FUNCTIONS]


def cases(args) -> list[dict]:
    """The shape table of ``args.shapes``, a case per (function, rows, d)."""
    table = {"full": FULL, "quick": QUICK, "tiny": TINY}[args.shapes]
    return [{"case": f"{fn} {rows}x{d}", "function": fn, "rows": rows, "d": d}
            for fn, rows, d in table]


def backends(case: dict, args) -> list[str]:
    """auto and every declared kernel of op act_and_mul (CPU: auto and the reference)."""
    if args.device == "cpu":
        return harness.pick(args, ["auto", "reference"])
    return harness.pick(args, ["auto"] + harness.declared_kernels("act_and_mul"))


def run_case(case: dict, args) -> dict:
    """Every backend's graph and eager time of one case, with its TB/s."""
    rows, d = case["rows"], case["d"]
    nbytes = rows * d * 2 * 3
    sets = [(torch.randn(rows, 2 * d, device=args.device, dtype=torch.bfloat16),)
            for _ in range(timing.copies(nbytes, args.device))]
    function = getattr(flashinfer, case["function"])
    return {"bytes": nbytes, "backends": harness.time_backends(
        sets, lambda a, b: function(*a, backend=b), backends(case, args), args.iters,
        nbytes=nbytes)}


def main(argv=None, prog=None) -> int:
    return harness.main(sys.modules[__name__], argv, prog)


if __name__ == "__main__":
    sys.exit(main())
