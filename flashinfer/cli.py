"""The ``flashinfer`` command: what is installed, what can run here, and why a backend was chosen.

Subcommands (each takes ``--json`` where it prints data, for bug reports)::

    flashinfer show-config        versions, device, every FLASHINFER_* variable, op x backend table
    flashinfer list-backends      each backend: description, packages, the ops it declares
    flashinfer explain OP [...]   the full dispatch Decision for a typical call of OP
    flashinfer clear-cache        empty FLASHINFER_CACHE_DIR and the in-process Decision cache
    flashinfer --version

Everything shown comes from the data the dispatcher uses (capability_db, dispatch_rules,
op_catalog, envs), so the tables stay true as backends and rules are added. ``explain --sm 9.0``
simulates a GPU, so it works on a laptop. Exit codes: 0 ok, 1 no backend can run the problem,
2 bad arguments or a malformed environment variable.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import json
import os
import platform
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from . import __version__, device, dispatch, envs, kernel_pack, overrides
from .backends.cutlass import runtime as cutlass_runtime
from .backend_names import BACKEND_NAMES
from .capability_db import DTYPE_NAMES, Record, database
from .optional_packages import import_error
from .dispatch_rules import DispatchRulesError
from .op_catalog import OPS, op_spec
from .problems import DTYPE_ALIASES, representative

#: backend -> (module, pip distribution) pairs its adapters may import; modules named by
#: capability records (``requires`` / ``requires_any``) are added to these automatically.
#: A distribution of ``None``: not on PyPI (FA3's ``flash_attn_interface`` is built from source).
BACKEND_PACKAGES: dict[str, tuple[tuple[str, str | None], ...]] = {
    "cudnn": (("cudnn", "nvidia-cudnn-frontend"),),
    "flash_attn": (("flash_attn", "flash-attn"), ("flash_attn_interface", None),
                   ("fa3_fwd_interface", "fa3-fwd")),
    "trtllm": (("tensorrt_llm", "tensorrt-llm"),),
    "cutlass": (("cutlass_cppgen", "nvidia-cutlass"), ("cutlass", "nvidia-cutlass-dsl")),
    "torch": (("torch", "torch"),),
    "triton": (("triton", "triton"),),
    "reference": (("torch", "torch"),),
}

#: --head-dim style options -> the shape facts they set (those the op has).
NAMED_FACTS: dict[str, tuple[str, ...]] = {
    "head_dim": ("head_dim_qk", "head_dim_vo", "head_dim", "rotary_dim"),
    "num_qo_heads": ("num_qo_heads", "num_q_heads"),
    "num_kv_heads": ("num_kv_heads", "num_k_heads"),
    "qo_len": ("qo_len",),
    "kv_len": ("kv_len",),
    "hidden_size": ("hidden_size",),
}

UNVERIFIED_LEGEND = ("* = capability record not verified on hardware for this SM yet "
                     "(verified = false, or this SM is not in its verified_on list)")


class UsageError(Exception):
    """A bad argument or environment value: printed, exit status 2."""


# --------------------------------------------------------------------------------------------
# data gathering (shared by the text and JSON renderings)


@functools.lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    """Top-level module -> the installed distributions that provide it."""
    try:
        return dict(importlib.metadata.packages_distributions())
    except Exception:  # noqa: BLE001 - metadata scanning must never break show-config
        return {}


def _module_version(module: str, dist: str | None) -> str | None:
    names = ([dist] if dist else []) + _distributions().get(module.split(".")[0], [])
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return getattr(sys.modules.get(module), "__version__", None)


def backend_modules(backend: str) -> list[tuple[str, str | None]]:
    """(module, distribution) pairs for ``backend``: the known ones, then any its records require."""
    pairs: list[tuple[str, str | None]] = list(BACKEND_PACKAGES.get(backend, ()))
    for rec in database().records:
        if rec.backend == backend:
            for module in rec.requires + rec.requires_any:
                if module not in [m for m, _ in pairs]:
                    pairs.append((module, None))
    return pairs


def package_status(module: str, dist: str | None) -> dict[str, Any]:
    error = import_error(module)
    return {"module": module, "dist": dist, "installed": error is None,
            "version": None if error else _module_version(module, dist), "error": error}


def _env_value(var: envs.EnvVar) -> Any:
    """The variable's value, or its default when malformed (show-config reports the error)."""
    try:
        return var.get()
    except ValueError:
        return var.default


def op_table(facts: device.DeviceFacts) -> dict[str, dict[str, Any]]:
    """For each op: its representative problem, auto's pick, and every backend's status."""
    table = {}
    triton_interpret = _env_value(envs.TRITON_INTERPRET)
    for op in OPS:
        entry: dict[str, Any] = {"kernels": []}
        try:
            problem = representative(op, facts)
            entry["problem"] = problem.as_dict()
            candidates = dispatch.evaluate_candidates(problem, triton_interpret=triton_interpret)
        except Exception as exc:  # noqa: BLE001 - a broken adapter is reported, not fatal here
            entry.update(problem=None, auto=None, auto_error=f"{type(exc).__name__}: {exc}")
            table[op] = entry
            continue
        for backend in BACKEND_NAMES:
            mine = [c for c in candidates if c.backend == backend]
            if not mine:
                entry["kernels"].append({"backend": backend, "variant": None, "name": backend,
                                         "status": "no kernel", "reason": None, "verified": None})
            for cand in mine:
                entry["kernels"].append({
                    "backend": backend, "variant": cand.variant, "name": cand.name,
                    "status": "usable" if cand.usable else "rejected",
                    "reason": cand.reasons[0].message if cand.reasons else None,
                    "verified": cand.verified})
        try:
            decision = dispatch.decide(problem)
            entry.update(auto=decision.name, auto_source=decision.source, auto_error=None)
        except (ValueError, RuntimeError) as exc:  # NoBackendError, a bad env var or rules file
            entry.update(auto=None, auto_error=str(exc).splitlines()[0])
        table[op] = entry
    return table


def config_data() -> dict[str, Any]:
    facts = device.current()
    cudnn_version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "flashinfer": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": {"version": torch.__version__, "cuda": torch.version.cuda,
                  "cudnn": cudnn_version, "cuda_available": torch.cuda.is_available(),
                  "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0},
        "packages": {b: [package_status(m, d) for m, d in backend_modules(b)] for b in BACKEND_NAMES},
        "device": {"kind": facts.kind, "name": facts.name, "sm": facts.sm_str,
                   "family": device.sm_family(facts.sm)},
        "env": envs.snapshot(),
        "kernel_packs": kernel_pack.describe(),
        "cutlass_kernels": cutlass_runtime.describe_cache(),
        "ops": op_table(facts),
    }


def _sm_range(rec: Record) -> str:
    parts = []
    if rec.sm_min is not None:
        parts.append(f"cuda SM {rec.sm_min[0]}.{rec.sm_min[1]}..{rec.sm_max[0]}.{rec.sm_max[1]}")
    if "cpu" in rec.devices:
        parts.append("cpu")
    elif rec.cpu_under_triton_interpret:
        parts.append("cpu under TRITON_INTERPRET=1")
    return ", ".join(parts)


def backends_data() -> dict[str, Any]:
    db = database()
    out = {}
    for backend in BACKEND_NAMES:
        out[backend] = {
            "description": db.descriptions.get(backend, ""),
            "packages": [package_status(m, d) for m, d in backend_modules(backend)],
            "ops": [{"op": r.op, "variant": r.variant, "devices": list(r.devices),
                     "sm_min": None if r.sm_min is None else f"{r.sm_min[0]}.{r.sm_min[1]}",
                     "sm_max": None if r.sm_max is None else f"{r.sm_max[0]}.{r.sm_max[1]}",
                     "where": _sm_range(r), "verified": r.verified,
                     "verified_on": None if r.verified_on is None
                     else [f"{a}.{b}" for a, b in r.verified_on],
                     "note": r.note,
                     "requires": list(r.requires), "requires_any": list(r.requires_any)}
                    for r in db.records if r.backend == backend],
        }
    return out


# --------------------------------------------------------------------------------------------
# text rendering


def _package_text(pkg: dict[str, Any]) -> str:
    if pkg["installed"]:
        return f"{pkg['module']} {pkg['version'] or '(version unknown)'}"
    if pkg["error"] and "No module named" in pkg["error"]:
        hint = f" (pip install {pkg['dist']})" if pkg["dist"] else ""
        return f"{pkg['module']}: not installed{hint}"
    return f"{pkg['module']}: {pkg['error']}"


def _print_config(data: dict[str, Any]) -> None:
    t = data["torch"]
    print("=== Versions ===")
    print(f"flashinfer: {data['flashinfer']}")
    print(f"python:     {data['python']} ({data['platform']})")
    print(f"torch:      {t['version']} (CUDA {t['cuda'] or 'none'}, cuDNN {t['cudnn'] or 'none'}, "
          f"CUDA available: {'yes' if t['cuda_available'] else 'no'})")
    print("\n=== Backend packages ===")
    for backend, pkgs in data["packages"].items():
        print(f"{backend:<11} " + "; ".join(_package_text(p) for p in pkgs))
    d = data["device"]
    print("\n=== Device ===")
    print("cpu (no CUDA device)" if d["kind"] == "cpu"
          else f"{d['name']}, SM {d['sm']} (rules family {d['family']})")
    print("\n=== Environment variables ===")
    for row in data["env"]:
        value = "(unset)" if row["raw"] is None else repr(row["raw"])
        line = f"{row['name']:<30} {value:<14} default: {row['default']!r}"
        if row["error"]:
            line += f"   INVALID: {row['error']}"
        print(line)
    print("\n=== Compiled kernel packs (flashinfer/kernel_pack.py) ===")
    for line in data["kernel_packs"]:
        print(line)
    print("\n=== Compiled CUTLASS kernels (backends/cutlass/) ===")
    print(data["cutlass_kernels"])
    print(f"\n=== Ops x backends on {'cpu' if d['kind'] == 'cpu' else 'SM ' + d['sm']} "
          "(typical fp16 problem; `flashinfer explain OP` for details) ===")
    width = max([16] + [len(op) for op in data["ops"]])
    print(f"{'op':<{width}} {'backend':<22} status")
    for op, entry in data["ops"].items():
        auto = (f"{entry['auto']} (source: {entry['auto_source']})" if entry["auto"]
                else f"none ({entry['auto_error']})")
        print(f"{op:<{width}} {'(auto picks)':<22} {auto}")
        for k in entry["kernels"]:
            name = k["name"] + ("*" if k["verified"] is False else "")
            status = k["status"] + (f": {k['reason']}" if k["reason"] else "")
            print(f"{'':<{width}} {name:<22} {status}")
    print(UNVERIFIED_LEGEND)


def _print_backends(data: dict[str, Any]) -> None:
    for backend, info in data.items():
        print(f"{backend}: {info['description']}")
        print("  packages: " + "; ".join(_package_text(p) for p in info["packages"]))
        if not info["ops"]:
            print("  ops: none declared yet")
        for rec in info["ops"]:
            name = rec["op"] if rec["variant"] == "default" else f"{rec['op']}:{rec['variant']}"
            flag = "not verified*" if not rec["verified"] else (
                "verified" if rec["verified_on"] is None
                else "verified on SM " + ", ".join(rec["verified_on"]))
            print(f"  {name:<28} {rec['where']:<48} {flag}")
        print()
    print(UNVERIFIED_LEGEND)


def _dump(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str))


# --------------------------------------------------------------------------------------------
# subcommands


def cmd_show_config(args: argparse.Namespace) -> int:
    data = config_data()
    if args.json:
        _dump(data)
    else:
        _print_config(data)
    return 0


def cmd_list_backends(args: argparse.Namespace) -> int:
    data = backends_data()
    if args.json:
        _dump(data)
    else:
        _print_backends(data)
    return 0


def _explain_problem(args: argparse.Namespace) -> tuple[dispatch.Problem, device.DeviceFacts]:
    spec = op_spec(args.op)
    shape: dict[str, int] = {}
    for option, facts in NAMED_FACTS.items():
        value = getattr(args, option)
        if value is None:
            continue
        present = [f for f in facts if f in spec.shape_facts]
        if not present:
            raise UsageError(f"--{option.replace('_', '-')} does not apply to {args.op}; its shape "
                             f"facts: {', '.join(spec.shape_facts)} (set them with --shape fact=value)")
        shape.update((f, value) for f in present)
    for item in args.shape:
        fact, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            raise UsageError(f"--shape {item!r} must be fact=value with an integer value; "
                             f"{args.op} facts: {', '.join(spec.shape_facts)}")
        shape[fact.strip()] = int(value)
    features = list(args.feature)
    if args.causal:
        features.append("causal")
    try:
        facts = device.simulated(args.sm) if args.sm else (device.simulated(None) if args.cpu
                                                           else device.current())
        problem = representative(args.op, facts, dtype=args.dtype, shape=shape, features=features,
                                 layout=args.layout)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return problem, facts


def cmd_explain(args: argparse.Namespace) -> int:
    problem, facts = _explain_problem(args)
    try:
        levels = overrides.collect(problem.family, args.backend)
        decision = dispatch.select(
            problem, levels, strict=envs.STRICT.get(), tuned_path=envs.TUNED_RULES.get(),
            assume_installed=args.assume_installed, triton_interpret=envs.TRITON_INTERPRET.get())
    except dispatch.NoBackendError as exc:
        if args.json:
            _dump({"error": type(exc).__name__, "message": str(exc),
                   "problem": exc.problem.as_dict(),
                   "candidates": [{"backend": c.backend, "variant": c.variant,
                                   "reasons": [r.message for r in c.reasons]}
                                  for c in exc.candidates]})
        print(f"flashinfer explain: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except (ValueError, TypeError, DispatchRulesError) as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        _dump(decision.as_dict())
        return 0
    if args.assume_installed:
        checked = " (package imports assumed to succeed)"
    elif args.sm:
        checked = " (package imports checked on this machine; --assume-installed to skip)"
    else:
        checked = ""
    print(f"device:  {facts.name}{checked}")
    print(decision.explain())
    return 0


def cmd_clear_cache(args: argparse.Namespace) -> int:
    try:
        root = Path(os.path.expanduser(envs.CACHE_DIR.get())).resolve()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if root == Path(root.anchor) or root == Path.home().resolve():
        raise UsageError(f"FLASHINFER_CACHE_DIR={root} is a root or home directory; refusing to empty it")
    removed = []
    if root.is_dir():
        for entry in sorted(root.iterdir()):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry.name)
    elif root.exists():
        raise UsageError(f"FLASHINFER_CACHE_DIR={root} is not a directory")
    dispatch.clear_cache()
    if removed:
        print(f"removed from {root}: " + ", ".join(removed))
    else:
        print(f"{root}: nothing to remove")
    print("cleared the in-process dispatch decision cache")
    return 0


def _export_pack(args: argparse.Namespace) -> int:
    import tempfile

    import triton

    from .warmup import warm_gemm, warm_moe, warm_sampling

    fresh = tempfile.mkdtemp(prefix="flashinfer_pack_")
    # a fresh Triton cache (Triton reads the variable at every lookup), not seeded from the
    # shipped packs: everything in the new pack is compiled here
    scoped = {"TRITON_CACHE_DIR": fresh, "FLASHINFER_KERNEL_PACK_DIR": "off"}
    previous = {name: os.environ.get(name) for name in scoped}
    os.environ.update(scoped)
    try:
        warm_sampling(args.vocab, "cuda", only=args.only)
        warm_gemm("cuda", args.only)
        if args.moe is not None:
            warm_moe("cuda", *args.moe, quant=args.moe_quant)
    finally:
        for name, value in previous.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
    major, minor = torch.cuda.get_device_capability()
    manifest = kernel_pack.export_pack(Path(fresh), args.export_pack, triton.__version__,
                                       major * 10 + minor)
    shutil.rmtree(fresh, ignore_errors=True)
    size = args.export_pack.stat().st_size
    print(f"{args.export_pack}: {len(manifest['entries'])} compiled kernels, {size / 2**20:.2f} MiB "
          f"(Triton {manifest['triton']}, sm{manifest['arch']})")
    return 0


def _warm_cutlass(args: argparse.Namespace) -> int:
    """``warmup --cutlass``: compile (or load) the CUTLASS GEMM kernels into the disk cache."""
    from .backends import cutlass
    from .optional_packages import import_error

    missing = import_error("cutlass_cppgen")
    if missing is not None:
        print(f"cutlass_cppgen does not import ({missing}): install nvidia-cutlass")
        return 1
    from .warmup import cutlass_specs

    rows = cutlass.compile_all(cutlass_specs(torch.cuda.get_device_capability()), "cuda")
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            print(f"cutlass {r['kernel']:40s} {r['seconds']:6.1f} s  "
                  f"{'ok' if r['ok'] else 'WRONG RESULT'}")
        print(f"kernels in {cutlass.runtime.cache_file()}")
    return 0 if all(r["ok"] for r in rows) else 1


def cmd_warmup(args: argparse.Namespace) -> int:
    import torch

    from .warmup import check_only, warm_gemm, warm_moe, warm_sampling

    try:
        check_only(args.only)  # a bad --only fails here, GPU or not
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to compile (Triton kernels run only on GPUs here)")
        return 0
    if args.cutlass:
        return _warm_cutlass(args)
    if args.export_pack is not None:
        return _export_pack(args)
    results = warm_sampling(args.vocab, "cuda", only=args.only) + warm_gemm("cuda", args.only)
    if args.moe is not None:
        results += warm_moe("cuda", *args.moe, quant=args.moe_quant)
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    for r in results:
        vocab = f"vocab {r['vocab']:<7d}" if "vocab" in r else " " * 13
        print(f"{r['function']:42s} {vocab} {r['seconds']:6.2f} s  -> {r['kernel']}")
    total = sum(r["seconds"] for r in results)
    print(f"{len(results)} calls, {total:.1f} s; Triton's cache: "
          f"{os.environ.get('TRITON_CACHE_DIR', '~/.triton/cache')}")
    return 0


# --------------------------------------------------------------------------------------------
# argument parsing


def _moe_layer(text: str) -> tuple[int, int, int, int]:
    parts = text.split(",")
    if len(parts) != 4 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(
            f"--moe wants four positive integers E,K,H,I (experts, top-k, hidden, "
            f"intermediate), got {text!r}")
    experts, top_k, hidden, inter = (int(p) for p in parts)
    if top_k > experts:
        raise argparse.ArgumentTypeError(f"--moe: top-k {top_k} is more than the {experts} experts")
    return experts, top_k, hidden, inter


def _dtype(text: str) -> str:
    name = DTYPE_ALIASES.get(text.lower(), text.lower())
    if name not in DTYPE_NAMES:
        raise argparse.ArgumentTypeError(
            f"unknown dtype {text!r}; valid: {', '.join(DTYPE_NAMES)} (or {', '.join(DTYPE_ALIASES)})")
    return name


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flashinfer", description="FlashInfer-compatible kernels behind a backend dispatcher: "
        "inspect what is installed and why a backend is chosen.")
    parser.add_argument("--version", action="version", version=f"flashinfer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("show-config", help="versions, device, environment and the op x backend table")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=cmd_show_config)

    p = sub.add_parser("list-backends", help="each backend, its packages and the ops it declares")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=cmd_list_backends)

    p = sub.add_parser("explain", help="the dispatch decision for a typical call of OP",
                       description="Build a Problem for OP (defaults: fp16, head_dim 128, 32 query / "
                       "8 KV heads, hidden 4096) and print the dispatcher's full Decision.")
    p.add_argument("op", metavar="OP", choices=sorted(OPS), help=f"one of: {', '.join(sorted(OPS))}")
    p.add_argument("--dtype", type=_dtype, default=None, help="dtype of every value tensor (default float16; float32 for sampling ops)")
    for option in NAMED_FACTS:
        p.add_argument(f"--{option.replace('_', '-')}", dest=option, type=_positive, metavar="N")
    p.add_argument("--causal", action="store_true", help="use the causal feature")
    p.add_argument("--feature", action="extend", nargs="+", default=[], metavar="F",
                   help="optional features used by the call (see op_catalog)")
    p.add_argument("--layout", choices=("NHD", "HND"), help="KV layout (attention ops)")
    p.add_argument("--shape", action="extend", nargs="+", default=[], metavar="FACT=N",
                   help="set any shape fact, e.g. --shape num_rows=8")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--sm", help="simulate a CUDA device of this SM version, e.g. 9.0")
    where.add_argument("--cpu", action="store_true", help="decide for CPU tensors")
    p.add_argument("--backend", default=None, help="as the backend= argument (name or upstream alias)")
    p.add_argument("--assume-installed", action="store_true",
                   help="pretend every vendor package imports")
    p.add_argument("--json", action="store_true", help="print Decision.as_dict() as JSON")
    p.set_defaults(run=cmd_explain)

    p = sub.add_parser("clear-cache", help="empty FLASHINFER_CACHE_DIR and the decision cache")
    p.set_defaults(run=cmd_clear_cache)

    p = sub.add_parser("warmup", help="compile the sampling and fp8 GEMM kernels ahead of time "
                       "(Triton's cache)",
                       description="Call every sampling function once per vocabulary, and the "
                       "fp8 GEMMs our Triton kernels serve once, on this GPU, so later processes "
                       "load compiled kernels instead of compiling on the first call (see "
                       "flashinfer/warmup.py).")
    p.add_argument("--vocab", type=_positive, nargs="+", default=[32000, 128256, 151936],
                   metavar="V", help="vocabulary sizes served (default: 32000 128256 151936)")
    p.add_argument("--only", default="", metavar="NAMES",
                   help="comma-separated substrings of the functions to warm (default: all), "
                        "e.g. top_k_top_p,softmax,bmm_fp8")
    p.add_argument("--moe", type=_moe_layer, default=None, metavar="E,K,H,I",
                   help="also warm the fused MoE of a layer with E experts, top-K routing, hidden "
                        "size H and intermediate size I, e.g. 256,8,7168,2048 (DeepSeek-V3)")
    p.add_argument("--moe-quant", choices=("fp8_block", "bf16"), default="fp8_block",
                   help="the experts' quantisation for --moe (default fp8_block: fp8 weights "
                        "with 128x128 scales)")
    p.add_argument("--export-pack", type=Path, default=None, metavar="FILE",
                   help="compile into a fresh Triton cache and write its kernels to FILE, a kernel "
                        "pack (flashinfer/kernel_pack.py; the shipped ones live in "
                        "flashinfer/kernel_packs/triton-<version>-sm<arch>.tar.xz)")
    p.add_argument("--cutlass", action="store_true",
                   help="instead: compile the CUTLASS GEMM kernels (nvcc, about a minute each) "
                        "into FLASHINFER_CACHE_DIR/cutlass, where every later process finds them")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=cmd_warmup)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], int] | None = getattr(args, "run", None)
    if run is None:
        parser.print_help()
        return 0
    try:
        return run(args)
    except UsageError as exc:
        print(f"flashinfer {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
