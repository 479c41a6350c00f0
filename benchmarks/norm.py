"""Norm benchmark: rmsnorm, fused_add_rmsnorm, gemma_rmsnorm and layernorm, every kernel the
capability database declares and ``auto``.

    python benchmarks/norm.py                  # GPU: the full table below; CPU: tiny shapes
    flashinfer bench norm --shapes quick       # the same runner through the CLI

Bandwidth-bound: ``tb_per_s`` = bytes that must move (each input read once, each output written
once) / time, against the H200's 4.1 TB/s device copy. bf16 rows, fp32 layernorm gamma / beta.
"""

from __future__ import annotations

import sys

import torch

import harness
import timing

import flashinfer

FAMILY = "norm"
TIMING = timing.METHOD
ITERS = 50

# ------------------------------------------------------------------------------ shape table
#: (function, rows, hidden)
FULL = [("rmsnorm", 1, 4096), ("rmsnorm", 4096, 4096), ("rmsnorm", 16384, 8192),
        ("fused_add_rmsnorm", 4096, 4096), ("gemma_rmsnorm", 4096, 4096),
        ("layernorm", 4096, 4096)]
QUICK = [("rmsnorm", 4096, 4096), ("fused_add_rmsnorm", 4096, 4096)]
TINY = [("rmsnorm", 2, 64), ("fused_add_rmsnorm", 2, 64), ("layernorm", 2, 64)]
#: public function -> capability-database op
DB_OP = {"rmsnorm": "rmsnorm", "fused_add_rmsnorm": "rmsnorm", "gemma_rmsnorm": "rmsnorm",
         "layernorm": "layernorm"}


def cases(args) -> list[dict]:
    """The shape table of ``args.shapes``, a case per (function, rows, hidden)."""
    table = {"full": FULL, "quick": QUICK, "tiny": TINY}[args.shapes]
    return [{"case": f"{fn} {rows}x{hidden}", "function": fn, "rows": rows, "hidden": hidden}
            for fn, rows, hidden in table]


def backends(case: dict, args) -> list[str]:
    """auto and every declared kernel of the function's op (CPU: auto and the reference)."""
    if args.device == "cpu":
        return harness.pick(args, ["auto", "reference"])
    return harness.pick(args, ["auto"] + harness.declared_kernels(DB_OP[case["function"]]))


def build(case: dict, device: str) -> tuple[list, object, int]:
    """(rotated argument sets, call(args, backend), bytes that must move)."""
    fn, rows, hidden = case["function"], case["rows"], case["hidden"]
    row_bytes = rows * hidden * 2
    if fn == "fused_add_rmsnorm":  # reads input and residual, writes both in place
        nbytes = 4 * row_bytes
        make = lambda: (torch.randn(rows, hidden, device=device, dtype=torch.bfloat16),  # noqa: E731
                        torch.randn(rows, hidden, device=device, dtype=torch.bfloat16),
                        torch.randn(hidden, device=device, dtype=torch.bfloat16))
        return ([make() for _ in range(timing.copies(nbytes, device))],
                lambda a, b: flashinfer.fused_add_rmsnorm(*a, backend=b), nbytes)
    nbytes = 2 * row_bytes
    if fn == "layernorm":
        make = lambda: (torch.randn(rows, hidden, device=device, dtype=torch.bfloat16),  # noqa: E731
                        torch.randn(hidden, device=device), torch.randn(hidden, device=device))
    else:
        make = lambda: (torch.randn(rows, hidden, device=device, dtype=torch.bfloat16),  # noqa: E731
                        torch.randn(hidden, device=device, dtype=torch.bfloat16))
    function = getattr(flashinfer, fn)
    return ([make() for _ in range(timing.copies(nbytes, device))],
            lambda a, b: function(*a, backend=b), nbytes)


def run_case(case: dict, args) -> dict:
    """Every backend's graph and eager time of one case, with its TB/s."""
    sets, call, nbytes = build(case, args.device)
    return {"bytes": nbytes, "backends": harness.time_backends(sets, call, backends(case, args),
                                                               args.iters, nbytes=nbytes)}


def main(argv=None, prog=None) -> int:
    return harness.main(sys.modules[__name__], argv, prog)


if __name__ == "__main__":
    sys.exit(main())
