"""Where the Triton fused MoE's GPU time goes on the DeepSeek-V3 layer (W8A8 fp8 experts).

    python benchmarks/profile_moe.py [--tokens 1024 4096] [--plain-routing] [--bf16-only]
        [--configs "32,128,128,128,4,4,4,4,8;..."]

For each token count and launch configuration (the fields of ``LaunchConfig``: block_m,
block_n1, block_n2, block_k, warps1, stages1, warps2, stages2, group_m, and optionally
weights_tma as 0 / 1): GPU time of each kernel
of one call (torch profiler), with bfloat16 input (quantised per 1x128 group first) and with
the input already fp8 with its 1x128 scales. The weight bytes of the experts used over the
4.8 TB/s HBM peak give the floor. ``--plain-routing``: torch's top-k of the sigmoid scores
(every expert in use from about 1,024 tokens), as ``moe.py --plain-routing``.
"""

from __future__ import annotations

import argparse

import torch

from moe import LAYER, expert_weights, route
from timing import kernel_ms

from flashinfer.backends.triton import moe as tmoe
from flashinfer.fused_moe.core import ExpertSpec


def quantise_1x128(x: torch.Tensor):
    groups = x.float().view(x.shape[0], -1, 128)
    amax = groups.abs().amax(-1)
    inv = torch.where(amax > 0, 448.0 / amax.clamp_min(1e-30), torch.zeros_like(amax))
    q = (groups * inv[..., None]).to(torch.float8_e4m3fn).view_as(x)
    return q, amax / 448.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--configs", default="")
    ap.add_argument("--plain-routing", action="store_true")
    ap.add_argument("--bf16-only", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    w1, s1, w2, s2 = expert_weights(tuple(LAYER.items()), "cuda")
    spec = ExpertSpec("fp8_block_scale", 3, 0, False)
    weight_bytes = w1.numel() + w2.numel()
    configs = [tuple(map(int, c.split(","))) for c in args.configs.split(";") if c]
    original = tmoe.launch_config
    for tokens in args.tokens:
        x = torch.randn(tokens, LAYER["hidden"], device="cuda", dtype=torch.bfloat16)
        xq, xs = quantise_1x128(x)
        ids, values = route(LAYER, tokens, "cuda", False, args.plain_routing)
        out = torch.empty_like(x)
        used = torch.unique(ids).numel()
        floor_ms = weight_bytes * used / LAYER["experts"] / 4.8e12 * 1e3
        for cfg in configs or [None]:
            if cfg is not None:
                tmoe.launch_config = lambda *a, _c=cfg: tmoe.LaunchConfig(
                    *_c[:9], *(bool(v) for v in _c[9:]))
            inputs = (("bf16 in", x, None),) + (() if args.bf16_only else (("fp8 in", xq, xs),))
            for label, a, a_s in inputs:
                try:
                    t = kernel_ms(lambda: tmoe.fused_moe(a, a_s, w1, s1, w2, s2, ids, values,
                                                            spec, out))
                except Exception as exc:  # noqa: BLE001 - a config that does not fit is a finding
                    print(f"T={tokens:<5d} cfg={cfg} {label}: {type(exc).__name__}: {str(exc)[:90]}")
                    continue
                total = sum(t.values())
                parts = ", ".join(f"{k} {v:.3f}" for k, v in sorted(t.items(), key=lambda kv: -kv[1]))
                print(f"T={tokens:<5d} cfg={cfg or 'default'} {label}: {total:.3f} ms "
                      f"(floor {floor_ms:.3f}, {used} experts) | {parts}", flush=True)
            tmoe.launch_config = original


if __name__ == "__main__":
    main()
