"""Paged causal prefill at pages of 256: FA2 reading the cache in place (block table) against
cuDNN's paged graph and ``auto``, on the device machine.

    python benchmarks/probe_fa2_block_table.py [--iters 10] [--out fa2_block_table.json]

Shapes of issue 3's prefill grid (1 x 16384, 4 x 4096, 32 x 1024; 32/8 heads, d128, bf16) with
``attention.py``'s runner, its page size set to 256. FA2 must import (benchmarks/build_fa2.py).
"""

from __future__ import annotations

import argparse
import datetime
import json

import torch

import attention

BACKENDS = ("auto", "cudnn", "flash_attn:fa2_block_table")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    attention.PAGE = 256
    rows = []
    for requests, tokens in attention.PREFILL_GRID:
        for backend in BACKENDS:
            try:
                entry = attention.bench_prefill("paged", requests, tokens, backend, args.iters)
            except Exception as err:  # a backend that cannot run the case: say so, go on
                entry = {"error": f"{type(err).__name__}: {err}"[:200]}
            rows.append({"requests": requests, "tokens": tokens, "backend": backend, **entry})
            print(f"paged page 256 {requests:3d} x {tokens:5d} {backend:28s} "
                  f"{attention._describe('paged', entry)}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": "python benchmarks/probe_fa2_block_table.py "
                       f"--iters {args.iters} --out {args.out}",
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                       "device": torch.cuda.get_device_name(), "page_size": 256,
                       "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
