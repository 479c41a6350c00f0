"""Plot and tabulate benchmarks/attention.py results: this package's backends beside upstream.

    python benchmarks/plot_attention.py ours.json [upstream.json] --png out.png

Left: paged decode KV bandwidth (TB/s) against batch size, one panel per KV length, a line per
backend (``auto`` bold, upstream dashed). Right: causal prefill TFLOP/s per case and backend.
A text table follows: ``auto`` (and the kernel it chose), the best single backend, upstream's
best, and the ratios the issue's targets use.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict


def load(paths):
    """``{case: {label: entry}}`` over all files; upstream entries are labelled ``upstream:<b>``."""
    cases, order = defaultdict(dict), []
    for path in paths:
        data = json.load(open(path))
        upstream = data.get("impl") == "upstream"
        for row in data["results"]:
            if row["case"] not in cases:
                order.append(row["case"])
            cases[row["case"]]["_row"] = row
            for backend, entry in row["backends"].items():
                if "ms" in entry:
                    cases[row["case"]][("upstream:" if upstream else "") + backend] = entry
    return cases, order


def metric(entry):
    return entry.get("tb_per_s", entry.get("tflops"))


def table(cases, order) -> str:
    lines = [f"{'case':34s} {'auto':>8s} {'chosen':>20s} {'best ours':>22s} {'upstream':>20s} "
             f"{'auto/best':>9s} {'auto/up':>8s}"]
    for case in order:
        entries = {k: v for k, v in cases[case].items() if k != "_row"}
        auto = entries.get("auto")
        ours = {k: v for k, v in entries.items() if not k.startswith("upstream:") and k != "auto"}
        up = {k: v for k, v in entries.items() if k.startswith("upstream:")}
        if auto is None:
            continue
        best_k = max(ours, key=lambda k: metric(ours[k])) if ours else None
        up_k = max(up, key=lambda k: metric(up[k])) if up else None
        unit = "TB/s" if "tb_per_s" in auto else "TF/s"
        best_txt = f"{best_k} {metric(ours[best_k]):.2f}" if best_k else "-"
        up_txt = f"{up_k.split(':', 1)[1]} {metric(up[up_k]):.2f}" if up_k else "-"
        r_best = metric(auto) / metric(ours[best_k]) if best_k else float("nan")
        r_up = metric(auto) / metric(up[up_k]) if up_k else float("nan")
        lines.append(f"{case:34s} {metric(auto):6.2f}{unit[:2]} {str(auto.get('chosen')):>20s} "
                     f"{best_txt:>22s} {up_txt:>20s} {r_best:9.2f} {r_up:8.2f}")
    lines.append("")
    lines.append(f"{'decode, CUDA-graph replay (GPU time)':34s} {'auto TB/s':>10s} {'upstream':>10s} "
                 f"{'auto/up':>8s}")
    for case in order:
        auto, up = cases[case].get("auto", {}), cases[case].get("upstream:auto", {})
        if "graph_tb_per_s" in auto:
            u = up.get("graph_tb_per_s")
            lines.append(f"{case:34s} {auto['graph_tb_per_s']:10.2f} "
                         f"{(f'{u:.2f}' if u else '-'):>10s} "
                         f"{(auto['graph_tb_per_s'] / u if u else float('nan')):8.2f}")
    return "\n".join(lines)


def plot(cases, order, png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    decode = [c for c in order if cases[c]["_row"]["kind"] == "decode"
              and "bfloat16" in cases[c]["_row"]["kv_dtype"]]
    prefill = [c for c in order if cases[c]["_row"]["kind"] != "decode"]
    kvs = sorted({cases[c]["_row"]["b"] for c in decode})
    fig, axes = plt.subplots(1, len(kvs) + 1, figsize=(5 * (len(kvs) + 1), 4.2))
    for ax, kv in zip(axes, kvs):
        series = defaultdict(list)
        for c in decode:
            if cases[c]["_row"]["b"] != kv:
                continue
            for label, entry in cases[c].items():
                if label != "_row":
                    series[label].append((cases[c]["_row"]["a"], metric(entry)))
        for label, pts in sorted(series.items()):
            pts.sort()
            style = dict(lw=2.5) if label == "auto" else dict(ls="--") if label.startswith("up") else {}
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label, **style)
        ax.set_xscale("log", base=2)
        ax.set_title(f"paged decode, kv {kv}, bf16")
        ax.set_xlabel("batch")
        ax.set_ylabel("TB/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[-1]
    labels = sorted({k for c in prefill for k in cases[c] if k != "_row"})
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        xs = [j + i * width for j, c in enumerate(prefill) if label in cases[c]]
        ys = [metric(cases[c][label]) for c in prefill if label in cases[c]]
        ax.bar(xs, ys, width, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(prefill))])
    ax.set_xticklabels([c.replace(" causal", "\n") for c in prefill], fontsize=7)
    ax.set_ylabel("TFLOP/s")
    ax.set_title("causal prefill, bf16")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("json", nargs="+")
    ap.add_argument("--png")
    args = ap.parse_args()
    cases, order = load(args.json)
    print(table(cases, order))
    if args.png:
        plot(cases, order, args.png)


if __name__ == "__main__":
    main()
