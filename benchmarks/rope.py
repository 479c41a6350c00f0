"""RoPE benchmark: apply_rope_pos_ids, apply_llama31_rope_pos_ids and
apply_rope_with_cos_sin_cache, every kernel the capability database declares and ``auto``.

    python benchmarks/rope.py                  # GPU: the full table below; CPU: tiny shapes
    flashinfer bench rope --shapes quick       # the same runner through the CLI

Bandwidth-bound: ``tb_per_s`` = bytes that must move (q and k read and written once, the
positions read) / time, against the H200's 4.1 TB/s device copy. bf16 q / k, int32 positions
drawn from 0..8191, fp32 cos / sin cache.
"""

from __future__ import annotations

import sys

import torch

import harness
import timing

import flashinfer

FAMILY = "rope"
TIMING = timing.METHOD
ITERS = 50
MAX_POSITION = 8192

# ------------------------------------------------------------------------------ shape table
#: (function, tokens, q heads, k heads, head dim)
FUNCTIONS = ("apply_rope_pos_ids", "apply_llama31_rope_pos_ids", "apply_rope_with_cos_sin_cache")
FULL = [(fn, 8192, 32, 8, 128) for fn in FUNCTIONS] + [("apply_rope_pos_ids", 1, 32, 8, 128)]
QUICK = [("apply_rope_pos_ids", 8192, 32, 8, 128)]
TINY = [(fn, 4, 2, 1, 16) for fn in FUNCTIONS]


def cases(args) -> list[dict]:
    """The shape table of ``args.shapes``, a case per (function, tokens, heads, head dim)."""
    table = {"full": FULL, "quick": QUICK, "tiny": TINY}[args.shapes]
    return [{"case": f"{fn} nnz{n} hq{hq} hk{hk} d{d}", "function": fn, "nnz": n, "hq": hq,
             "hk": hk, "d": d} for fn, n, hq, hk, d in table]


def backends(case: dict, args) -> list[str]:
    """auto and every declared kernel of op rope (CPU: auto and the reference)."""
    if args.device == "cpu":
        return harness.pick(args, ["auto", "reference"])
    return harness.pick(args, ["auto"] + harness.declared_kernels("rope"))


def build(case: dict, device: str) -> tuple[list, object, int]:
    """(rotated argument sets, call(args, backend), bytes that must move)."""
    fn, n, hq, hk, d = (case[k] for k in ("function", "nnz", "hq", "hk", "d"))
    nbytes = 2 * n * (hq + hk) * d * 2 + 4 * n

    def make():
        q = torch.randn(n, hq, d, device=device, dtype=torch.bfloat16)
        k = torch.randn(n, hk, d, device=device, dtype=torch.bfloat16)
        pos = torch.randint(0, MAX_POSITION, (n,), device=device, dtype=torch.int32)
        if fn == "apply_rope_with_cos_sin_cache":  # vLLM's layout: flat heads, int64 positions
            return pos.long(), q.reshape(n, hq * d), k.reshape(n, hk * d)
        return q, k, pos
    if fn == "apply_rope_with_cos_sin_cache":
        cache = torch.randn(MAX_POSITION, d, device=device)
        call = lambda a, b: flashinfer.apply_rope_with_cos_sin_cache(  # noqa: E731
            *a, d, cache, backend=b)
    else:
        function = getattr(flashinfer, fn)
        call = lambda a, b: function(*a, backend=b)  # noqa: E731
    return [make() for _ in range(timing.copies(nbytes, device))], call, nbytes


def run_case(case: dict, args) -> dict:
    """Every backend's graph and eager time of one case, with its TB/s."""
    sets, call, nbytes = build(case, args.device)
    return {"bytes": nbytes, "backends": harness.time_backends(sets, call, backends(case, args),
                                                               args.iters, nbytes=nbytes)}


def main(argv=None, prog=None) -> int:
    return harness.main(sys.modules[__name__], argv, prog)


if __name__ == "__main__":
    sys.exit(main())
