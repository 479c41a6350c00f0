"""First calls of the DeepSeek-V3 MoE layer (moe.py's LAYER) in a fresh process: the time of
each call at the given token counts, weights made first and not timed. A call that finds its
Triton kernels in the cache (``flashinfer warmup --moe 256,8,7168,2048``) takes well under a
second; one that compiles them takes seconds.

    cd benchmarks && python first_call_moe.py [--tokens 16 1024]
"""

from __future__ import annotations

import argparse
import time

import torch

import flashinfer
from moe import LAYER, _route, _weights


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[16, 1024])
    args = ap.parse_args()
    w1, s1, w2, s2 = _weights(LAYER, "cuda")
    for tokens in args.tokens:
        x = torch.randn(tokens, LAYER["hidden"], device="cuda", dtype=torch.bfloat16)
        ids, values = _route(LAYER, tokens, "cuda", False)
        torch.cuda.synchronize()
        started = time.perf_counter()
        flashinfer.cutlass_fused_moe(x, ids, values, w1, w2, x.dtype, [s1, s2],
                                     use_deepseek_fp8_block_scale=True)
        torch.cuda.synchronize()
        print(f"first MoE call at {tokens} tokens: {time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main()
