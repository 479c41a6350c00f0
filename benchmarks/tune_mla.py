"""Launch-shape sweep of the Triton MLA kernel (backends/triton/mla.py): (block_m, block_n,
warps, stages, splits) at DeepSeek shapes (ckv 512 + kpe 64, bf16), 128 and 16 heads, q_len 1
and 2, page 1 and 64; eager run() time of the runner (10 calls a group, median of 20 groups),
checked against the default launch's output.

    python benchmarks/tune_mla.py --out tune_mla.jsonl [--budget-s 400]

``launch_config`` in ``flashinfer/backends/triton/mla.py`` is set from its output.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch

from timing import eager_ms

import flashinfer
from flashinfer.backends.triton.mla import launch_config, make_runner

#: (heads, batch, kv, q_len, page)
SHAPES = [(128, 64, 4096, 1, 1), (16, 64, 4096, 1, 1), (128, 64, 4096, 2, 1),
          (128, 16, 4096, 1, 64), (16, 128, 16384, 1, 64)]


def configs(heads: int, q_len: int):
    rows = heads * q_len
    block_ms = [64, 32] if rows >= 64 else [16, 32] if rows > 16 else [16]
    for bm, bn, warps, stages in itertools.product(block_ms, (32, 64), (4, 8), (1, 2, 3)):
        if bn == 64 and stages == 3:
            continue  # 3 x 72 KB of latent tiles: past the shared memory
        yield dict(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)


def setup(heads, batch, kv, q_len, page):
    torch.manual_seed(0)
    pages_each = -(-kv // page)
    n_pages = batch * pages_each
    cache = torch.randn(n_pages, page, 576, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(batch * q_len, heads, 576, device="cuda", dtype=torch.bfloat16)
    w = flashinfer.BatchMLAPagedAttentionWrapper(
        torch.empty(256 << 20, dtype=torch.uint8, device="cuda"), backend="triton")
    w.plan(torch.arange(batch + 1, dtype=torch.int32) * q_len,
           torch.arange(batch + 1, dtype=torch.int32) * pages_each,
           torch.randperm(n_pages, dtype=torch.int32), torch.full((batch,), kv, dtype=torch.int32),
           heads, 512, 64, page, q_len > 1, 192 ** -0.5, torch.bfloat16, torch.bfloat16)
    args = (q[..., :512], q[..., 512:], cache[..., :512], cache[..., 512:])
    return w, args


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tune_mla.jsonl")
    ap.add_argument("--budget-s", type=float, default=400)
    args = ap.parse_args()
    start = time.time()
    with open(args.out, "a") as f:
        for shape in SHAPES:
            heads, batch, kv, q_len, page = shape
            w, run_args = setup(*shape)
            base = launch_config(w._plan)
            want = w.run(*run_args)
            flops = 2 * heads * batch * kv * q_len * (576 + 512)
            for cfg in configs(heads, q_len):
                if time.time() - start > args.budget_s:
                    return
                for splits in (None, 2 * base.num_splits):
                    row = {"shape": shape, **cfg, "num_splits": splits or base.num_splits}
                    try:
                        runner = make_runner(w._plan, num_splits=splits, **cfg)
                        scales = w._scales(w._plan, run_args[2], None, None, None)
                        out = torch.empty_like(want)
                        call = lambda: runner(*run_args, out, None, scales)  # noqa: E731
                        call()
                        row["max_err"] = (out.float() - want.float()).abs().max().item()
                        ms = eager_ms(lambda: [call() for _ in range(10)], 20, calls=10, warmup=1)
                        row.update(ms=ms, tflops=flops / ms / 1e9)
                    except Exception as exc:  # noqa: BLE001 - a config that fails is a finding
                        row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    print(row, flush=True)
            w = run_args = None
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
