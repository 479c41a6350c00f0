"""Plot a foundation benchmark result: GPU time per case for every backend and `auto`.

    python benchmarks/plot_foundation.py benchmarks/results/foundation_h200_2026-11-30.json
writes the PNG beside the JSON (same name, .png).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path: str) -> None:
    doc = json.loads(Path(path).read_text())
    points = doc["results"]
    names = sorted({b for p in points for b, v in p["backends"].items() if "ms" in v})
    names.remove("auto")
    names = ["auto"] + names
    fig, ax = plt.subplots(figsize=(13, 6))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        xs, ys = [], []
        for j, point in enumerate(points):
            entry = point["backends"].get(name, {})
            if "ms" in entry:
                xs.append(j + i * width)
                ys.append(entry["ms"] * 1e3)
        ax.bar(xs, ys, width, label=name)
    ax.set_yscale("log")
    ax.set_ylabel("GPU time per call (us, log scale; CUDA-graph replay)")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(points))])
    ax.set_xticklabels([f"{p['case']}\n(auto: {p['auto_choice']})" for p in points],
                       rotation=35, ha="right", fontsize=7)
    ax.set_title(f"{doc['device']} (SM {doc['sm']}), {doc['date'][:10]}: every backend vs auto")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(path).with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main(sys.argv[1])
