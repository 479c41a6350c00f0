"""Upstream FlashInfer's other CLI subcommands, answered with what they mean here.

Upstream compiles its kernels (JIT modules, cubins, prebuilt wheels); this package routes calls
to kernels that come installed (vendor packages, our Triton kernels and their shipped pack, the
reference). So ``collect-env`` reports the environment, ``list-modules`` / ``module-status``
list the kernels the capability database wires and whether each can load here, and the
subcommands that manage compiled artifacts exit with one line saying why there is nothing to do.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import sys

import torch

from . import __package_version__, __version__
from .capability_db import Record, database
from .optional_packages import import_error

#: upstream subcommands about compiled artifacts: why each has nothing to do here
NO_COUNTERPART: dict[str, str] = {
    "list-cubins": "there are no cubins here: kernels come from installed packages and the "
                   "shipped Triton kernel pack (see `flashinfer show-config`)",
    "download-cubin": "nothing to download: no cubins are used here",
    "clear-cubin": "there is no cubin directory here; `flashinfer clear-cache` empties ours",
    "install-cubin-wheel": "no cubin wheel exists for this package",
    "install-jit-cache-wheel": "nothing is JIT-compiled from C++ here; `flashinfer warmup` "
                               "compiles the Triton kernels ahead of time",
    "download-kernels": "nothing to download: vendor kernels come with their pip packages",
    "export-compile-commands": "no C++ sources are compiled here",
    "generate-tactics-blocklist": "no autotuner tactics here: dispatch rules and tuned rules "
                                  "choose kernels (`flashinfer explain`)",
    "replay": "there are no level-10 dumps here: FLASHINFER_LOGLEVEL logs calls and decisions",
}

_ENGINES = ("vllm", "sglang", "tensorrt_llm")


def kernel_status(rec: Record) -> str:
    """``planned``, ``missing <package>`` or ``available`` for one capability record."""
    if rec.planned:
        return "planned"
    missing = [m for m in rec.requires if import_error(m) is not None]
    if rec.requires_any and all(import_error(m) is not None for m in rec.requires_any):
        missing.append(" or ".join(rec.requires_any))
    return f"missing {', '.join(missing)}" if missing else "available"


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict:
    """What ``collect-env`` reports (packages are looked up, never imported)."""
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "flashinfer": {"api": __version__, "package": __package_version__},
        "python": platform.python_version(), "platform": platform.platform(),
        "torch": {"version": torch.__version__, "cuda": torch.version.cuda, "cudnn": cudnn},
        "gpus": gpus,
        "packages": {name: _dist_version(name) for name in (
            "triton", "nvidia-cudnn-frontend", "nvidia-cutlass", "flash-attn", "fa3-fwd",
            *_ENGINES)},
    }


def cmd_collect_env(args: argparse.Namespace) -> int:
    data = environment()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"flashinfer: {data['flashinfer']['api']} (upstream API; package "
          f"{data['flashinfer']['package']})")
    print(f"python: {data['python']} ({data['platform']})")
    t = data["torch"]
    print(f"torch: {t['version']} (CUDA {t['cuda'] or 'none'}, cuDNN {t['cudnn'] or 'none'})")
    print(f"GPUs: {', '.join(data['gpus']) or 'none'}")
    for name, version in data["packages"].items():
        print(f"{name}: {version or 'not installed'}")
    return 0


def _kernels(name: str | None) -> list[Record]:
    return [r for r in database().records if r.backend != "reference" and (
        name is None or name in (r.backend, r.op, f"{r.backend}:{r.variant}", r.kernel))]


def cmd_list_modules(args: argparse.Namespace) -> int:
    records = _kernels(args.module_name)
    if not records:
        print(f"flashinfer list-modules: no kernel named {args.module_name!r} (a backend, an op, "
              f"backend:variant or a kernel reference)", file=sys.stderr)
        return 2
    for r in records:
        name = r.backend if r.variant == "default" else f"{r.backend}:{r.variant}"
        print(f"{name:<32} {r.op:<36} {kernel_status(r)}")
        if args.module_name is not None:
            print(f"    kernel: {r.kernel or '-'}; needs: {', '.join(r.requires) or '-'}; "
                  f"verified: {r.verified}; {r.note}".rstrip("; "))
    return 0


#: module-status --filter: ours, and upstream's spellings (its JIT states) as the nearest of ours
_FILTERS = {"all": "all", "available": "available", "missing": "missing", "planned": "planned",
            "aot": "all", "jit": "all", "compiled": "available", "not-compiled": "missing"}


def cmd_module_status(args: argparse.Namespace) -> int:
    statuses = [(r, kernel_status(r)) for r in _kernels(None)]
    groups = {"all": statuses,
              "available": [s for s in statuses if s[1] == "available"],
              "missing": [s for s in statuses if s[1].startswith("missing")],
              "planned": [s for s in statuses if s[1] == "planned"]}
    if args.detailed:
        for r, status in groups[_FILTERS[args.filter]]:
            print(f"{r.backend + ':' + r.variant:<32} {r.op:<36} {status}")
    print(f"kernels: {len(statuses)} total, {len(groups['available'])} available here (their "
          f"packages import), "
          f"{len(groups['missing'])} missing a package, {len(groups['planned'])} planned "
          f"(no JIT modules: nothing to compile)")
    return 0


def _no_counterpart(name: str):
    def run(args: argparse.Namespace) -> int:
        print(f"flashinfer {name}: {NO_COUNTERPART[name]}", file=sys.stderr)
        return 2
    return run


def add_commands(sub) -> None:
    """Add upstream's other subcommands to ``flashinfer``'s subparsers."""
    p = sub.add_parser("collect-env", help="the environment report (versions, GPUs, packages)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=cmd_collect_env)
    p = sub.add_parser("list-modules", help="the kernels wired here and whether each loads "
                                            "(upstream: its JIT modules)")
    p.add_argument("module_name", nargs="?", help="a backend, an op or backend:variant")
    p.set_defaults(run=cmd_list_modules)
    p = sub.add_parser("module-status", help="how many kernels load here (upstream: JIT modules)")
    p.add_argument("--detailed", action="store_true", help="one line per kernel")
    p.add_argument("--filter", choices=tuple(_FILTERS), default="all")
    p.set_defaults(run=cmd_module_status)
    for name, why in NO_COUNTERPART.items():
        # every argument upstream takes (--dry-run, --output, ...) is accepted and ignored
        p = sub.add_parser(name, help=f"upstream's; here: {why.split(':')[0]}",
                           prefix_chars="\x01", add_help=False)
        p.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
        p.set_defaults(run=_no_counterpart(name))
