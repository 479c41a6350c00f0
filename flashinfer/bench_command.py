"""``flashinfer bench``: run a family's benchmark runner, ``benchmarks/<family>.py`` of the
source checkout, in this process.

    flashinfer bench --list                      the families and what each runner measures
    flashinfer bench sampling                    GPU: the full grid; CPU: tiny shapes
    flashinfer bench gemm --shapes quick --out results/
    flashinfer bench attention --help            a runner's own options

The runners stay in the checkout's ``benchmarks/`` instead of moving into the package: each
also measures upstream FlashInfer 0.7.2 by running as a plain script in a process whose
``PYTHONPATH`` puts upstream's package first (both are named ``flashinfer``), which a module
inside this package cannot do; their results and the files that cite them live in the
checkout (``benchmarks/results/``); and the installed package carries no benchmark code or
plotting dependency. So the command looks for ``benchmarks/`` beside the package directory
(an editable install, or a checkout on ``sys.path``) and, without it, says where it looked and
what to do. A runner is a file there that sets ``FAMILY`` (``benchmarks/harness.py`` says what
else it defines); each takes ``--shapes full|quick|tiny``, ``--only``, ``--backends``,
``--iters``, ``--out`` and ``--list``, writes JSON lines (a header with command, date, device
and versions, then a line per case as it goes) and a plot when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib.util
import sys
from pathlib import Path

#: where the runners live: beside the package directory, in the source checkout
BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``bench`` subcommand's arguments: a family, then everything for its runner."""
    parser.add_argument("--list", action="store_true", help="list the families and exit")
    parser.add_argument("family", nargs="?", help="attention, gemm, moe, sampling, norm, ...")
    parser.add_argument("runner_args", nargs=argparse.REMAINDER,
                        help="the runner's options (flashinfer bench FAMILY --help)")


def runners(root: Path | None = None) -> dict[str, tuple[Path, str]]:
    """``{family: (runner file, first paragraph of its docstring)}`` of every file in ``root``
    (default ``BENCHMARKS``) that assigns a module-level ``FAMILY`` string (read with ``ast``:
    nothing is imported)."""
    root = root or BENCHMARKS
    if not (root / "harness.py").is_file():
        raise LookupError(
            f"no benchmark runners at {root}: `flashinfer bench` runs the runners of a source "
            "checkout (benchmarks/ next to the flashinfer package). Clone the repository and "
            "`pip install -e .` there, or run `python <checkout>/benchmarks/FAMILY.py`.")
    found = {}
    for path in sorted(root.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if (isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "FAMILY" for t in node.targets)
                    and isinstance(node.value, ast.Constant)):
                doc = ast.get_docstring(tree) or ""
                found[node.value.value] = (path, " ".join(doc.split("\n\n")[0].split()))
    return found


def _load(family: str, path: Path):
    """Import a runner from its file, its folder on ``sys.path`` (for ``harness``/``timing``)."""
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"flashinfer_bench_{family}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main(args: argparse.Namespace) -> int:
    """List the families, or run one family's runner with ``args.runner_args``; its exit status
    (0, 1 when no backend timed any case, 2 for bad arguments)."""
    try:
        found = runners()
    except LookupError as exc:
        print(f"flashinfer bench: error: {exc}", file=sys.stderr)
        return 2
    if args.list or not args.family:
        width = max(len(name) for name in found)
        for name, (path, what) in sorted(found.items()):
            print(f"{name:<{width}}  {what}\n{'':<{width}}  ({path})")
        if not args.list:
            print("\nusage: flashinfer bench FAMILY [--shapes full|quick|tiny] [--help]")
        return 0
    if args.family not in found:
        close = difflib.get_close_matches(args.family, list(found), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f" (one of {', '.join(sorted(found))})"
        print(f"flashinfer bench: error: no runner for family {args.family!r}{hint}", file=sys.stderr)
        return 2
    module = _load(args.family, found[args.family][0])
    try:
        return module.main(list(args.runner_args), prog=f"flashinfer bench {args.family}")
    except SystemExit as exc:  # the runner's --help, or its argument errors
        return exc.code if isinstance(exc.code, int) else 1
