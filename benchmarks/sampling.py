"""Sampling benchmark: every sampling function x backend over a batch x vocabulary grid;
upstream FlashInfer 0.7.2 side by side, and the first call in a fresh process.

    python benchmarks/sampling.py                          # GPU: the grid below
    flashinfer bench sampling --shapes quick               # a handful of target points
    PYTHONPATH=/tmp/anchor:/tmp/site python benchmarks/sampling.py --impl upstream
    python benchmarks/sampling.py --first-call             # import + first call, fresh processes
    python benchmarks/sampling.py --plot ours.jsonl upstream.jsonl

The runner calls ``flashinfer.sampling.<function>`` by its upstream name, so the same file
measures upstream FlashInfer 0.7.2 when that package is first on PYTHONPATH (``--impl upstream``,
a separate process: both packages are named ``flashinfer``; upstream has no ``backend=``).
``torch_sort_inline`` is a sort / cumsum / mask / renormalise / ``torch.multinomial`` baseline
written in this file (the path serving engines use without a fused kernel), timed in both modes.

Inputs: logits = randn * ``--scale`` (4: peaked like a language model; ``--flat``: scale 1),
probabilities = softmax(logits), fp32, fixed seed, rotated across copies past the 60 MB L2.
Timing as every runner (``timing.py``): ``gpu_ms`` replays the rotated calls captured in a CUDA
graph, ``eager_ms`` times back-to-back eager calls, ``ms`` is ``gpu_ms`` when the call can be
captured; ``tb_per_s`` = bytes of the input read once / ``ms``; ``first_call_s`` the backend's
first call of the function in the process. Every (point, backend) runs under a deadline
(``--case-timeout``; the first call of a function gets ``--first-timeout``: upstream JIT-builds
its module there); a backend that timed out is skipped at the function's later points.
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()  # --first-call child: import time counts from here

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

_T_TORCH = time.perf_counter()

import harness  # noqa: E402 - after the timers: the child's import time is flashinfer's
import timing  # noqa: E402

FAMILY = "sampling"
IMPLS = ("ours", "upstream")
TIMING = timing.METHOD + "; tb_per_s = input bytes read once / ms"

# ------------------------------------------------------------------------------ shape table
BATCHES = (1, 16, 64, 256, 512)
VOCABS = (32000, 128256, 256000)  # 32k, 128k (Llama 3), 256k (Gemma)
CHAIN_BATCHES = (1, 16, 64)
N_DRAFT = 4
TOP_K, TOP_P, MIN_P = 50, 0.9, 0.1
SEED, OFFSET = 1234, 0

#: (function, label, input kind, keyword arguments, takes seed/offset, sort baseline (k, p, joint))
FUNCTIONS = [
    ("sampling_from_probs", "", "probs", {}, True, None),
    ("top_p_sampling_from_probs", "", "probs", {"top_p": TOP_P}, True, (None, TOP_P, False)),
    ("top_k_sampling_from_probs", "", "probs", {"top_k": TOP_K}, True, (TOP_K, None, False)),
    ("min_p_sampling_from_probs", "", "probs", {"min_p": MIN_P}, True, None),
    ("top_k_top_p_sampling_from_probs", "top_k_first", "probs",
     {"top_k": TOP_K, "top_p": TOP_P, "filter_apply_order": "top_k_first"}, True, (TOP_K, TOP_P, False)),
    ("top_k_top_p_sampling_from_probs", "joint", "probs",
     {"top_k": TOP_K, "top_p": TOP_P, "filter_apply_order": "joint"}, True, (TOP_K, TOP_P, True)),
    ("top_k_top_p_sampling_from_logits", "top_k_first", "logits",
     {"top_k": TOP_K, "top_p": TOP_P, "filter_apply_order": "top_k_first"}, True, (TOP_K, TOP_P, False)),
    ("top_p_renorm_probs", "", "probs", {"top_p": TOP_P}, False, None),
    ("top_k_renorm_probs", "", "probs", {"top_k": TOP_K}, False, None),
    ("top_k_mask_logits", "", "logits", {"top_k": TOP_K}, False, None),
    ("softmax", "", "logits", {}, False, None),
    ("sampling_from_logits", "", "logits", {}, True, None),
    ("chain_speculative_sampling", f"n={N_DRAFT}", "chain", {}, True, None),
]
SPEC = {(f[0], f[1]): f for f in FUNCTIONS}
TARGET = ("top_k_top_p_sampling_from_probs", "top_k_first")
QUICK = [("top_k_top_p_sampling_from_probs", b, 128256) for b in (1, 64, 256, 512)] + [
    ("top_k_top_p_sampling_from_probs", 256, 32000), ("top_k_top_p_sampling_from_probs", 256, 256000),
    ("top_p_sampling_from_probs", 256, 128256), ("sampling_from_probs", 256, 128256),
    ("top_k_mask_logits", 256, 128256), ("softmax", 256, 128256),
    ("chain_speculative_sampling", 16, 128256)]
TINY = {"batch": 2, "vocab": 1000, "functions": ("top_k_top_p_sampling_from_probs",
                                                  "top_p_renorm_probs", "softmax",
                                                  "chain_speculative_sampling")}

OURS_BACKENDS = ("auto", "triton", "torch")
#: the Triton variants timed beside ``auto`` for each function (the rules choose among them)
VARIANTS = {
    "top_k_sampling_from_probs": ("triton:two_pass",),  # the two-pass top-k sampler
    "top_k_top_p_sampling_from_probs": ("triton:two_pass",),
    # the two-pass sampler reading the logits; softmax written first, then the two-pass sampler
    "top_k_top_p_sampling_from_logits": ("triton:two_pass", "triton:softmax_two_pass"),
    "top_p_sampling_from_probs": ("triton:nucleus",),  # top-p alone by lean rejection rounds
    "top_k_renorm_probs": ("triton:two_pass",),  # tau from the lanes' candidates
    "top_k_mask_logits": ("triton:two_pass",),
    "sampling_from_logits": ("triton:one_pass",),  # one read, one exponential per element
    "softmax": ("triton:streaming",),  # one exp per element, split rows at small batch
    "top_p_renorm_probs": ("triton:bracket",),  # pivot passes narrow a bracket, then a sort
}
REFERENCE_MAX = (16, 32000)  # the reference backend only up to this (batch, vocab) unless --reference


def add_arguments(parser) -> None:
    parser.add_argument("--first-call", action="store_true",
                        help="only the first call in fresh processes (import included)")
    parser.add_argument("--reference", action="store_true",
                        help="time the reference backend at every point")
    parser.add_argument("--skip", default="", help="leave out functions whose name contains this")
    parser.add_argument("--scale", type=float, default=4.0, help="logits = randn * scale")
    parser.add_argument("--flat", action="store_true", help="flatter distributions (scale 1)")
    parser.add_argument("--case-timeout", type=float, default=120.0)
    parser.add_argument("--first-timeout", type=float, default=540.0,
                        help="deadline of a function's first call (upstream JIT) and of --first-call")


# ------------------------------------------------------------------------------ cases
def cases(args) -> list[dict]:
    """The first-call runs (``--first-call``), else a case per (function, batch, vocabulary) of
    the shape table."""
    if args.first_call:
        return [{"case": f"first call {run}", "run": run} for run in first_call_runs(args)]
    rows = []
    for name, label, kind, *_ in FUNCTIONS:
        if args.skip and args.skip in name:
            continue
        if args.shapes == "tiny":
            grid = [(TINY["batch"], TINY["vocab"])] if name in TINY["functions"] and label != "joint" else []
        elif args.shapes == "quick":
            grid = [(b, v) for n, b, v in QUICK if n == name]
        else:
            grid = [(b, v) for v in VOCABS for b in (CHAIN_BATCHES if kind == "chain" else BATCHES)]
        rows += [{"case": f"{name}{'[' + label + ']' if label else ''} B={b} V={v}",
                  "function": name, "label": label, "batch": b, "vocab": v,
                  "num_draft": N_DRAFT if kind == "chain" else None} for b, v in grid]
    return rows


def backends(case: dict, args) -> list[str]:
    """ours: auto, triton, torch, the function's Triton variants and (small points) the reference;
    upstream: its one call; plus the inline sort baseline where the function has one."""
    if "run" in case:
        return [args.impl]
    sort_cfg = SPEC[(case["function"], case["label"])][5]
    if args.backends:
        names = list(args.backends)
    elif args.device == "cpu":
        names = ["auto", "reference", "torch"]
    elif args.impl == "upstream":
        names = ["upstream"]
    else:
        names = list(OURS_BACKENDS) + list(VARIANTS.get(case["function"], ()))
        if args.reference or (case["batch"] <= REFERENCE_MAX[0] and case["vocab"] <= REFERENCE_MAX[1]):
            names.append("reference")
    if sort_cfg is not None and "torch_sort_inline" not in names:
        names.append("torch_sort_inline")
    return names


# ------------------------------------------------------------------------------ inputs, calls
def make_inputs(kind: str, batch: int, vocab: int, scale: float, device: str, copies: int,
                seed: int = SEED) -> list[tuple]:
    """Argument tuples (fp32, never zeros): (probs,) / (logits,) / (draft, draft_ids, target)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    sets = []
    for _ in range(copies):
        if kind == "chain":
            target_logits = torch.randn(batch, N_DRAFT + 1, vocab, device=device, generator=gen) * scale
            noise = torch.randn(batch, N_DRAFT, vocab, device=device, generator=gen) * (0.5 * scale)
            draft = torch.softmax(target_logits[:, :N_DRAFT] + noise, dim=-1)
            ids = torch.multinomial(draft.reshape(-1, vocab), 1, generator=gen).reshape(batch, N_DRAFT)
            sets.append((draft.contiguous(), ids.to(torch.int32), torch.softmax(target_logits, dim=-1)))
            continue
        logits = torch.randn(batch, vocab, device=device, generator=gen) * scale
        sets.append((logits,) if kind == "logits" else (torch.softmax(logits, dim=-1),))
    return sets


def input_bytes(sets: list[tuple]) -> int:
    """Bytes of one argument set's floating-point inputs (each read once)."""
    return sum(t.numel() * t.element_size() for t in sets[0] if t.is_floating_point())


_ARANGE: dict = {}


def torch_sort_sample(probs: torch.Tensor, top_k, top_p, joint: bool) -> torch.Tensor:
    """Sort-based top-k / top-p sampling: sort, cumsum, mask, renormalise, torch.multinomial."""
    vocab = probs.shape[-1]
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    total = sorted_p.sum(dim=-1, keepdim=True)
    if top_k is not None and top_k < vocab:
        key = (vocab, probs.device)
        rank = _ARANGE.get(key)
        if rank is None:
            rank = _ARANGE[key] = torch.arange(vocab, device=probs.device)
        sorted_p = sorted_p.masked_fill(rank >= top_k, 0.0)
    if top_p is not None and top_p < 1.0:
        cum = sorted_p.cumsum(dim=-1)
        mass = total if joint else cum[:, -1:]  # top_k_first: top-p of the top-k-renormalised row
        sorted_p = sorted_p.masked_fill(cum - sorted_p >= top_p * mass, 0.0)
    sorted_p = sorted_p / sorted_p.sum(dim=-1, keepdim=True)
    choice = torch.multinomial(sorted_p, 1)
    return order.gather(-1, choice).squeeze(-1).to(torch.int32)


def make_call(sampling, fn_name: str, kind: str, kwargs: dict, seeded: bool, sort_cfg):
    """→ call(args, backend) for a backend label: ours' backend names, "upstream", "torch_sort_inline"."""
    extra = dict(kwargs, **({"seed": SEED, "offset": OFFSET} if seeded else {}))
    fn = getattr(sampling, fn_name, None)

    def call(args, backend):
        if backend == "torch_sort_inline":
            x = args[0] if kind != "logits" else torch.softmax(args[0], dim=-1)
            return torch_sort_sample(x, *sort_cfg)
        if fn is None:
            raise AttributeError(f"flashinfer.sampling has no {fn_name}")
        if backend == "upstream":
            return fn(*args, **extra)
        return fn(*args, **extra, backend=backend)
    return call


# ------------------------------------------------------------------------------ timing
#: per run (``prepare`` resets them): the (function, backend) pairs called once already, and
#: (function, label, backend) -> why it is skipped from here on (it timed out)
_FIRST_SEEN: set = set()
_GIVEN_UP: dict = {}


def prepare(args) -> dict:
    _FIRST_SEEN.clear()
    _GIVEN_UP.clear()
    return {"inputs": {"dtype": "float32", "logit_scale": 1.0 if args.flat else args.scale,
                       "seed": SEED, "top_k": TOP_K, "top_p": TOP_P, "min_p": MIN_P,
                       "num_draft": N_DRAFT}}


def measure(sets, call, backend: str, iters: int, nbytes: int) -> dict:
    """First call (builds, JIT, caches: ``first_call_s``; auto's kernels), then graph and eager time."""
    t = time.perf_counter()
    chosen = harness.chosen(lambda: call(sets[0], backend))
    if sets[0][0].is_cuda:
        torch.cuda.synchronize()
    first_s = time.perf_counter() - t
    entry = timing.graph_and_eager_ms(sets, call, backend, iters, passthrough=(timing.CaseTimeout,))
    entry.update(tb_per_s=nbytes / entry["ms"] / 1e9, first_call_s=first_s)
    if backend == "auto":
        entry["chosen"] = chosen
    return entry


def run_case(case: dict, args) -> dict:
    """Every backend of one point under its deadline (or one first-call run)."""
    if "run" in case:
        return {"backends": {args.impl: first_call(case["run"], args)}}
    import flashinfer.sampling as sampling  # noqa: PLC0415 - ours or upstream, whichever is first

    fn_name, label, kind, kwargs, seeded, sort_cfg = SPEC[(case["function"], case["label"])]
    scale = 1.0 if args.flat else args.scale
    try:
        probe = make_inputs(kind, case["batch"], case["vocab"], scale, args.device, 1)
        nbytes = input_bytes(probe)
        sets = probe + make_inputs(kind, case["batch"], case["vocab"], scale, args.device,
                                   timing.copies(nbytes, args.device) - 1, seed=SEED + 1)
    except Exception as exc:  # noqa: BLE001 - e.g. out of memory
        return {"backends": {b: harness.error_entry(exc) for b in backends(case, args)}}
    call = make_call(sampling, fn_name, kind, kwargs, seeded, sort_cfg)
    out = {}
    for backend in backends(case, args):
        key = (fn_name, label, backend)
        if key in _GIVEN_UP or backend in _GIVEN_UP:
            out[backend] = {"skipped": _GIVEN_UP.get(key) or _GIVEN_UP[backend]}
            continue
        first = (fn_name, backend) not in _FIRST_SEEN
        _FIRST_SEEN.add((fn_name, backend))
        try:
            with timing.deadline(args.first_timeout if first else args.case_timeout):
                out[backend] = measure(sets, call, backend, args.iters, nbytes)
        except timing.CaseTimeout as exc:
            out[backend] = harness.error_entry(exc)
            _GIVEN_UP[key] = f"an earlier point timed out ({exc})"
            if first and backend == "upstream":  # one JIT module serves every function
                _GIVEN_UP[backend] = f"upstream's first call timed out ({exc}): JIT build"
        except Exception as exc:  # noqa: BLE001 - a backend that cannot run is a finding
            out[backend] = harness.error_entry(exc)
        if args.device == "cuda":
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
    del sets
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return {"bytes": nbytes, "backends": out}


# ------------------------------------------------------------------------------ first call
def first_call_runs(args) -> list[str]:
    """The Triton cache as it is, and on a GPU (ours) an empty one without and with the kernel
    pack (what a fresh machine pays)."""
    cold = ["cold_triton_cache_no_pack", "cold_triton_cache"]
    return (cold if args.impl == "ours" and torch.cuda.is_available() else []) + ["as_is"]


def first_call(run: str, args) -> dict:
    """Import + first top_k_top_p_sampling_from_probs call in a fresh process (this file's
    ``--_first-call-child``); ``ms`` is that first call's time."""
    batch, vocab = (TINY["batch"], TINY["vocab"]) if args.shapes == "tiny" else (256, 128256)
    env = {} if run == "as_is" else {"TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="triton_")}
    if run == "cold_triton_cache_no_pack":
        env["FLASHINFER_KERNEL_PACK_DIR"] = "off"
    cmd = [sys.executable, os.path.abspath(__file__), "--_first-call-child", "--impl", args.impl,
           "--batch", str(batch), "--vocab", str(vocab), "--device", args.device]
    entry = {"batch": batch, "vocab": vocab, "function": "top_k_top_p_sampling_from_probs",
             "env": env}
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True,
                              timeout=args.first_timeout)
        entry["process_wall_s"] = time.perf_counter() - t
        if proc.returncode == 0:
            entry.update(json.loads(proc.stdout.strip().splitlines()[-1]))
            entry["ms"] = entry["first_call_s"] * 1e3
        else:
            entry["error"] = f"exit {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1][:300]}"
    except subprocess.TimeoutExpired:
        entry["error"] = f"no result after {args.first_timeout:.0f} s (killed)"
    if "TRITON_CACHE_DIR" in env:  # kernels compiled in the child leave their IR behind
        entry["compiled_in_process"] = len(list(Path(env["TRITON_CACHE_DIR"]).glob("*/*.ttir")))
    return entry


def first_call_child(argv) -> None:
    """In a fresh process: import flashinfer, call top_k_top_p_sampling_from_probs twice."""
    p = argparse.ArgumentParser()
    p.add_argument("--impl")
    p.add_argument("--batch", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--device")
    a, _ = p.parse_known_args(argv)
    import flashinfer  # noqa: PLC0415
    import flashinfer.sampling  # noqa: PLC0415
    t_import = time.perf_counter()
    probs = torch.softmax(torch.randn(a.batch, a.vocab, device=a.device) * 4.0, dim=-1)
    kw = {} if a.impl == "upstream" else {"backend": "auto"}

    def run():
        out = flashinfer.sampling.top_k_top_p_sampling_from_probs(probs, TOP_K, TOP_P, **kw)
        if a.device == "cuda":
            torch.cuda.synchronize()
        return out
    if a.device == "cuda":
        torch.cuda.synchronize()
    t1 = time.perf_counter()
    chosen = harness.chosen(run)
    t2 = time.perf_counter()
    run()
    t3 = time.perf_counter()
    print(json.dumps({"import_torch_s": _T_TORCH - _T0, "import_flashinfer_s": t_import - _T_TORCH,
                      "first_call_s": t2 - t1, "second_call_s": t3 - t2,
                      "import_plus_first_call_s": t_import - _T_TORCH + t2 - t1, "chosen": chosen}))


# ------------------------------------------------------------------------------ summary, plot
SORT = "torch_sort_inline"


def _us(entry: dict | None) -> float | None:
    return entry["ms"] * 1e3 if entry and "ms" in entry else None


def _fmt(x: float | None, spec: str = "10.1f") -> str:
    return format(x, spec) if x is not None else format("-", ">" + spec.split(".")[0])


def summary(runs) -> str:
    """A table per function that ran, a row per point: ours auto and its kernel, triton,
    torch, the sort baseline and upstream, with the speed-ups sort / auto (target >= 5x at
    256 x 128k for top_k_top_p) and upstream / auto (target >= 1.0x); first-call runs first."""
    table, order = harness.merged(runs)
    rows = {r["case"]: r for _, records in runs for r in records}
    lines = []
    for case in order:
        if "run" in rows[case]:
            e = next(iter(table[case].values()))
            lines.append(f"{case}: " + (f"import {e['import_flashinfer_s']:.2f} s + first call "
                                        f"{e['first_call_s']:.2f} s -> {e.get('chosen')}"
                                        if "error" not in e else e["error"]))
    functions = list(dict.fromkeys((rows[c]["function"], rows[c]["label"]) for c in order
                                   if "function" in rows[c]))
    for fn, label in functions:
        lines.append(f"\n{fn}{' [' + label + ']' if label else ''}  (us per call)")
        lines.append(f"{'batch':>6} {'vocab':>7} {'ours auto':>10} {'chosen':<18} {'triton':>10} "
                     f"{'torch':>10} {'sort inl.':>10} {'upstream':>10} {'sort/auto':>9} {'up/auto':>8}")
        for case in order:
            r = rows[case]
            if (r.get("function"), r.get("label")) != (fn, label):
                continue
            row = table[case]
            auto, sort = _us(row.get("auto")), _us(row.get(SORT) or row.get(f"upstream:{SORT}"))
            up = _us(row.get("upstream"))
            chosen = str((row.get("auto") or {}).get("chosen") or "-")
            lines.append(
                f"{r['batch']:>6} {r['vocab']:>7} {_fmt(auto)} {chosen[:18]:<18} "
                f"{_fmt(_us(row.get('triton')))} {_fmt(_us(row.get('torch')))} {_fmt(sort)} "
                f"{_fmt(up)} {_fmt(sort / auto if sort and auto else None, '9.2f')} "
                f"{_fmt(up / auto if up and auto else None, '8.2f')}")
    return "\n".join(lines)


def plot(runs):
    """Time per call against batch of the target function (top_k_top_p_sampling_from_probs,
    top_k_first), a panel per vocabulary, a line per implementation and backend."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    table, order = harness.merged(runs)
    rows = {r["case"]: r for _, records in runs for r in records}
    target = [c for c in order if (rows[c].get("function"), rows[c].get("label")) == TARGET]
    if not target:  # another function only: the generic bars
        return harness.bar_plot(runs)
    vocabs = sorted({rows[c]["vocab"] for c in target})
    fig, axes = plt.subplots(1, len(vocabs), figsize=(5 * len(vocabs), 4.2), squeeze=False)
    for ax, vocab in zip(axes[0], vocabs):
        points = sorted((c for c in target if rows[c]["vocab"] == vocab), key=lambda c: rows[c]["batch"])
        for label in dict.fromkeys(k for c in points for k in table[c]):
            xy = [(rows[c]["batch"], _us(table[c].get(label))) for c in points
                  if _us(table[c].get(label)) is not None]
            if xy:
                ax.plot(*zip(*xy), "--" if SORT in label or label.startswith("upstream") else "-",
                        marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set(xlabel="batch", ylabel="time per call (us)", title=f"vocab {vocab}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    axes[0][0].figure.text(0.01, 0.01, f"{TARGET[0]} ({TARGET[1]}, k={TOP_K}, p={TOP_P})", fontsize=8)
    fig.tight_layout()
    return fig


def main(argv=None, prog=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--_first-call-child" in argv:
        first_call_child(argv)
        return 0
    return harness.main(sys.modules[__name__], argv, prog)


if __name__ == "__main__":
    sys.exit(main())
