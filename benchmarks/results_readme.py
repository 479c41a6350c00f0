"""Write ``benchmarks/results/README.md`` from the headers of the files there.

    python benchmarks/results_readme.py            # rewrite the README
    python benchmarks/results_readme.py --check    # exit 1 when it is not current

A results file's header says what made it (``command``), when (``date``), on what
(``device``) and what it ``shows``:

- JSON lines (the runners' output): the first line's ``"header"`` object;
- JSON: a top-level ``"header"`` object, over the top-level ``command`` / ``date`` / ``device``
  the earlier runners wrote;
- text and logs: leading ``# key: value`` lines;
- PNG: text chunks (the runners write them with the plot).

A file with none of the four is listed with "no header", a missing field as "?". The CPU test
``tests/core/test_bench_command.py`` checks that the committed README is the one this writes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import struct
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
FIELDS = ("command", "date", "device", "shows")
TEXT_FIELD = re.compile(r"# (command|date|device|shows): (.*)")

#: the README's sections: (title, file-name prefixes), first match wins; the rest: "other"
SECTIONS = [
    ("attention", ("attention_", "fa2_", "page_append_")),
    ("gemm", ("gemm_",)),
    ("moe", ("moe_",)),
    ("sampling", ("sampling_", "first_call_")),
    ("norm, rope, activation (and single-request attention)", ("foundation_",)),
    ("launch-shape sweeps, profiles and probes", ("tune_", "profile_", "probe_", "cudnn_probe_")),
    ("GPU tests and memcheck", ("gpu_tests_", "memcheck_")),
]

#: the latest full run of each family (its runner's whole grid; several files where the grid was
#: run in parts, ours and upstream side by side, and their plot)
LATEST_FULL_RUNS = {
    "attention": ["attention_h200_2026-11-30_2344utc.json",
                  "attention_upstream_0.7.2_h200_2026-11-30_2347utc.json",
                  "attention_vs_upstream_h200_2026-11-30_2347utc.png"],
    "gemm": ["gemm_mm_bf16_h200_2026-11-30_2129utc.json",
             "gemm_fp8_repeats_h200_2026-11-30_2128utc.json",
             "gemm_groupwise_h200_2026-11-30_2117utc.json",
             "gemm_bmm_fp8_h200_2026-11-30_2127utc.json",
             "gemm_grouped_h200_2026-11-30_2130utc.json",
             "gemm_vs_vendor_h200_2026-11-30_2130utc.png"],
    "moe": ["moe_ours_h200_2026-11-30_2335utc.json", "moe_upstream_h200_2026-11-30_2335utc.json",
            "moe_vs_upstream_h200_2026-11-30_2335utc.png"],
    "sampling": ["sampling_probs_grid_all_backends_h200_2026-11-30_1400utc.json",
                 "sampling_rest_grid_all_backends_h200_2026-11-30_1402utc.json",
                 "sampling_topk_grid_upstream_0.7.2_h200_2026-11-30_1204utc.json",
                 "sampling_rest_grid_upstream_0.7.2_h200_2026-11-30_1205utc.json",
                 "sampling_grid_vs_upstream_h200_2026-11-30_1402utc.png",
                 "sampling_grid_vs_upstream_h200_2026-11-30_1402utc.txt",
                 "first_call_pack_h200_2026-11-30_2124utc.json"],
    "norm, rope, activation (and single-request attention)": [
        "foundation_h200_2026-11-30.json", "foundation_h200_2026-11-30.png"],
}


def png_text(path: Path) -> dict:
    """The ``tEXt`` chunks of a PNG: ``{keyword: text}``."""
    data, out, pos = path.read_bytes(), {}, 8
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"tEXt":
            key, _, value = data[pos + 8:pos + 8 + length].partition(b"\0")
            out[key.decode("latin-1")] = value.decode("latin-1")
        pos += 12 + length
    return out


def read_header(path: Path) -> dict:
    """The header fields of one results file (see the module docstring)."""
    if path.suffix == ".png":
        found = png_text(path)
    elif path.suffix == ".jsonl":
        with path.open() as f:
            first = f.readline()
        found = json.loads(first).get("header", {}) if first.startswith("{") else {}
    elif path.suffix == ".json":
        try:
            doc = json.loads(path.read_text())
        except ValueError:
            doc = None
        found = ({**{k: doc[k] for k in FIELDS if k in doc}, **doc.get("header", {})}
                 if isinstance(doc, dict) else {})
    else:
        found = {}
        for line in path.read_text(errors="replace").splitlines():
            match = TEXT_FIELD.fullmatch(line)
            if not match:
                break
            found[match.group(1)] = match.group(2)
    return {k: str(found[k]) for k in FIELDS if k in found}


def _date(text: str) -> str:
    """An ISO timestamp as ``YYYY-MM-DD HH:MM UTC``; any other date as written."""
    try:
        stamp = datetime.datetime.fromisoformat(text)
    except ValueError:
        return text
    if stamp.tzinfo is not None:
        stamp = stamp.astimezone(datetime.timezone.utc)
    return stamp.strftime("%Y-%m-%d %H:%M UTC") if "T" in text else text


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render(results: Path = RESULTS) -> str:
    """The README of ``results``: the latest full run per family, then every file's header,
    in ``SECTIONS``."""
    files = sorted(p for p in results.iterdir() if p.is_file() and p.name != "README.md")
    lines = [
        "# Benchmark results",
        "",
        "Generated by `python benchmarks/results_readme.py` from each file's header (the command "
        "that made it, when, on what device, what it shows); run it after adding or removing a "
        "file, never edit this page by hand (`tests/core/test_bench_command.py` checks it is "
        "current). "
        "Kept here: the files a dispatch rule, capability record, test or README cites, the latest "
        "full run of each family, and the GPU test and memcheck logs from 2026-12-01 on; earlier "
        "runs are in git history. The runners that make such files: `benchmarks/<family>.py` "
        "(`flashinfer bench FAMILY`), on the GPU machine `bash benchmarks/device.sh bench FAMILY` "
        "and `bash benchmarks/device.sh upstream FAMILY`.",
        "",
        "## Latest full run per family",
        "",
        "| family | files |",
        "|---|---|",
    ]
    names = {p.name for p in files}
    for family, runs in LATEST_FULL_RUNS.items():
        cells = ", ".join(f"`{n}`" + ("" if n in names else " (missing)") for n in runs)
        lines.append(f"| {family} | {cells} |")
    sections: dict[str, list[Path]] = {title: [] for title, _ in SECTIONS + [("other", ())]}
    for path in files:
        title = next((t for t, prefixes in SECTIONS if path.name.startswith(prefixes)), "other")
        sections[title].append(path)
    for title, paths in sections.items():
        if not paths:
            continue
        lines += ["", f"## {title}", "", "| file | date | device | command | shows |",
                  "|---|---|---|---|---|"]
        for path in paths:
            head = read_header(path)
            if not head:
                lines.append(f"| `{path.name}` | no header | | | |")
                continue
            date, device = _date(head.get("date", "?")), head.get("device", "?")
            command = f"`{_cell(head['command'])}`" if "command" in head else "?"
            lines.append(f"| `{path.name}` | {_cell(date)} | {_cell(device)} | {command} | "
                         f"{_cell(head.get('shows', '?'))} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the README is not current")
    args = ap.parse_args(argv)
    readme = RESULTS / "README.md"
    text = render()
    if args.check:
        current = readme.exists() and readme.read_text() == text
        print("results README is current" if current else
              "results README is out of date: run python benchmarks/results_readme.py")
        return 0 if current else 1
    readme.write_text(text)
    print(f"wrote {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
