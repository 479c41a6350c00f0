"""Launch-configuration sweep of our Triton fused MoE on the DeepSeek-V3 layer (the layer of
``moe.py``): every configuration below at every token count, GPU time of a captured call.

    python benchmarks/tune_moe.py --out tune_moe.json

Prints the best configuration per token count beside the one ``launch_config`` picks now; the
table in ``flashinfer/backends/triton/moe.py`` is set from this output.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

import torch

from timing import graph_ms
from moe import LAYER, TOKENS, expert_weights, route

import flashinfer
from flashinfer.backends.triton import moe as tmoe

#: LaunchConfig fields: (block_m, block_n1, block_n2, block_k, warps1, stages1, warps2, stages2,
#: group_m); W8A8 (fp8 block-scaled experts) needs block_k == block_n1 == 128
CONFIGS = [
    (16, 128, 128, 128, 4, 4, 4, 4, 8), (16, 128, 128, 128, 8, 4, 8, 4, 8),
    (32, 128, 128, 128, 4, 4, 4, 4, 8), (32, 128, 128, 128, 8, 3, 4, 4, 8),
    (64, 128, 128, 128, 8, 3, 4, 4, 8), (64, 128, 128, 128, 8, 3, 4, 3, 8),
    (64, 128, 256, 128, 8, 3, 8, 3, 8), (64, 128, 128, 128, 8, 3, 8, 3, 8),
    (128, 128, 128, 128, 8, 3, 4, 4, 8),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    torch.manual_seed(0)
    weights = expert_weights(tuple(LAYER.items()), "cuda")
    w1, s1, w2, s2 = weights
    original = tmoe.launch_config
    doc = {"command": "python " + " ".join(sys.argv),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(), "layer": LAYER, "results": []}
    for tokens in TOKENS["full"]:
        x = torch.randn(tokens, LAYER["hidden"], device="cuda", dtype=torch.bfloat16)
        ids, values = route(LAYER, tokens, "cuda", False)
        out = torch.empty_like(x)

        def call(_args, _backend):
            flashinfer.cutlass_fused_moe(x, ids, values, w1, w2, x.dtype, [s1, s2],
                                         use_deepseek_fp8_block_scale=True, output=out,
                                         backend="triton")

        now = original(tokens * LAYER["top_k"], LAYER["experts"], True, True)
        row = {"tokens": tokens, "current": list(now.__dict__.values()), "configs": {}}
        for cfg in CONFIGS:
            tmoe.launch_config = lambda *a, _c=cfg: tmoe.LaunchConfig(*_c)
            try:
                ms = graph_ms([None], call, "triton", args.iters)
            except Exception as exc:  # noqa: BLE001 - a config that fails to compile is a finding
                ms = f"{type(exc).__name__}: {str(exc)[:100]}"
            row["configs"][str(cfg)] = ms
        tmoe.launch_config = original
        timed = {c: v for c, v in row["configs"].items() if isinstance(v, float)}
        best = min(timed, key=timed.get)
        cur = row["configs"].get(str(tuple(row["current"])))
        print(f"tokens={tokens:<5d} best {best} {timed[best]:.3f} ms; current {row['current']} "
              f"{cur if cur is not None else 'not in sweep'}", flush=True)
        doc["results"].append(row)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
