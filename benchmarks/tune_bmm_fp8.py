"""Launch shapes of the Triton batched fp8 GEMM (``bmm_fp8``) at DeepSeek-V3's MLA products
(batch 128: W_UK 512x128, W_UV 128x512) at decode-size M (1, 16) and M = 128, against cuDNN's
graph, GPU time of CUDA graphs replayed in turn (``gemm.py``'s inputs and timing).

    python benchmarks/tune_bmm_fp8.py --out tune_bmm_fp8.json [--ms 1,16,128]

At M = 1 and 16 ``auto`` (triton) took 6.4 / 6.6 us at W_UV against cuDNN's 5.7 / 6.0
(benchmarks/results/gemm_bmm_fp8_rules_h200_2026-11-30_1750utc.json): each candidate below is
a ``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)`` for ``bmm_fp8_launch``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

import torch

from timing import capture, interleaved_graph_ms
from gemm import BATCHED, GRAPH_PASSES, call, make_inputs

from flashinfer.backends.triton import gemm as tgemm

DECODE_CANDIDATES = [
    (16, 128, 128, 4, 4), (16, 64, 128, 4, 4), (16, 32, 128, 4, 4), (16, 128, 256, 4, 3),
    (16, 64, 256, 4, 3), (16, 128, 512, 4, 2), (16, 64, 128, 2, 4), (16, 128, 128, 8, 4),
    (16, 64, 128, 8, 4), (16, 64, 128, 4, 3), (16, 64, 128, 4, 2), (16, 64, 64, 4, 4),
    (16, 64, 64, 4, 6), (16, 128, 64, 4, 4),
]
#: M = 128 (the first is the launch of 2026-11-30): W_UV has one 128-row tile per batch entry,
#: 128 programs on 132 SMs, so the candidates halve the tile's rows or columns
PREFILL_CANDIDATES = [
    (128, 128, 128, 8, 3), (64, 128, 128, 4, 4), (64, 128, 128, 4, 3), (64, 128, 128, 8, 3),
    (128, 64, 128, 4, 4), (128, 64, 128, 8, 3), (128, 64, 128, 4, 3), (64, 64, 128, 4, 4),
    (128, 128, 64, 8, 4), (64, 128, 64, 4, 4), (128, 128, 128, 8, 4), (128, 128, 128, 4, 3),
]


def candidates(m: int) -> list:
    return DECODE_CANDIDATES if m <= 16 else PREFILL_CANDIDATES


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--ms", default="1,16", help="comma-separated M values")
    args = ap.parse_args()
    torch.manual_seed(0)
    original = tgemm.bmm_fp8_launch
    doc = {"command": "python " + " ".join(sys.argv),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(), "timing": "us of GPU time per call, CUDA "
           "graphs of 8 passes over 8 rotated inputs, replayed in turn, median of --iters",
           "results": []}
    for name, (batch, n, k) in BATCHED.items():
        for m in (int(v) for v in args.ms.split(",")):
            sets = [make_inputs("bmm_fp8", m, n, k, "cuda", batch) for _ in range(8)] * GRAPH_PASSES
            graphs = {"cudnn": capture(sets, lambda a, b: call("bmm_fp8", a, b), "cudnn")}
            for cand in candidates(m):
                tgemm.bmm_fp8_launch = lambda *a, _c=cand: _c
                try:
                    graphs[str(cand)] = capture(sets, lambda a, b: call("bmm_fp8", a, b),
                                                "triton")
                except Exception as exc:  # noqa: BLE001 - a shape that does not compile
                    print(f"{name} m={m} {cand}: {type(exc).__name__}: {str(exc)[:80]}")
                finally:
                    tgemm.bmm_fp8_launch = original
            us = {c: v * 1e3 for c, v in interleaved_graph_ms(
                {c: g for c, g in graphs.items() if g is not None}, len(sets), args.iters).items()}
            best = min((c for c in us if c != "cudnn"), key=us.get)
            print(f"{name} m={m:<3d} cudnn {us.get('cudnn', float('nan')):.2f} us, default "
                  f"{us.get(str(candidates(m)[0]), float('nan')):.2f}, best {best} {us[best]:.2f}",
                  flush=True)
            doc["results"].append({"shape": name, "m": m, "n": n, "k": k, "batch": batch,
                                   "us": us})
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
