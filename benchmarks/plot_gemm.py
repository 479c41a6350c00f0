"""Plot and tabulate benchmarks/gemm.py and benchmarks/moe.py results (issue 5's figures).

    python benchmarks/plot_gemm.py gemm a.json [b.json ...] --png benchmarks/results/gemm.png
    python benchmarks/plot_gemm.py moe ours.json upstream.json --png benchmarks/results/moe.png

``gemm``: one panel per function, ``auto``'s speed against the best single vendor kernel of
each point (cuBLAS / cuBLASLt through torch or called directly, cuDNN, CUTLASS) with the 0.97
target line; the table lists each function's lowest point. Points of several files are merged
(a later file's point replaces an earlier one's). ``moe``: the DeepSeek-V3 layer, ms per call
against tokens, upstream's ``cutlass_fused_moe`` and ours per backend, log-log; the table gives
ours ``auto`` against upstream at every token count.
"""

from __future__ import annotations

import argparse
import json

VENDOR_BACKENDS = ("torch", "cudnn", "cutlass", "vendor")
TARGET = 0.97


def gemm_points(paths: list[str]) -> dict:
    """→ {(function, m, n, k, batch or experts): (auto / best vendor, auto's kernel, vendor)}."""
    points: dict = {}
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        for p in doc["results"]:
            backends = p["backends"]
            vendors = [(e["ms"], b) for b, e in backends.items() if b in VENDOR_BACKENDS and "ms" in e]
            auto = backends.get("auto", {})
            if not vendors or "ms" not in auto:
                continue
            best_ms, best = min(vendors)
            groups = p.get("batch", p.get("experts", 0))
            points[(p["function"], p["m"], p["n"], p["k"], groups)] = (
                best_ms / auto["ms"], auto.get("chosen"), best)
    return points


def gemm_table(points: dict) -> str:
    lines = [f"{'function':24s} {'points':>6} {'lowest':>7} {'at (M, N, K, groups)':28s} auto's kernel"]
    for fn in sorted({key[0] for key in points}):
        mine = {key: v for key, v in points.items() if key[0] == fn}
        key = min(mine, key=lambda k: mine[k][0])
        lines.append(f"{fn:24s} {len(mine):>6} {mine[key][0]:>7.3f} {str(key[1:]):28s} {mine[key][1]}")
    return "\n".join(lines)


def plot_gemm(points: dict, png: str) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    functions = sorted({key[0] for key in points})
    fig, axes = plt.subplots(len(functions), 1, figsize=(13, 3.2 * len(functions)), squeeze=False)
    for ax, fn in zip(axes[:, 0], functions):
        keys = sorted((k for k in points if k[0] == fn), key=lambda k: (k[2], k[3], k[4], k[1]))
        ratios = [points[k][0] for k in keys]
        colors = ["tab:red" if r < TARGET else "tab:blue" for r in ratios]
        ax.bar(range(len(keys)), ratios, color=colors)
        ax.axhline(TARGET, color="black", linestyle="--", linewidth=1)
        ax.set_ylim(min(0.8, min(ratios) - 0.05), max(1.1, max(ratios) + 0.05))
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels([f"{k[2]}x{k[3]}{'/' + str(k[4]) if k[4] else ''} M{k[1]}" for k in keys],
                           rotation=90, fontsize=6)
        ax.set_ylabel("auto / best vendor")
        ax.set_title(f"{fn}: speed of auto relative to the best single vendor kernel "
                     f"(target >= {TARGET})", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def moe_series(paths: list[str]) -> dict:
    """→ {series: {tokens: ms}}; upstream's runs as ``upstream``, ours as ``ours:<backend>``."""
    series: dict = {}
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        upstream = doc.get("impl") == "upstream"
        for p in doc["results"]:
            for backend, entry in p["backends"].items():
                if "ms" in entry:
                    name = "upstream" if upstream else f"ours:{backend}"
                    series.setdefault(name, {})[p["tokens"]] = entry["ms"]
    return series


def moe_table(series: dict) -> str:
    auto, up = series.get("ours:auto", {}), series.get("upstream", {})
    lines = [f"{'tokens':>7} {'upstream ms':>12} {'ours auto ms':>13} {'upstream/auto':>14}"]
    for t in sorted(set(auto) | set(up)):
        ratio = f"{up[t] / auto[t]:.2f}" if t in up and t in auto else "-"
        lines.append(f"{t:>7} {up.get(t, float('nan')):>12.3f} {auto.get(t, float('nan')):>13.3f} "
                     f"{ratio:>14}")
    return "\n".join(lines)


def plot_moe(series: dict, png: str) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in sorted(series.items()):
        tokens = sorted(points)
        ax.plot(tokens, [points[t] for t in tokens], marker="o", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens")
    ax.set_ylabel("ms per call (eager)")
    ax.set_title("DeepSeek-V3 MoE layer (256 experts, top-8, 7168 / 2048, fp8 block-scaled)",
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["gemm", "moe"])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--png", help="write the plot here")
    args = ap.parse_args()
    if args.kind == "gemm":
        points = gemm_points(args.files)
        print(gemm_table(points))
        if args.png:
            plot_gemm(points, args.png)
    else:
        series = moe_series(args.files)
        print(moe_table(series))
        if args.png:
            plot_moe(series, args.png)


if __name__ == "__main__":
    main()
