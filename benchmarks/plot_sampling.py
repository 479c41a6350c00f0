"""Plot and tabulate benchmarks/sampling.py results (this package and upstream side by side).

    python benchmarks/plot_sampling.py ours.json upstream.json --png benchmarks/results/sampling.png
    python benchmarks/plot_sampling.py ours.json upstream.json --all     # table for every function

The PNG has one panel per vocabulary: time per call against batch for
top_k_top_p_sampling_from_probs (top_k_first), one line per implementation/backend. The text
table gives, at each point, ours ``auto`` (and the kernel it chose), the inline torch sort
baseline and upstream, with the speed-ups ``sort/auto`` (issue 4 target >= 5x at 256 x 128k) and
``upstream/auto`` (target >= 1.0x). Results of several JSONs are merged; an ``--impl upstream``
file's only backend is shown as ``upstream``, ours' backends as ``ours:<backend>``.
"""

from __future__ import annotations

import argparse
import json

TARGET = ("top_k_top_p_sampling_from_probs", "top_k_first")
SORT = "torch_sort_inline"


def load(paths: list[str]) -> tuple[dict, list]:
    """→ {(function, label, batch, vocab): {series: entry}}, first-call entries."""
    table: dict = {}
    first: list = []
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        impl = doc.get("impl", "ours")
        first += doc.get("first_call", [])
        for p in doc.get("results", []):
            row = table.setdefault((p["function"], p.get("label", ""), p["batch"], p["vocab"]), {})
            for backend, entry in p.get("backends", {}).items():
                if backend == SORT:  # the same baseline in both runs: keep the first measured
                    if "us" in entry and "us" not in row.get(SORT, {}):
                        row[SORT] = entry
                    continue
                row["upstream" if impl == "upstream" else f"ours:{backend}"] = entry
    return table, first


def _us(entry: dict | None) -> float | None:
    return entry.get("us") if entry else None


def _fmt(x: float | None, spec: str = "10.1f") -> str:
    return format(x, spec) if x is not None else format("-", ">" + spec.split(".")[0])


def speedup_table(table: dict, functions: list[tuple]) -> str:
    lines = []
    for fn, label in functions:
        keys = sorted(k for k in table if (k[0], k[1]) == (fn, label))
        if not keys:
            continue
        lines.append(f"\n{fn}{' [' + label + ']' if label else ''}  (us per call; x = speed-up of ours auto)")
        lines.append(f"{'batch':>6} {'vocab':>7} {'ours auto':>10} {'chosen':<18} {'triton':>10} "
                     f"{'torch':>10} {'sort inl.':>10} {'upstream':>10} {'sort/auto':>9} {'up/auto':>8}")
        for key in sorted(keys, key=lambda k: (k[3], k[2])):
            row = table[key]
            auto, sort, up = _us(row.get("ours:auto")), _us(row.get(SORT)), _us(row.get("upstream"))
            chosen = (row.get("ours:auto") or {}).get("chosen") or ("error" if "ours:auto" in row else "-")
            lines.append(
                f"{key[2]:>6} {key[3]:>7} {_fmt(auto)} {chosen[:18]:<18} {_fmt(_us(row.get('ours:triton')))} "
                f"{_fmt(_us(row.get('ours:torch')))} {_fmt(sort)} {_fmt(up)} "
                f"{_fmt(sort / auto if sort and auto else None, '9.2f')} "
                f"{_fmt(up / auto if up and auto else None, '8.2f')}")
    return "\n".join(lines)


def plot(table: dict, png: str) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    keys = [k for k in table if (k[0], k[1]) == TARGET]
    vocabs = sorted({k[3] for k in keys})
    if not vocabs:
        raise SystemExit(f"no {TARGET[0]} [{TARGET[1]}] points in the inputs")
    fig, axes = plt.subplots(1, len(vocabs), figsize=(5 * len(vocabs), 4.2), squeeze=False)
    for ax, vocab in zip(axes[0], vocabs):
        pts = sorted((k for k in keys if k[3] == vocab), key=lambda k: k[2])
        series = list(dict.fromkeys(s for k in pts for s in table[k]))
        for s in series:
            xy = [(k[2], _us(table[k].get(s))) for k in pts if _us(table[k].get(s)) is not None]
            if xy:
                style = "--" if s in (SORT, "upstream") else "-"
                ax.plot(*zip(*xy), style, marker="o", label=s)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch")
        ax.set_ylabel("time per call (us)")
        ax.set_title(f"vocab {vocab}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{TARGET[0]}\n({TARGET[1]}, k=50, p=0.9; lower is better)", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"wrote {png}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+")
    ap.add_argument("--png", default="", help="output PNG (default: first JSON with .png)")
    ap.add_argument("--all", action="store_true", help="speed-up table for every function")
    args = ap.parse_args()
    table, first = load(args.json)
    functions = list(dict.fromkeys((k[0], k[1]) for k in table)) if args.all else [TARGET]
    if any((k[0], k[1]) == TARGET for k in table):
        plot(table, args.png or args.json[0].rsplit(".", 1)[0] + ".png")
    print(speedup_table(table, functions))
    for e in first:
        print(f"first call [{e.get('impl')} {e.get('run')}] B={e.get('batch')} V={e.get('vocab')}: " + (
            f"import {e['import_flashinfer_s']:.2f} s + first call {e['first_call_s']:.2f} s = "
            f"{e['import_plus_first_call_s']:.2f} s -> {e.get('chosen')}" if "error" not in e else e["error"]))


if __name__ == "__main__":
    main()
