"""The ``flashinfer`` command: what is installed, what can run here, and why a backend was chosen.

Subcommands (each takes ``--json`` where it prints data, for bug reports)::

    flashinfer show-config        versions, device, every FLASHINFER_* variable, op x backend table
    flashinfer list-backends      each backend: description, packages, the ops it declares
    flashinfer explain NAME [...] the full dispatch Decision for a typical call of NAME: an op
                                  (bmm_fp8) or a public function (mm_fp8, BatchDecode...Wrapper)
    flashinfer clear-cache        empty FLASHINFER_CACHE_DIR and the in-process Decision cache
    flashinfer --version

Everything shown comes from the data the dispatcher uses (capability_db, dispatch_rules,
op_catalog, envs), so the tables stay true as backends and rules are added. A record declared
``planned = true`` (no kernel wired yet) is shown as planned, never as a backend that runs.
``explain --sm 9.0`` simulates a GPU, so it works on a laptop. Exit codes: 0 ok (also when the
reader of the output goes away, as ``| head`` does), 1 no backend can run the problem, 2 bad
arguments or a malformed environment variable.
"""

from __future__ import annotations

import argparse
import difflib
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

from . import (__package_version__, __version__, bench_command, cli_upstream, device, dispatch,
               envs, kernel_pack, overrides)
from .backends.cutlass import runtime as cutlass_runtime
from .backend_names import BACKEND_NAMES
from .capability_db import DTYPE_NAMES, Record, database
from .optional_packages import import_error
from .dispatch_rules import DispatchRulesError
from .op_catalog import NOT_DISPATCHED, OPS, PUBLIC_FUNCTIONS, PublicFunction, op_spec
from .problems import DTYPE_ALIASES, representative

#: backend -> (module, pip distribution) pairs its adapters may import; modules named by
#: capability records (``requires`` / ``requires_any``) are added to these automatically.
#: A distribution of ``None``: not on PyPI (FA3's ``flash_attn_interface`` is built from source).
BACKEND_PACKAGES: dict[str, tuple[tuple[str, str | None], ...]] = {
    "cudnn": (("cudnn", "nvidia-cudnn-frontend"),),
    "flash_attn": (("flash_attn", "flash-attn"), ("flash_attn_interface", None),
                   ("fa3_fwd_interface", "fa3-fwd")),
    "flashmla": (("flash_mla", "sgl-flash-mla"),),
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
    "qo_len": ("qo_len", "max_qo_len"),
    "kv_len": ("kv_len", "max_kv_len"),
    "hidden_size": ("hidden_size",),
}

PLANNED_RECORD = "planned: declared, no kernel wired yet"
PLANNED_BACKEND = "planned: no kernel of it is wired yet"

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


def _status(cand: dispatch.Candidate) -> str:
    return "usable" if cand.usable else "planned" if cand.planned else "rejected"


def _decide_error(exc: Exception, invalid: Sequence[str]) -> str:
    """The first line of a decide() error; for a malformed variable (shown in full in the
    Environment variables section) only its name, so the op table does not repeat it per op."""
    bad = next((name for name in invalid if f"{name}=" in str(exc)), None)
    return f"{bad} is invalid: see Environment variables" if bad else str(exc).splitlines()[0]


def planned_backends() -> list[str]:
    """Backends that declare records but have no kernel wired yet (every record planned)."""
    db = database()
    return [b for b in BACKEND_NAMES
            if any(r.backend == b for r in db.records)
            and all(r.planned for r in db.records if r.backend == b)]


def op_table(facts: device.DeviceFacts) -> dict[str, dict[str, Any]]:
    """For each op: its representative problem, auto's pick, and every backend's status
    (usable, rejected with its first reason, planned: declared with no kernel, or no kernel)."""
    table = {}
    triton_interpret = _env_value(envs.TRITON_INTERPRET)
    invalid = [row["name"] for row in envs.snapshot() if row["error"]]
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
                status = _status(cand)
                entry["kernels"].append({
                    "backend": backend, "variant": cand.variant, "name": cand.name,
                    "status": status,
                    "reason": cand.reasons[0].message if status == "rejected" else None,
                    "verified": cand.verified})
        try:
            decision = dispatch.decide(problem)
            entry.update(auto=decision.name, auto_source=decision.source, auto_error=None)
        except (ValueError, RuntimeError) as exc:  # NoBackendError, a bad env var or rules file
            entry.update(auto=None, auto_error=_decide_error(exc, invalid))
        table[op] = entry
    return table


def config_data() -> dict[str, Any]:
    facts = device.current()
    cudnn_version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "flashinfer": __version__,
        "package_version": __package_version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": {"version": torch.__version__, "cuda": torch.version.cuda,
                  "cudnn": cudnn_version, "cuda_available": torch.cuda.is_available(),
                  "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0},
        "packages": {b: [package_status(m, d) for m, d in backend_modules(b)] for b in BACKEND_NAMES},
        "planned_backends": planned_backends(),
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
    planned = planned_backends()
    out = {}
    for backend in BACKEND_NAMES:
        out[backend] = {
            "description": db.descriptions.get(backend, ""),
            "planned": backend in planned,
            "packages": [package_status(m, d) for m, d in backend_modules(backend)],
            "ops": [{"op": r.op, "variant": r.variant, "planned": r.planned,
                     "devices": list(r.devices),
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


def _package_text(pkg: dict[str, Any], pip_hint: bool = True) -> str:
    """One package's state; ``pip_hint``: say what to pip install when it is missing."""
    if pkg["installed"]:
        return f"{pkg['module']} {pkg['version'] or '(version unknown)'}"
    if pkg["error"] and "No module named" in pkg["error"]:
        hint = f" (pip install {pkg['dist']})" if pkg["dist"] and pip_hint else ""
        return f"{pkg['module']}: not installed{hint}"
    return f"{pkg['module']}: {pkg['error']}"


def _print_config(data: dict[str, Any]) -> None:
    t = data["torch"]
    print("=== Versions ===")
    print(f"flashinfer: {data['flashinfer']} (upstream API; package {data['package_version']})")
    print(f"python:     {data['python']} ({data['platform']})")
    print(f"torch:      {t['version']} (CUDA {t['cuda'] or 'none'}, cuDNN {t['cudnn'] or 'none'}, "
          f"CUDA available: {'yes' if t['cuda_available'] else 'no'})")
    print("\n=== Backend packages ===")
    for backend, pkgs in data["packages"].items():
        planned = backend in data["planned_backends"]
        print(f"{backend:<11} " + "; ".join(_package_text(p, not planned) for p in pkgs)
              + (f"   {PLANNED_BACKEND}" if planned else ""))
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
            name = k["name"] + ("*" if k["verified"] is False and k["status"] != "planned" else "")
            status = (PLANNED_RECORD if k["status"] == "planned"
                      else k["status"] + (f": {k['reason']}" if k["reason"] else ""))
            print(f"{'':<{width}} {name:<22} {status}")
    print(UNVERIFIED_LEGEND)


def _print_backends(data: dict[str, Any]) -> None:
    for backend, info in data.items():
        planned = f" [{PLANNED_BACKEND}]" if info["planned"] else ""
        print(f"{backend}: {info['description']}{planned}")
        print("  packages: " + "; ".join(_package_text(p, not info["planned"])
                                         for p in info["packages"]))
        if not info["ops"]:
            print("  ops: none declared yet")
        for rec in info["ops"]:
            name = rec["op"] if rec["variant"] == "default" else f"{rec['op']}:{rec['variant']}"
            if rec["planned"]:
                flag = PLANNED_RECORD
            elif not rec["verified"]:
                flag = "not verified*"
            else:
                flag = "verified" if rec["verified_on"] is None else (
                    "verified on SM " + ", ".join(rec["verified_on"]))
            print(f"  {name:<28} {rec['where']:<48} {flag}")
        print()
    print(UNVERIFIED_LEGEND)


def _dump(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str))


# --------------------------------------------------------------------------------------------
# subcommands


def cmd_show_config(args: argparse.Namespace) -> int:
    """The report, whatever the environment holds; each malformed variable is also one line on
    stderr, where it is seen after a long report (the op table only names it)."""
    data = config_data()
    if args.json:
        _dump(data)
    else:
        _print_config(data)
    for row in data["env"]:
        if row["error"]:
            print(f"flashinfer show-config: {row['error']}; until it is fixed, the calls that "
                  "read it raise this ValueError", file=sys.stderr)
    return 0


def cmd_list_backends(args: argparse.Namespace) -> int:
    data = backends_data()
    if args.json:
        _dump(data)
    else:
        _print_backends(data)
    return 0


def _unique(items) -> list:
    return list(dict.fromkeys(items))


def _unknown_name(name: str) -> UsageError:
    """An unknown NAME: the op and public names closest to it (difflib, case-insensitive) and
    those that contain it."""
    names = {n.lower(): n for n in sorted(OPS) + sorted(PUBLIC_FUNCTIONS)}
    close = difflib.get_close_matches(name.lower(), list(names), n=6, cutoff=0.6)
    close += sorted((low for low in names if name.lower() in low and low not in close),
                    key=len)  # the shortest names holding it first (the likeliest meant)
    hint = f"; did you mean: {', '.join(names[low] for low in close[:8])}?" if close else ""
    return UsageError(f"{name!r} is neither an op nor a public function{hint} "
                      "(flashinfer explain --list shows every name)")


def explain_target(name: str) -> tuple[PublicFunction | None, tuple[str, ...]]:
    """What ``explain NAME`` decides: (None, (op,)) for an op, else (the public function, the
    ops one call of it dispatches). ``Class.plan`` / ``Class.run`` and ``flashinfer.gemm.mm_fp8``
    name their public function too."""
    if name in OPS:
        return None, (name,)
    parts = name.split(".")
    wrapper = parts[-2] if len(parts) > 1 and parts[-2].endswith("Wrapper") else None
    for part in (parts[-1], wrapper):
        if part in PUBLIC_FUNCTIONS:
            return PUBLIC_FUNCTIONS[part], PUBLIC_FUNCTIONS[part].ops
        if part in NOT_DISPATCHED:
            raise UsageError(f"{part} ({NOT_DISPATCHED[part]}) dispatches no op: it has one "
                             "implementation, so there is no decision to explain")
    raise _unknown_name(name)


def _explain_problems(args: argparse.Namespace, public: PublicFunction | None,
                      ops: Sequence[str]) -> tuple[list[dispatch.Problem], device.DeviceFacts]:
    """One Problem per op of the target, from the options (checked against all the target's
    ops: an option must apply to at least one, and sets what it applies to) and, for a public
    function, the features, dtypes and layout of a typical call of it."""
    name, specs = args.name, [op_spec(op) for op in ops]
    all_facts = _unique(f for spec in specs for f in spec.shape_facts)
    shape: dict[str, int] = {}
    for option, facts in NAMED_FACTS.items():
        value = getattr(args, option)
        if value is None:
            continue
        present = [f for f in facts if f in all_facts]
        if not present:
            raise UsageError(f"--{option.replace('_', '-')} does not apply to {name}; its shape "
                             f"facts: {', '.join(all_facts)} (set them with --shape fact=value)")
        shape.update((f, value) for f in present)
    for item in args.shape:
        fact, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not value.isdigit():
            raise UsageError(f"--shape {item!r} must be fact=value with an integer value; "
                             f"{name} facts: {', '.join(all_facts)}")
        if fact not in all_facts:
            raise UsageError(f"{name} has no shape fact {fact!r}; its facts: "
                             f"{', '.join(all_facts)}")
        shape[fact] = int(value)
    all_features = _unique(f for spec in specs for f in spec.features)
    features = set(args.feature) | ({"causal"} if args.causal else set())
    unknown = sorted(features - set(all_features))
    if unknown:
        raise UsageError(f"{name} has no feature(s) {', '.join(unknown)}; its features: "
                         f"{', '.join(all_features) or 'none'}")
    layouts = _unique(layout for spec in specs for layout in spec.layouts)
    if args.layout is not None and args.layout not in layouts:
        raise UsageError(f"layout {args.layout!r} is not valid for {name}; valid: "
                         f"{', '.join(layouts) or f'none ({name} has no layout)'}")
    features |= set(public.features) if public else set()
    layout = args.layout or (public.layout if public else None)
    pinned = dict(public.dtypes) if public and args.dtype is None else {}
    try:
        facts = device.simulated(args.sm) if args.sm else (device.simulated(None) if args.cpu
                                                           else device.current())
        problems = [representative(
            spec.name, facts, dtype=args.dtype,
            dtypes={r: d for r, d in pinned.items() if r in spec.dtype_roles},
            shape={f: v for f, v in shape.items() if f in spec.shape_facts},
            features=[f for f in features if f in spec.features],
            layout=layout if layout in spec.layouts else None) for spec in specs]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return problems, facts


def _decide(args: argparse.Namespace, problem: dispatch.Problem):
    """The Decision for ``problem`` under the options and environment, or the NoBackendError."""
    try:
        levels = overrides.collect(problem.family, args.backend)
        return dispatch.select(
            problem, levels, strict=envs.STRICT.get(), tuned_path=envs.TUNED_RULES.get(),
            assume_installed=args.assume_installed, triton_interpret=envs.TRITON_INTERPRET.get())
    except dispatch.NoBackendError as exc:
        return exc
    except (ValueError, TypeError, DispatchRulesError) as exc:
        raise UsageError(str(exc)) from None


def _no_backend_dict(exc: dispatch.NoBackendError) -> dict[str, Any]:
    return {"error": type(exc).__name__, "message": str(exc), "problem": exc.problem.as_dict(),
            "candidates": [{"backend": c.backend, "variant": c.variant,
                            "reasons": [r.message for r in c.reasons]} for c in exc.candidates]}


def names_data() -> dict[str, Any]:
    """Every name ``explain`` takes: the ops, the public functions with their ops, and the
    public functions that dispatch nothing."""
    return {"ops": {op: {"family": spec.family, "doc": spec.doc} for op, spec in OPS.items()},
            "public": {f.name: {"module": f.module, "ops": list(f.ops),
                                "features": list(f.features), "note": f.note}
                       for f in PUBLIC_FUNCTIONS.values()},
            "not_dispatched": dict(NOT_DISPATCHED)}


def _print_names(data: dict[str, Any]) -> None:
    print("ops (flashinfer explain OP):")
    for op, info in data["ops"].items():
        print(f"  {op:<34} {info['family']:<11} {info['doc']}")
    print("\npublic functions (flashinfer explain NAME: the ops one call dispatches, with the "
          "features a typical call uses):")
    for name, info in data["public"].items():
        features = f" [{', '.join(info['features'])}]" if info["features"] else ""
        print(f"  {name:<44} {info['module']:<22} -> {', '.join(info['ops'])}{features}")
    print("\npublic functions that dispatch nothing: " + ", ".join(data["not_dispatched"]))


def cmd_explain(args: argparse.Namespace) -> int:
    if args.list:
        (_dump if args.json else _print_names)(names_data())
        return 0
    if args.name is None:
        raise UsageError("name an op or a public function, e.g. flashinfer explain mm_fp8 --sm 9.0 "
                         "(flashinfer explain --list shows every name)")
    public, ops = explain_target(args.name)
    problems, facts = _explain_problems(args, public, ops)
    results = [_decide(args, problem) for problem in problems]
    failed = any(isinstance(r, dispatch.NoBackendError) for r in results)
    for result in results:
        if isinstance(result, dispatch.NoBackendError):
            print(f"flashinfer explain: {type(result).__name__}: {result}", file=sys.stderr)
    if args.json:
        dicts = [_no_backend_dict(r) if isinstance(r, dispatch.NoBackendError) else r.as_dict()
                 for r in results]
        _dump(dicts[0] if len(dicts) == 1 else dicts)
        return 1 if failed else 0
    if failed and len(results) == 1:
        return 1
    if public is not None:
        what = f"op {ops[0]}" if len(ops) == 1 else f"{len(ops)} ops: {', '.join(ops)}"
        print(f"{public.name} ({public.module}) dispatches {what}"
              + (f": {public.note}" if public.note else ""))
    if args.assume_installed:
        checked = " (package imports assumed to succeed)"
    elif args.sm:
        checked = " (package imports checked on this machine; --assume-installed to skip)"
    else:
        checked = ""
    print(f"device:  {facts.name}{checked}")
    for i, result in enumerate(results):
        if len(results) > 1:
            print(f"\n--- op {i + 1} of {len(results)}: {ops[i]} ---")
        print(f"no backend can run {ops[i]} (the reasons are on stderr)"
              if isinstance(result, dispatch.NoBackendError) else result.explain())
    return 1 if failed else 0


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

    from .warmup import warm_gemm, warm_merge, warm_mla, warm_moe, warm_sampling

    fresh = tempfile.mkdtemp(prefix="flashinfer_pack_")
    # a fresh Triton cache (Triton reads the variable at every lookup), not seeded from the
    # shipped packs: everything in the new pack is compiled here
    scoped = {"TRITON_CACHE_DIR": fresh, "FLASHINFER_KERNEL_PACK_DIR": "off"}
    previous = {name: os.environ.get(name) for name in scoped}
    os.environ.update(scoped)
    try:
        warm_sampling(args.vocab, "cuda", only=args.only)
        warm_gemm("cuda", args.only)
        warm_mla("cuda", args.only, backend="triton")  # what runs where FlashMLA is absent
        warm_merge("cuda", args.only)
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

    from .warmup import check_only, warm_gemm, warm_merge, warm_mla, warm_moe, warm_sampling

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
    results = (warm_sampling(args.vocab, "cuda", only=args.only) + warm_gemm("cuda", args.only)
               + warm_mla("cuda", args.only) + warm_merge("cuda", args.only))
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
    parser.add_argument("--version", action="version",
                        version=f"flashinfer {__version__} (upstream API; package "
                                f"{__package_version__})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("show-config", help="versions, device, environment and the op x backend table")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=cmd_show_config)

    p = sub.add_parser("list-backends", help="each backend, its packages and the ops it declares")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=cmd_list_backends)

    p = sub.add_parser("explain", help="the dispatch decision for a typical call of an op or a "
                       "public function",
                       description="Build a Problem for NAME (defaults: fp16, head_dim 128, 32 "
                       "query / 8 KV heads, hidden 4096; a public function adds what a typical call "
                       "of it uses) and print the dispatcher's full Decision, one per op it "
                       "dispatches.")
    p.add_argument("name", metavar="NAME", nargs="?",
                   help=f"an op ({', '.join(sorted(OPS))}) or a public function (mm_fp8, "
                        "single_decode_with_kv_cache, BatchDecodeWithPagedKVCacheWrapper, ...)")
    p.add_argument("--list", action="store_true",
                   help="list every op and public function, with the ops each dispatches")
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
    where.add_argument("--sm", help="simulate a CUDA device of this SM version: 9.0, 9, 90 or "
                       "sm_90 (9 is 9.0)")
    where.add_argument("--cpu", action="store_true", help="decide for CPU tensors")
    p.add_argument("--backend", default=None, help="as the backend= argument (name or upstream alias)")
    p.add_argument("--assume-installed", action="store_true",
                   help="pretend every vendor package imports")
    p.add_argument("--json", action="store_true", help="print Decision.as_dict() as JSON (a "
                   "list of them for a public function that dispatches several ops)")
    p.set_defaults(run=cmd_explain)

    p = sub.add_parser("clear-cache", help="empty FLASHINFER_CACHE_DIR and the decision cache")
    p.set_defaults(run=cmd_clear_cache)

    p = sub.add_parser("warmup", help="compile the sampling, fp8 GEMM and MLA kernels ahead of "
                       "time (Triton's cache)",
                       description="Call every sampling function once per vocabulary, and the "
                       "fp8 GEMMs and the MLA our Triton kernels serve once, on this GPU, so "
                       "later processes load compiled kernels instead of compiling on the first "
                       "call (see flashinfer/warmup.py).")
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

    p = sub.add_parser("bench", help="run a family's benchmark runner (benchmarks/FAMILY.py of "
                                     "the checkout)")
    bench_command.add_arguments(p)
    p.set_defaults(run=bench_command.main)
    cli_upstream.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], int] | None = getattr(args, "run", None)
    if run is None:
        parser.print_help()
        return 0
    try:
        status = run(args)
        sys.stdout.flush()  # here, so a closed pipe is seen below, not at interpreter exit
        return status
    except UsageError as exc:
        print(f"flashinfer {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader stopped reading (`flashinfer show-config | head`): it has what it wanted.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
