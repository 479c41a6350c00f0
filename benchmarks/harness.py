"""What every benchmark runner shares: its command line, its output, the progress bar, the
summary table and the plot (imported by script name, like ``timing.py``).

A runner is a module ``benchmarks/<family>.py`` that sets ``FAMILY`` and defines

    cases(args) -> list[dict]           the shape table expanded for ``args.shapes``
                                        (``full``, ``quick``: the issue's target points,
                                        ``tiny``: CPU-sized); each dict names its ``case``
    backends(case, args) -> list[str]   what is timed at a case
    run_case(case, args) -> dict        ``{"backends": {label: entry}, ...}``; an entry holds
                                        ``ms`` (and rates, ``chosen`` for ``auto``) or
                                        ``error`` / ``rejected`` / ``skipped``

and optionally ``add_arguments(parser)``, ``prepare(args) -> dict`` (once before the cases; what
it returns joins the header), ``summary(runs) -> str``, ``plot(runs) -> Figure``, ``TIMING``
(how it times, for the header) and ``IMPLS`` (``("ours", "upstream")`` where the same file
also measures upstream FlashInfer, run in a process of its own with upstream first on
``PYTHONPATH``). Its ``main(argv, prog)`` returns ``harness.main(module, argv, prog)``.

Output: JSON lines, flushed as they are written: a first line ``{"header": {...}}`` (command,
date, device, versions, what the run shows, how it timed), one line per case, and a last line
``{"end": {...}}`` once every case ran. A run cut short keeps the cases it finished. The plot
(matplotlib, optional) goes beside it with the same name and ``.png``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

import timing

SHAPES = ("full", "quick", "tiny")
#: measured on the H200 (device copy bytes/s, read + write; bf16 and fp8 matmul FLOP/s): the
#: context of a run's TB/s and TFLOP/s
CEILINGS = {"bytes_per_s": 4.1e12, "bf16_flops": 774e12, "fp8_flops": 1390e12}
#: pip distributions whose versions every header records (None: not installed)
VENDOR_PACKAGES = ("triton", "nvidia-cudnn-frontend", "flash-attn", "fa3-fwd", "nvidia-cutlass",
                   "nvidia-cutlass-dsl", "tensorrt-llm", "numpy")


# ------------------------------------------------------------------------------------ header
def device_name() -> str:
    """``NVIDIA H200 (SM 9.0)`` on a GPU, ``cpu (x86_64, 2 threads)`` without one."""
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{torch.cuda.get_device_name()} (SM {major}.{minor})"
    return f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"


def device_slug() -> str:
    """The device as results file names spell it: ``h200``, ``cpu``."""
    if not torch.cuda.is_available():
        return "cpu"
    words = [w for w in torch.cuda.get_device_name().lower().split() if w not in ("nvidia", "geforce")]
    return "_".join(words) or "gpu"


def versions() -> dict:
    """Python, torch (with its CUDA and cuDNN), the flashinfer imported (ours or upstream, and
    where it lives) and every vendor package that a backend may use."""
    import flashinfer  # noqa: PLC0415 - whichever flashinfer is first on sys.path

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
           "flashinfer": getattr(flashinfer, "__version__", None),
           "flashinfer_path": os.path.dirname(flashinfer.__file__)}
    for name in VENDOR_PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def summary_line(runner) -> str:
    """What a runner's results show: the first paragraph of its docstring, on one line."""
    return " ".join(runner.__doc__.strip().split("\n\n")[0].split())


def header(runner, args, command: str) -> dict:
    """The first line of a run's output."""
    return {"family": runner.FAMILY, "shows": summary_line(runner),
            "command": command,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": device_name(), "impl": args.impl, "shapes": args.shapes,
            "iters": args.iters, "versions": versions(), "ceilings_h200": CEILINGS,
            "timing": getattr(runner, "TIMING", ""),
            "runner": f"benchmarks/{Path(runner.__file__).name}"}


def default_out(runner, args) -> str:
    """``<family>[_upstream][_<shapes>]_<device>_<YYYY-MM-DD_HHMM>utc.jsonl``, the results
    folder's naming."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d_%H%Mutc")
    parts = [runner.FAMILY] + (["upstream"] if args.impl == "upstream" else [])
    parts += [] if args.shapes == "full" else [args.shapes]
    return "_".join(parts + [device_slug(), stamp]) + ".jsonl"


# ------------------------------------------------------------------------------ entries
def each_backend(case: dict, args, backends, bench) -> dict:
    """``{"backends": {name: bench(case, name, iters, device) or its error_entry}}`` over
    ``backends``: a backend that cannot run a case is a finding, not a failure."""
    out = {}
    for backend in backends:
        try:
            out[backend] = bench(case, backend, args.iters, args.device)
        except Exception as exc:  # noqa: BLE001 - recorded, as the docstring says
            out[backend] = error_entry(exc)
    return {"backends": out}


def error_entry(exc: BaseException) -> dict:
    """A backend that could not run a case: its error's type and first line, or ``rejected``
    with the first reason the dispatcher gives (its NoBackendError and subclasses)."""
    lines = str(exc).strip().splitlines() or [""]
    reasons = [line.strip()[2:] for line in lines if line.strip().startswith("- ")]
    if reasons and any(c.__name__ == "NoBackendError" for c in type(exc).__mro__):
        return {"rejected": reasons[0][:300]}
    return {"error": f"{type(exc).__name__}: {lines[0][:240]}"}


def chosen(calls) -> str | None:
    """The kernels ``calls()`` ran through the dispatcher (``flashinfer.record_decisions``),
    joined with ``+``; ``None`` under upstream FlashInfer, which has no decisions."""
    import flashinfer  # noqa: PLC0415

    record = getattr(flashinfer, "record_decisions", None)
    if record is None:
        calls()
        return None
    with record() as log:
        calls()
    return "+".join(dict.fromkeys(d.name for d in log)) or None


def declared_kernels(op: str) -> list[str]:
    """``backend:variant`` of every wired kernel the capability database declares for ``op``."""
    from flashinfer.capability_db import database  # noqa: PLC0415 - ours only

    return sorted({r.key for r in database().for_op(op) if not r.planned})


def time_backends(sets: list, call, backends: list[str], iters: int, nbytes: int = 0,
                  flops: int = 0) -> dict:
    """Every backend's entry for one call, ``call(args, backend)``, over the rotated ``sets``
    (``timing.graph_and_eager_ms``), with ``tb_per_s`` when ``nbytes`` (the bytes that must
    move) is given, ``tflops`` when ``flops`` is; ``auto``'s kernels in ``chosen``."""
    out = {}
    for backend in backends:
        try:
            entry = timing.graph_and_eager_ms(sets, call, backend, iters)
            if backend == "auto":
                entry["chosen"] = chosen(lambda: call(sets[0], backend))
        except Exception as exc:  # noqa: BLE001 - a backend that cannot run a case is a finding
            entry = error_entry(exc)
        else:
            if flops:
                entry["tflops"] = flops / entry["ms"] / 1e9
            elif nbytes:
                entry["tb_per_s"] = nbytes / entry["ms"] / 1e9
        out[backend] = entry
    return out


def pick(args, defaults) -> list[str]:
    """The backends to time: ``--backends`` when given, else ``defaults``."""
    return list(args.backends) if args.backends else list(defaults)


def entry_text(entry: dict) -> str:
    """One backend's result in a line: time and rate, or why it did not run."""
    if "ms" not in entry:
        return entry.get("error") or entry.get("rejected") or entry.get("skipped") or "?"
    rate = (f" {entry['tb_per_s']:.2f} TB/s" if entry.get("tb_per_s") is not None else
            f" {entry['tflops']:.1f} TFLOP/s" if entry.get("tflops") is not None else "")
    graph = f" (gpu {entry['gpu_ms']:.4f})" if entry.get("gpu_ms") not in (None, entry["ms"]) else ""
    pick_ = f" -> {entry['chosen']}" if entry.get("chosen") else ""
    return f"{entry['ms']:.4f} ms{graph}{rate}{pick_}"


def describe(record: dict) -> str:
    """The progress line of a finished case."""
    if "skipped" in record:
        return f"{record['case']}: skipped ({record['skipped']})"
    cells = "; ".join(f"{b} {entry_text(e)}" for b, e in record["backends"].items())
    return f"{record['case']}: {cells}"


# ------------------------------------------------------------------------------ runs
def load(path: str) -> tuple[dict, list[dict]]:
    """``(header, records)`` of a runner's output file."""
    head, records = {}, []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        obj = json.loads(line)
        if "header" in obj:
            head = obj["header"]
        elif "case" in obj:
            records.append(obj)
    return head, records


def merged(runs) -> tuple[dict, list[str]]:
    """``({case: {label: entry}}, case order)`` over several runs (ours and upstream): an
    upstream run's backends are labelled ``upstream:<backend>``, a later run's entry replaces
    an earlier one's."""
    table: dict = {}
    order: list[str] = []
    for head, records in runs:
        prefix = "upstream:" if head.get("impl") == "upstream" else ""
        for r in records:
            if r["case"] not in table:
                table[r["case"]] = {}
                order.append(r["case"])
            for backend, entry in r.get("backends", {}).items():
                label = backend if backend.startswith("upstream") else prefix + backend
                table[r["case"]][label] = entry
    return table, order


def best_table(runs) -> str:
    """Per case: ``auto``'s time and kernel, the fastest other backend, and auto / best."""
    table, order = merged(runs)
    lines = [f"{'case':<46} {'auto ms':>10} {'auto ->':<26} {'best other':<26} {'ms':>10} {'best/auto':>9}"]
    for case in order:
        timed = {k: e["ms"] for k, e in table[case].items() if "ms" in e}
        auto = table[case].get("auto", {})
        others = {k: v for k, v in timed.items() if k != "auto"}
        best = min(others, key=others.get) if others else None
        ratio = others[best] / auto["ms"] if best and "ms" in auto else None
        lines.append(f"{case:<46} {auto.get('ms', float('nan')):>10.4f} "
                     f"{str(auto.get('chosen', auto.get('error', '-')))[:26]:<26} "
                     f"{str(best):<26} {others.get(best, float('nan')):>10.4f} "
                     f"{'-' if ratio is None else f'{ratio:.2f}':>9}")
    return "\n".join(lines)


def bar_plot(runs):
    """Time per case of every backend, bars on a log scale (``auto`` first)."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    table, order = merged(runs)
    labels = sorted({k for c in order for k, e in table[c].items() if "ms" in e},
                    key=lambda k: (k != "auto", k))
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(order) + 4), 5.5))
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        xs = [j + i * width for j, c in enumerate(order) if "ms" in table[c].get(label, {})]
        ys = [table[c][label]["ms"] * 1e3 for c in order if "ms" in table[c].get(label, {})]
        ax.bar(xs, ys, width, label=label)
    ax.set_yscale("log")
    ax.set_ylabel("time per call (us, log scale)")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(order))])
    ax.set_xticklabels([f"{c}\n(auto: {table[c].get('auto', {}).get('chosen')})" for c in order],
                       rotation=30, ha="right", fontsize=7)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def save_plot(runner, runs, png: str, command: str, sources: list[str]) -> None:
    """``runner.plot(runs)`` (else ``bar_plot``) to ``png``, with a header in the PNG's text
    chunks (command, date, device, what it shows); a message instead when matplotlib is absent."""
    try:
        import matplotlib  # noqa: PLC0415
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib, then "
              f"python {runs[0][0].get('runner', 'benchmarks/<family>.py')} --plot FILE)")
        return
    matplotlib.use("Agg")
    fig = getattr(runner, "plot", bar_plot)(runs)
    head = runs[0][0]
    fig.suptitle(f"{runner.FAMILY}: {head.get('device', '?')}, "
                 f"{head.get('date', '?')[:16].replace('T', ' ')} UTC"
                 + (" (with upstream)" if len(runs) > 1 else ""), fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
    meta = {"command": command, "date": head.get("date", ""), "device": head.get("device", ""),
            "shows": f"plot of {', '.join(Path(s).name for s in sources)}: {head.get('shows', '')}"}
    fig.savefig(png, dpi=110, metadata={k: v.encode("ascii", "replace").decode() for k, v in meta.items()})
    print(f"wrote {png}")


class Progress:
    """A progress bar over the cases: tqdm in a terminal where it is installed, else a counter
    line per case (``[3/12] 41 s, eta 123 s``) that reads well in a log."""

    def __init__(self, total: int, desc: str):
        self.total, self.done, self.t0 = total, 0, time.perf_counter()
        self.bar = None
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm  # noqa: PLC0415
            except ImportError:
                pass
            else:
                self.bar = tqdm(total=total, desc=desc, unit="case")

    def step(self, line: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.write(line)
            self.bar.update(1)
            return
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / self.done * (self.total - self.done)
        print(f"[{self.done}/{self.total}] {elapsed:.0f} s, eta {eta:.0f} s  {line}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ------------------------------------------------------------------------------ main
def parser_for(runner, prog: str | None) -> argparse.ArgumentParser:
    """The runner's command line: the options every runner takes, then its own."""
    impls = getattr(runner, "IMPLS", ("ours",))
    p = argparse.ArgumentParser(prog=prog, description=runner.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", choices=SHAPES, default=None,
                   help="the shape table to run (default: full on a GPU, tiny on the CPU)")
    p.add_argument("--only", default="", help="only the cases whose name contains this")
    p.add_argument("--backends", default="", type=lambda s: [b for b in s.split(",") if b],
                   help="comma-separated backends to time instead of the runner's list")
    p.add_argument("--iters", type=int, default=None, help="timed repetitions (median)")
    p.add_argument("--impl", choices=impls, default="ours",
                   help="ours, or upstream FlashInfer first on PYTHONPATH (separate process)")
    p.add_argument("--out", default=".",
                   help="output file, or a folder for the default name (default: .)")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="start no new case after this many seconds (0: no limit)")
    p.add_argument("--list", action="store_true", help="print the cases and backends, run nothing")
    p.add_argument("--no-plot", action="store_true", help="write no PNG")
    p.add_argument("--plot", nargs="+", metavar="FILE",
                   help="run nothing: the summary and plot of these outputs (e.g. ours and upstream)")
    p.add_argument("--png", default="", help="with --plot: the PNG to write")
    if hasattr(runner, "add_arguments"):
        runner.add_arguments(p)
    return p


def replot(runner, args, command: str) -> int:
    """``--plot FILE...``: the summary and one plot of saved outputs."""
    runs = [load(path) for path in args.plot]
    print(getattr(runner, "summary", best_table)(runs))
    first = Path(args.plot[0])
    png = args.png or str(first.with_suffix(".png") if len(runs) == 1 else first.with_name(
        first.stem.replace(f"{runner.FAMILY}_", f"{runner.FAMILY}_vs_upstream_", 1) + ".png"))
    save_plot(runner, runs, png, command, args.plot)
    return 0


def main(runner, argv=None, prog: str | None = None) -> int:
    """Parse ``argv``, run every case of the chosen shape table (one output line each, as it
    goes), then print the summary table and write the plot. Exit status 1 when no backend
    timed any case (a broken install) or the run was interrupted, else 0: a backend that cannot
    run a case is a finding, not a failure."""
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = prog or f"python benchmarks/{Path(runner.__file__).name}"
    args = parser_for(runner, prog).parse_args(argv)
    command = shlex.join([*prog.split(), *argv])
    if args.plot:
        return replot(runner, args, command)
    args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.shapes = args.shapes or ("full" if args.device == "cuda" else "tiny")
    args.iters = args.iters or (getattr(runner, "ITERS", 10) if args.device == "cuda" else 3)
    cases = [c for c in runner.cases(args) if args.only in c["case"]]
    if args.list:
        for case in cases:
            print(f"{case['case']}: {', '.join(runner.backends(case, args))}")
        print(f"{len(cases)} cases ({args.shapes})")
        return 0
    head = header(runner, args, command)
    head.update(runner.prepare(args) if hasattr(runner, "prepare") else {})
    out = Path(args.out)
    path = out / default_out(runner, args) if out.is_dir() else out
    records, started = [], time.perf_counter()
    progress = Progress(len(cases), runner.FAMILY)
    with open(path, "w") as f:
        f.write(json.dumps({"header": head}) + "\n")
        f.flush()
        try:
            for case in cases:
                if args.budget_s and time.perf_counter() - started > args.budget_s:
                    record = {**case, "skipped": f"budget of {args.budget_s:.0f} s spent"}
                else:
                    record = {**case, **runner.run_case(case, args)}
                records.append(record)
                f.write(json.dumps(record) + "\n")
                f.flush()
                progress.step(describe(record))
        except KeyboardInterrupt:  # e.g. `timeout -s INT`: the summary of what finished
            print(f"interrupted after {len(records)} of {len(cases)} cases", flush=True)
        timed = sum("ms" in e for r in records for e in r.get("backends", {}).values())
        if len(records) == len(cases):
            f.write(json.dumps({"end": {"cases": len(records), "timed": timed,
                                        "elapsed_s": round(time.perf_counter() - started, 1)}}) + "\n")
    progress.close()
    runs = [(head, records)]
    print(getattr(runner, "summary", best_table)(runs))
    print(f"wrote {path}")
    if not args.no_plot and records:
        save_plot(runner, runs, str(path.with_suffix(".png")), command, [str(path)])
    return 0 if timed and len(records) == len(cases) else 1
