"""Launch-shape sweep of the Triton MLA kernel (backends/triton/mla.py): (block_m, block_n,
warps, stages, splits 2-16) at DeepSeek shapes (ckv 512 + kpe 64, bf16
and fp8 caches), 16 and 128 heads, q_len 1 and 2, pages 1 / 16; eager time of the runner (10
calls a group, median of 20 groups), checked against the default launch's output.

    python benchmarks/tune_mla.py --out tune_mla.jsonl [--budget-s 400]

``launch_config`` in ``flashinfer/backends/triton/mla.py`` is set from its output.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time

import torch

from harness import device_name, versions
from timing import eager_ms

import flashinfer
from flashinfer.backends.triton.mla import launch_config, make_runner

#: (heads, batch, kv, q_len, page, kv dtype)
SHAPES = [(16, 64, 4096, 1, 1, "bfloat16"), (16, 128, 4096, 1, 1, "bfloat16"),
          (16, 64, 4096, 1, 16, "bfloat16"), (16, 64, 4096, 2, 1, "bfloat16"),
          (16, 16, 4096, 1, 1, "bfloat16"), (16, 128, 16384, 1, 1, "bfloat16"),
          (16, 64, 4096, 1, 1, "float8_e4m3fn"), (128, 64, 4096, 1, 1, "bfloat16")]
#: split counts tried at each config
SPLITS = (2, 3, 4, 5, 6, 8, 10, 12, 16)


def configs(heads: int, q_len: int):
    """Row tiles of 64 at 32 / 64 tokens a step, 8 warps; of 16-32 rows at 32 tokens a step
    (3 and 4 stages) and 64 (2 stages), 4 warps."""
    rows = heads * q_len
    if rows >= 64:
        for bn in (32, 64):
            yield dict(block_m=64, block_n=bn, num_warps=8, num_stages=2)
        return
    bm = 16 if rows <= 16 else 32
    for bn, stages in ((32, 3), (32, 4), (64, 2)):
        yield dict(block_m=bm, block_n=bn, num_warps=4, num_stages=stages)


def setup(heads, batch, kv, q_len, page, kv_dtype):
    torch.manual_seed(0)
    pages_each = -(-kv // page)
    n_pages = batch * pages_each
    cache = torch.randn(n_pages, page, 576, device="cuda").to(getattr(torch, kv_dtype))
    q = torch.randn(batch * q_len, heads, 576, device="cuda", dtype=torch.bfloat16)
    w = flashinfer.BatchMLAPagedAttentionWrapper(
        torch.empty(256 << 20, dtype=torch.uint8, device="cuda"), backend="triton")
    w.plan(torch.arange(batch + 1, dtype=torch.int32) * q_len,
           torch.arange(batch + 1, dtype=torch.int32) * pages_each,
           torch.randperm(n_pages, dtype=torch.int32), torch.full((batch,), kv, dtype=torch.int32),
           heads, 512, 64, page, q_len > 1, 192 ** -0.5, torch.bfloat16, cache.dtype)
    args = (q[..., :512], q[..., 512:], cache[..., :512], cache[..., 512:])
    return w, args


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tune_mla.jsonl")
    ap.add_argument("--budget-s", type=float, default=400)
    args = ap.parse_args()
    start = time.time()
    with open(args.out, "a") as f:
        f.write(json.dumps({"header": {
            "command": "python3 " + " ".join(sys.argv),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "device": device_name(), "versions": versions(),
            "shows": "Triton MLA kernel launch sweep (block_n, warps, stages, splits): "
                     "eager ms per call, max error against the default launch"}}) + "\n")
        for shape in SHAPES:
            heads, batch, kv, q_len, page, kv_dtype = shape
            w, run_args = setup(*shape)
            base = launch_config(w._plan)
            fp8 = kv_dtype != "bfloat16"
            scales = w._scales(w._plan, run_args[2], 1.0 if fp8 else None, None,
                               1.0 if fp8 else None)
            want = torch.empty(batch * q_len, heads, 512, dtype=torch.bfloat16, device="cuda")
            make_runner(w._plan)(*run_args, want, None, scales)
            flops = 2 * heads * batch * kv * q_len * (576 + 512)
            nbytes = batch * kv * 576 * run_args[2].element_size()
            for cfg in configs(heads, q_len):
                if time.time() - start > args.budget_s:
                    return
                for splits in SPLITS:
                    row = {"shape": shape, **cfg, "num_splits": splits,
                           "default_splits": base.num_splits}
                    try:
                        runner = make_runner(w._plan, num_splits=splits, **cfg)
                        out = torch.empty_like(want)
                        call = lambda: runner(*run_args, out, None, scales)  # noqa: E731
                        call()
                        row["max_err"] = (out.float() - want.float()).abs().max().item()
                        ms = eager_ms(lambda: [call() for _ in range(10)], 20, calls=10, warmup=1)
                        row.update(ms=ms, tflops=flops / ms / 1e9, tb_per_s=nbytes / ms / 1e9)
                    except Exception as exc:  # noqa: BLE001 - a config that fails is a finding
                        row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    print(row, flush=True)
            w = run_args = None
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
