"""Fused-MoE benchmark (issue 5): a DeepSeek-V3 MoE layer (256 experts, top-8, hidden 7168,
intermediate 2048, fp8 128x128 block-scaled experts) for 1 to 4096 tokens, every backend.

    python benchmarks/moe.py --out results.json
    PYTHONPATH=/tmp/anchor:/tmp/site python benchmarks/moe.py --impl upstream --out up.json
    python benchmarks/moe.py --smoke --out /tmp/smoke.json      # CPU: a tiny layer

The layer: DeepSeek-V3 routing (``fused_topk_deepseek``: sigmoid scores + bias, 8 groups, top-4
groups, top-8 experts, routed scaling 2.5) then ``cutlass_fused_moe`` with
``use_deepseek_fp8_block_scale=True`` (bf16 activations, fp8 weights, 128x128 scales) — the same
calls on upstream FlashInfer (run in a separate process; upstream's CUTLASS MoE is JIT-built,
so its first call is timed and reported). Tokens are routed with random logits, so expert loads
are random-uniform; ``--skew`` routes 90 % of the tokens to 8 experts (imbalance). Time: CUDA
events over back-to-back eager calls (the torch path reads expert counts on the host, so it
cannot be captured), median of ``--iters``; TFLOP/s counts 2 * 3 * tokens * top_k * H * I.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time

import torch

from bench_timing import cuda_events

import flashinfer

LAYER = {"experts": 256, "top_k": 8, "hidden": 7168, "inter": 2048, "n_group": 8,
         "topk_group": 4, "routed_scaling": 2.5}
SMOKE = {"experts": 8, "top_k": 2, "hidden": 256, "inter": 128, "n_group": 4, "topk_group": 2,
         "routed_scaling": 1.0}
TOKENS = (1, 16, 64, 256, 1024, 4096)


def _weights(layer: dict, device: str):
    """fp8 experts with 128x128 dequantisation scales: (w1, s1, w2, s2)."""
    e, h, i = layer["experts"], layer["hidden"], layer["inter"]

    def block_quant(shape):
        w = torch.randn(*shape, device=device) / shape[-1] ** 0.5
        blocks = w.reshape(e, shape[1] // 128, 128, shape[2] // 128, 128)
        scale = blocks.abs().amax(dim=(2, 4)).clamp_min(1e-8) / 448.0
        q = (blocks / scale[:, :, None, :, None]).reshape(shape).to(torch.float8_e4m3fn)
        return q, scale.float()

    w1, s1 = block_quant((e, 2 * i, h))
    w2, s2 = block_quant((e, h, i))
    return w1, s1, w2, s2


def _route(layer: dict, tokens: int, device: str, skew: bool, plain: bool = False):
    """``(ids, values)`` of the layer's routing on random logits; ``plain``: torch's top-k of the
    sigmoid scores instead of ``fused_topk_deepseek`` (upstream builds that op by JIT, which does
    not fit a device call; the loads are random-uniform either way)."""
    logits = torch.randn(tokens, layer["experts"], device=device)
    if skew:
        logits[:, :8] += 6.0 * (torch.rand(tokens, 1, device=device) < 0.9)
    k = layer["top_k"]
    if plain:
        values, ids = torch.sigmoid(logits).topk(k, dim=-1)
        return ids.int(), values / values.sum(-1, keepdim=True) * layer["routed_scaling"]
    bias = torch.randn(layer["experts"], device=device) * 0.1
    values = torch.empty(tokens, k, device=device)
    ids = torch.empty(tokens, k, dtype=torch.int32, device=device)
    flashinfer.fused_topk_deepseek(logits, bias, layer["n_group"], layer["topk_group"], k,
                                   layer["routed_scaling"], values, ids)
    return ids, values


def _layer_call(x, ids, values, weights, backend: str | None):
    w1, s1, w2, s2 = weights
    kwargs = {} if backend is None else {"backend": backend}
    return flashinfer.cutlass_fused_moe(x, ids, values, w1, w2, x.dtype, [s1, s2],
                                        use_deepseek_fp8_block_scale=True, **kwargs)[0]


#: untimed calls before each backend's timed ones: at 1 token the first backend timed read
#: about twice its later time (``auto`` 0.61 ms against ``triton``'s 0.33 for the same kernels,
#: moe_ours_plain_routing_h200_2026-11-30_2022utc.json)
WARMUP_CALLS = 3


def _time_ms(fn, iters: int, cuda: bool) -> float:
    for _ in range(WARMUP_CALLS):
        fn()
    times = []
    for _ in range(iters):
        if cuda:
            start, end = cuda_events()
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--impl", choices=("ours", "upstream"), default="ours")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--skew", action="store_true", help="90 %% of tokens to 8 experts")
    ap.add_argument("--smoke", action="store_true", help="CPU, a tiny layer")
    ap.add_argument("--plain-routing", action="store_true",
                    help="route with torch's top-k instead of fused_topk_deepseek (upstream: "
                         "no JIT build of its routing op)")
    ap.add_argument("--tokens", type=int, nargs="+", default=None,
                    help="token counts (default: 1 16 64 256 1024 4096)")
    args = ap.parse_args()
    device = "cpu" if args.smoke else "cuda"
    layer = SMOKE if args.smoke else LAYER
    tokens_grid = (1, 7) if args.smoke else tuple(args.tokens or TOKENS)
    backends = [None] if args.impl == "upstream" else (
        ["auto", "reference", "torch"] if args.smoke else ["auto", "torch", "triton"])
    torch.manual_seed(0)
    weights = _weights(layer, device)
    doc = {"command": "python " + " ".join(sys.argv), "impl": args.impl,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
           "torch": torch.__version__, "layer": layer, "skew": args.skew,
           "routing": "torch top-k of sigmoid scores" if args.plain_routing else
                      "fused_topk_deepseek",
           "timing": "eager calls between CUDA events (perf_counter on CPU), median of --iters "
                     f"after {WARMUP_CALLS} untimed calls; "
                     "first_call_s: the first call of the process (plans, JIT builds)",
           "results": []}
    flops_per_token = 2 * 3 * layer["top_k"] * layer["hidden"] * layer["inter"]
    for tokens in tokens_grid:
        x = torch.randn(tokens, layer["hidden"], device=device, dtype=torch.bfloat16)
        ids, values = _route(layer, tokens, device, args.skew, args.plain_routing)
        point = {"tokens": tokens, "backends": {}}
        for backend in backends:
            label = backend or "upstream"
            try:
                t0 = time.perf_counter()
                _layer_call(x, ids, values, weights, backend)
                if device == "cuda":
                    torch.cuda.synchronize()
                first = time.perf_counter() - t0
                ms = _time_ms(lambda: _layer_call(x, ids, values, weights, backend), args.iters,
                              device == "cuda")
                entry = {"ms": ms, "tflops": flops_per_token * tokens / ms / 1e9,
                         "first_call_s": first}
                if backend == "auto":
                    with flashinfer.record_decisions() as log:
                        _layer_call(x, ids, values, weights, backend)
                    entry["chosen"] = "+".join(sorted({d.name for d in log}))
            except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                entry = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
            point["backends"][label] = entry
            print(f"tokens={tokens:<5d} {label:10s} " + (
                f"{entry['ms']:9.3f} ms {entry['tflops']:7.1f} TFLOP/s first {entry['first_call_s']:.2f} s"
                if "ms" in entry else entry["error"]), flush=True)
        doc["results"].append(point)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
