"""Fused-MoE benchmark: a DeepSeek-V3 MoE layer (256 experts, top-8, hidden 7168, intermediate
2048, fp8 128x128 block-scaled experts) for 1 to 4096 tokens, every backend; upstream
FlashInfer 0.7.2's ``cutlass_fused_moe`` side by side.

    python benchmarks/moe.py                               # GPU: the token counts below
    flashinfer bench moe --shapes quick
    PYTHONPATH=/tmp/anchor:/tmp/site python benchmarks/moe.py --impl upstream --plain-routing
    python benchmarks/moe.py --plot ours.jsonl upstream.jsonl

The layer: DeepSeek-V3 routing (``fused_topk_deepseek``: sigmoid scores + bias, 8 groups, top-4
groups, top-8 experts, routed scaling 2.5; ``--plain-routing``: torch's top-k of the sigmoid
scores, which upstream runs without a JIT build) then ``cutlass_fused_moe`` with
``use_deepseek_fp8_block_scale=True`` (bf16 activations, fp8 weights, 128x128 scales): the same
calls on upstream FlashInfer, in a separate process (``bash benchmarks/device.sh upstream moe``).
Tokens are routed with random logits, so expert loads are random-uniform; ``--skew`` routes
90 % of the tokens to 8 experts. Time: CUDA events over back-to-back eager calls (the torch
path reads expert counts on the host, so it cannot be captured), median of ``--iters`` after
three untimed calls; ``first_call_s``: a backend's first call in the process (plans, JIT);
TFLOP/s counts 2 * 3 * tokens * top_k * hidden * intermediate.
"""

from __future__ import annotations

import functools
import sys
import time

import torch

import harness
import timing

import flashinfer

FAMILY = "moe"
IMPLS = ("ours", "upstream")
TIMING = ("eager calls between CUDA events (perf_counter on the CPU), median of the iterations "
          "after 3 untimed calls; first_call_s: the backend's first call of the process")

# ------------------------------------------------------------------------------ shape table
LAYER = {"experts": 256, "top_k": 8, "hidden": 7168, "inter": 2048, "n_group": 8,
         "topk_group": 4, "routed_scaling": 2.5}
TINY_LAYER = {"experts": 8, "top_k": 2, "hidden": 256, "inter": 128, "n_group": 4,
              "topk_group": 2, "routed_scaling": 1.0}
TOKENS = {"full": (1, 16, 64, 256, 1024, 4096), "quick": (16, 1024), "tiny": (1, 7)}
#: untimed calls before each backend's timed ones: at 1 token the first backend timed read
#: about twice its later time (``auto`` 0.61 ms against ``triton``'s 0.33 for the same kernels,
#: moe_ours_plain_routing_h200_2026-11-30_2022utc.json)
WARMUP_CALLS = 3


def add_arguments(parser) -> None:
    parser.add_argument("--skew", action="store_true", help="90 %% of the tokens to 8 experts")
    parser.add_argument("--plain-routing", action="store_true",
                        help="route with torch's top-k instead of fused_topk_deepseek (upstream: "
                             "no JIT build of its routing op)")
    parser.add_argument("--tokens", type=int, nargs="+", default=None,
                        help="token counts instead of the shape table's")


def layer_of(args) -> dict:
    """The layer of the shape table: DeepSeek-V3's, or a tiny one on the CPU."""
    return TINY_LAYER if args.shapes == "tiny" else LAYER


def cases(args) -> list[dict]:
    """A case per token count (``--tokens``, else the shape table's)."""
    return [{"case": f"moe tokens={t}", "tokens": t} for t in args.tokens or TOKENS[args.shapes]]


def backends(case: dict, args) -> list[str]:
    """ours: auto, torch, triton (CPU: auto and the reference); upstream: its one call."""
    if args.impl == "upstream":
        return ["upstream"]
    return harness.pick(args, ["auto", "reference"] if args.device == "cpu"
                        else ["auto", "torch", "triton"])


def prepare(args) -> dict:
    return {"layer": layer_of(args), "skew": args.skew,
            "routing": "torch top-k of sigmoid scores" if args.plain_routing else "fused_topk_deepseek"}


@functools.lru_cache(maxsize=2)
def expert_weights(layer_items: tuple, device: str):
    """fp8 experts with 128x128 dequantisation scales: (w1, s1, w2, s2), made once per run."""
    layer = dict(layer_items)
    e, h, i = layer["experts"], layer["hidden"], layer["inter"]
    torch.manual_seed(0)

    def block_quant(shape):
        w = torch.randn(*shape, device=device) / shape[-1] ** 0.5
        blocks = w.reshape(e, shape[1] // 128, 128, shape[2] // 128, 128)
        scale = blocks.abs().amax(dim=(2, 4)).clamp_min(1e-8) / 448.0
        q = (blocks / scale[:, :, None, :, None]).reshape(shape).to(torch.float8_e4m3fn)
        return q, scale.float()

    w1, s1 = block_quant((e, 2 * i, h))
    w2, s2 = block_quant((e, h, i))
    return w1, s1, w2, s2


def route(layer: dict, tokens: int, device: str, skew: bool, plain: bool = False):
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


def layer_call(x, ids, values, weights, backend: str):
    """The expert computation of the layer (``upstream``: upstream's call, no ``backend=``)."""
    w1, s1, w2, s2 = weights
    kwargs = {} if backend == "upstream" else {"backend": backend}
    return flashinfer.cutlass_fused_moe(x, ids, values, w1, w2, x.dtype, [s1, s2],
                                        use_deepseek_fp8_block_scale=True, **kwargs)[0]


def run_case(case: dict, args) -> dict:
    """Every backend's first call and eager time of the layer at one token count."""
    layer, tokens = layer_of(args), case["tokens"]
    weights = expert_weights(tuple(layer.items()), args.device)
    x = torch.randn(tokens, layer["hidden"], device=args.device, dtype=torch.bfloat16)
    ids, values = route(layer, tokens, args.device, args.skew, args.plain_routing)
    flops = 2 * 3 * layer["top_k"] * layer["hidden"] * layer["inter"] * tokens
    out = {}
    for backend in backends(case, args):
        run = lambda: layer_call(x, ids, values, weights, backend)  # noqa: E731
        try:
            t0 = time.perf_counter()
            run()
            if args.device == "cuda":
                torch.cuda.synchronize()
            first = time.perf_counter() - t0
            ms = timing.eager_ms(run, args.iters, warmup=WARMUP_CALLS)
            entry = {"ms": ms, "tflops": flops / ms / 1e9, "first_call_s": first}
            if backend == "auto":
                entry["chosen"] = harness.chosen(run)
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            entry = harness.error_entry(exc)
        out[backend] = entry
    return {"flops": flops, "backends": out}


# ------------------------------------------------------------------------------ summary, plot
def series(runs) -> dict:
    """``{label: {tokens: ms}}``: upstream's runs as ``upstream``, ours per backend."""
    table, order = harness.merged(runs)
    out: dict = {}
    for case in order:
        tokens = int(case.split("=")[1])
        for label, entry in table[case].items():
            if "ms" in entry:
                out.setdefault(label, {})[tokens] = entry["ms"]
    return out


def summary(runs) -> str:
    """Every backend's ms per token count, and upstream / auto where upstream ran."""
    data = series(runs)
    labels = sorted(data, key=lambda s: (s != "auto", s))
    lines = [f"{'tokens':>7} " + " ".join(f"{s:>14}" for s in labels) + f" {'upstream/auto':>14}"]
    for t in sorted({t for s in data.values() for t in s}):
        auto, up = data.get("auto", {}).get(t), data.get("upstream", {}).get(t)
        lines.append(f"{t:>7} " + " ".join(f"{data[s].get(t, float('nan')):>14.3f}" for s in labels)
                     + f" {(f'{up / auto:.2f}' if up and auto else '-'):>14}")
    return "\n".join(lines)


def plot(runs):
    """ms per call against tokens, log-log, a line per backend (upstream dashed)."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, points in sorted(series(runs).items()):
        tokens = sorted(points)
        ax.plot(tokens, [points[t] for t in tokens], "--" if label == "upstream" else "-",
                marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set(xlabel="tokens", ylabel="ms per call (eager)")
    layer = runs[0][0].get("layer", LAYER)
    ax.set_title(f"MoE layer ({layer['experts']} experts, top-{layer['top_k']}, "
                 f"{layer['hidden']} / {layer['inter']}, fp8 block-scaled)", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def main(argv=None, prog=None) -> int:
    return harness.main(sys.modules[__name__], argv, prog)


if __name__ == "__main__":
    sys.exit(main())
