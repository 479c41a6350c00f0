"""Sampling benchmark: every sampling function x backend over a batch x vocabulary grid.

    PYTHONPATH=$PWD python benchmarks/sampling.py --out sampling.json      # this package (repo root)
    PYTHONPATH=$PWD python benchmarks/sampling.py --quick --out quick.json # a handful of points
    PYTHONPATH=/tmp/anchor:/tmp/site python benchmarks/sampling.py --impl upstream --out up.json
    PYTHONPATH=$PWD python benchmarks/sampling.py --first-call --out first.json  # fresh process
    PYTHONPATH=$PWD python benchmarks/sampling.py --smoke --out /tmp/smoke.json  # CPU, tiny
    python benchmarks/sampling.py --list --out x.json                      # the points, run nothing

The runner calls ``flashinfer.sampling.<function>`` by its upstream name, so the same file
measures upstream FlashInfer 0.7.2 when that package is first on PYTHONPATH (``--impl upstream``,
a separate process: both packages are named ``flashinfer``; upstream has no ``backend=``).
``torch_sort_inline`` is a sort / cumsum / mask / renormalise / ``torch.multinomial`` baseline
written in this file (the path serving engines use without a fused kernel), timed in both modes.

Inputs: logits = randn * ``--scale`` (4: peaked like a language model; ``--flat``: scale 1),
probabilities = softmax(logits), fp32, fixed seed, rotated across copies past the 60 MB L2.
Timing (as benchmarks/bench_foundation.py): ``gpu_us`` replays the rotated calls captured in a
CUDA graph, ``eager_us`` times back-to-back eager calls between CUDA events, medians of
``--iters``; ``us`` is ``gpu_us`` when the call can be captured, else ``eager_us``.
``tb_per_s`` = bytes of the input read once / ``us``. For ``auto`` the kernel(s) chosen
(``flashinfer.record_decisions``) are recorded. Every (point, backend) runs under a deadline
(``--case-timeout``; the first call of a function gets ``--first-timeout``, upstream JIT builds
its module there) and any failure is recorded as an error string; the run goes on. The JSON is
rewritten after every point, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()  # --first-call child: import time counts from here

import argparse  # noqa: E402
import contextlib  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from bench_timing import cuda_events, graph_ms  # noqa: E402

_T_TORCH = time.perf_counter()

# ---------------------------------------------------------------------------- shape table
BATCHES = (1, 16, 64, 256, 512)
VOCABS = (32000, 128256, 256000)  # 32k, 128k (Llama 3), 256k (Gemma)
CHAIN_BATCHES = (1, 16, 64)
N_DRAFT = 4
TOP_K, TOP_P, MIN_P = 50, 0.9, 0.1
SEED, OFFSET = 1234, 0
L2_BYTES = 60 * 2**20
CEIL_BW = 4.1e12  # device copy measured on the H200 (context for tb_per_s)

# (function, label, input kind, keyword arguments, takes seed/offset, sort baseline (k, p, joint))
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
TARGET = ("top_k_top_p_sampling_from_probs", "top_k_first")

OURS_BACKENDS = ("auto", "triton", "torch")
REFERENCE_MAX = (16, 32000)  # reference backend only up to this (batch, vocab) unless --reference
QUICK = [("top_k_top_p_sampling_from_probs", b, 128256) for b in (1, 64, 256, 512)] + [
    ("top_k_top_p_sampling_from_probs", 256, 32000), ("top_k_top_p_sampling_from_probs", 256, 256000),
    ("top_p_sampling_from_probs", 256, 128256), ("sampling_from_probs", 256, 128256),
    ("top_k_mask_logits", 256, 128256), ("softmax", 256, 128256),
    ("chain_speculative_sampling", 16, 128256)]
SMOKE = {"batch": 2, "vocab": 1000, "functions": ("top_k_top_p_sampling_from_probs", "top_p_renorm_probs",
                                                   "softmax", "chain_speculative_sampling")}


# ---------------------------------------------------------------------------- inputs
def _copies(nbytes: int, device: str) -> int:
    return 2 if device == "cpu" else max(2, min(64, math.ceil(3 * L2_BYTES / max(nbytes, 1))))


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
    return sum(t.numel() * t.element_size() for t in sets[0] if t.is_floating_point())


# ---------------------------------------------------------------------------- sort baseline
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


# ---------------------------------------------------------------------------- calls
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


def backends_for(impl: str, sort_cfg, batch: int, vocab: int, args, name: str = "") -> list[str]:
    if args.backends:
        names = args.backends.split(",")
    elif args.smoke:
        names = ["auto", "reference", "torch"]
    elif impl == "upstream":
        names = ["upstream"]
    else:
        names = list(OURS_BACKENDS)
        if sort_cfg is not None and name.endswith("_from_probs") and name != "top_p_sampling_from_probs":
            names.append("triton:two_pass")  # the two-pass top-k variant (op sampling_from_probs)
        if name == "top_k_top_p_sampling_from_logits":
            names.append("triton:two_pass")  # the two-pass sampler reading the logits
        if name == "top_p_sampling_from_probs":
            names.append("triton:nucleus")  # top-p alone by lean rejection rounds
        if name in ("top_k_renorm_probs", "top_k_mask_logits"):
            names.append("triton:two_pass")  # tau from the lanes' candidates
        if name == "sampling_from_logits":
            names.append("triton:one_pass")  # one read, one exponential per element
        if name == "softmax":
            names.append("triton:streaming")  # one exp per element, split rows at small batch
        if name == "top_p_renorm_probs":
            names.append("triton:bracket")  # pivot passes narrow a bracket, then a sort
        if args.reference or (batch <= REFERENCE_MAX[0] and vocab <= REFERENCE_MAX[1]):
            names.append("reference")
    if sort_cfg is not None and "torch_sort_inline" not in names:
        names.append("torch_sort_inline")
    return names


# ---------------------------------------------------------------------------- timing
class CaseTimeout(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: float):
    """Raise CaseTimeout in the main thread after ``seconds`` (Python-level; a hung kernel is not
    interrupted until it returns to the interpreter)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise CaseTimeout(f"exceeded {seconds:.0f} s")
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(max(1, int(math.ceil(seconds))))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def eager_us(sets, call, backend, iters) -> float:
    times = []
    for _ in range(iters):
        if sets[0][0].is_cuda:
            start, end = cuda_events()
            start.record()
            for a in sets:
                call(a, backend)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / len(sets))
        else:
            t = time.perf_counter()
            for a in sets:
                call(a, backend)
            times.append((time.perf_counter() - t) * 1e6 / len(sets))
    return statistics.median(times)


def graph_us(sets, call, backend, iters) -> float | None:
    """Per-call GPU time (us) from replaying the rotated calls captured in one CUDA graph; None
    when the path cannot be captured (host synchronisation, host-side RNG state reads, ...)."""
    ms = graph_ms(sets, call, backend, iters, passthrough=(CaseTimeout,))
    return None if ms is None else ms * 1e3


def chosen_kernels(flashinfer_mod, sets, call, backend) -> str | None:
    record = getattr(flashinfer_mod, "record_decisions", None)
    if record is None:  # upstream
        call(sets[0], backend)
        return None
    with record() as log:
        call(sets[0], backend)
    names = list(dict.fromkeys(d.name for d in log))
    return "+".join(names) if names else None


def measure(flashinfer_mod, sets, call, backend, iters, nbytes) -> dict:
    t = time.perf_counter()
    chosen = chosen_kernels(flashinfer_mod, sets, call, backend)  # first call: builds, JIT, caches
    cuda = sets[0][0].is_cuda
    if cuda:
        torch.cuda.synchronize()
    first_s = time.perf_counter() - t
    for i in range(2):
        call(sets[i % len(sets)], backend)
    gpu = graph_us(sets, call, backend, iters) if cuda else None
    eager = eager_us(sets, call, backend, iters)
    us = gpu if gpu is not None else eager
    entry = {"us": us, "gpu_us": gpu, "eager_us": eager, "tb_per_s": nbytes / us / 1e6,
             "fraction_of_copy_bw": nbytes / us * 1e6 / CEIL_BW, "first_call_s": first_s}
    if backend == "auto":
        entry["chosen"] = chosen
    return entry


def _error(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines() or [""]
    return f"{type(exc).__name__}: {lines[0][:240]}"


# ---------------------------------------------------------------------------- first call
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
    record = getattr(flashinfer, "record_decisions", None)
    with (record() if record else contextlib.nullcontext([])) as log:
        run()
    t2 = time.perf_counter()
    run()
    t3 = time.perf_counter()
    print(json.dumps({"import_torch_s": _T_TORCH - _T0, "import_flashinfer_s": t_import - _T_TORCH,
                      "first_call_s": t2 - t1, "second_call_s": t3 - t2,
                      "import_plus_first_call_s": t_import - _T_TORCH + t2 - t1,
                      "chosen": "+".join(dict.fromkeys(d.name for d in log)) or None}))


def first_call(args, device: str) -> list[dict]:
    batch, vocab = (SMOKE["batch"], SMOKE["vocab"]) if args.smoke else (256, 128256)
    runs = [("as_is", {})]
    if args.impl == "ours" and device == "cuda":
        # empty Triton cache: what a fresh machine pays, without and with the kernel pack
        runs[:0] = [("cold_triton_cache_no_pack", {"TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="triton_"),
                                                   "FLASHINFER_KERNEL_PACK_DIR": "off"}),
                    ("cold_triton_cache", {"TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="triton_")})]
    out = []
    for label, env in runs:
        cmd = [sys.executable, os.path.abspath(__file__), "--_first-call-child", "--impl", args.impl,
               "--batch", str(batch), "--vocab", str(vocab), "--device", device]
        entry = {"impl": args.impl, "run": label, "batch": batch, "vocab": vocab,
                 "function": "top_k_top_p_sampling_from_probs", "env": env}
        t = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True,
                                  timeout=args.first_timeout)
            entry["process_wall_s"] = time.perf_counter() - t
            if proc.returncode == 0:
                entry.update(json.loads(proc.stdout.strip().splitlines()[-1]))
            else:
                entry["error"] = f"exit {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1][:300]}"
        except subprocess.TimeoutExpired:
            entry["error"] = f"no result after {args.first_timeout:.0f} s (killed)"
        except Exception as exc:  # noqa: BLE001
            entry["error"] = _error(exc)
        if "TRITON_CACHE_DIR" in env:  # kernels compiled in the child leave their IR behind
            entry["compiled_in_process"] = len(list(Path(env["TRITON_CACHE_DIR"]).glob("*/*.ttir")))
        print(f"first call [{args.impl} {label}] " + (
            f"import {entry['import_flashinfer_s']:.2f} s + first call {entry['first_call_s']:.2f} s "
            f"(second {entry['second_call_s'] * 1e3:.2f} ms) -> {entry.get('chosen')}"
            if "error" not in entry else entry["error"]), flush=True)
        out.append(entry)
    return out


# ---------------------------------------------------------------------------- grid
def points(args) -> list[tuple]:
    rows = []
    for f in FUNCTIONS:
        name = f[0]
        if args.only and args.only not in name:
            continue
        if args.skip and args.skip in name:
            continue
        if args.smoke:
            if name in SMOKE["functions"] and f[1] != "joint":
                rows.append((f, SMOKE["batch"], SMOKE["vocab"]))
            continue
        if args.quick:
            rows += [(f, b, v) for n, b, v in QUICK if n == name]
            continue
        batches = CHAIN_BATCHES if f[2] == "chain" else BATCHES
        rows += [(f, b, v) for v in VOCABS for b in batches]
    return rows


class Progress:
    def __init__(self, total: int):
        self.total, self.done, self.t0 = total, 0, time.perf_counter()

    def line(self, text: str) -> None:
        self.done += 1
        el = time.perf_counter() - self.t0
        eta = el / self.done * (self.total - self.done)
        width = 24
        bar = "#" * (width * self.done // self.total) + "." * (width - width * self.done // self.total)
        print(f"[{bar}] {self.done:4d}/{self.total} {el:6.0f}s eta {eta:5.0f}s  {text}", flush=True)


def main() -> None:
    if "--_first-call-child" in sys.argv:
        first_call_child(sys.argv[1:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--impl", choices=("ours", "upstream"), default="ours")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="a handful of points incl. 256 x 128k top_k_top_p")
    ap.add_argument("--smoke", action="store_true", help="CPU, batch 2, vocab 1000, reference/torch")
    ap.add_argument("--first-call", action="store_true", help="only the fresh-process first-call timing")
    ap.add_argument("--list", action="store_true", help="print the points and backends, run nothing")
    ap.add_argument("--reference", action="store_true", help="time the reference backend at every point")
    ap.add_argument("--backends", default="", help="comma list overriding the backends timed")
    ap.add_argument("--only", default="", help="substring filter on function names")
    ap.add_argument("--skip", default="", help="leave out functions whose name contains this")
    ap.add_argument("--scale", type=float, default=4.0, help="logits = randn * scale")
    ap.add_argument("--flat", action="store_true", help="flatter distributions (scale 1)")
    ap.add_argument("--case-timeout", type=float, default=120.0)
    ap.add_argument("--first-timeout", type=float, default=540.0,
                    help="deadline of a function's first call (upstream JIT) and of --first-call")
    ap.add_argument("--budget-s", type=float, default=0.0, help="stop starting new points after this")
    args = ap.parse_args()
    scale = 1.0 if args.flat else args.scale
    device = "cpu" if args.smoke or not torch.cuda.is_available() else "cuda"
    t_start = time.perf_counter()
    plan = [(f, b, v, backends_for(args.impl, f[5], b, v, args, f[0])) for f, b, v in points(args)]
    if args.list:
        for (fn_name, label, *_), b, v, names in plan:
            print(f"{fn_name}{'[' + label + ']' if label else ''} B={b} V={v}: {', '.join(names)}")
        print(f"{len(plan)} points, {sum(len(p[3]) for p in plan)} timings")
        return
    try:
        import flashinfer  # noqa: PLC0415 - after argument parsing (the first-call child times it)
        import flashinfer.sampling as sampling  # noqa: PLC0415
    except Exception as exc:  # noqa: BLE001 - leave a JSON that says why
        with open(args.out, "w") as f:
            json.dump({"command": "python " + " ".join(sys.argv), "impl": args.impl,
                       "error": f"import flashinfer.sampling: {_error(exc)}", "results": []}, f)
        raise

    results: list = []
    doc = {"command": "python " + " ".join(sys.argv), "impl": args.impl,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
           "versions": {"python": platform.python_version(), "torch": torch.__version__,
                        "cuda": torch.version.cuda, "flashinfer": getattr(flashinfer, "__version__", "?"),
                        "flashinfer_path": os.path.dirname(flashinfer.__file__)},
           "inputs": {"dtype": "float32", "logit_scale": scale, "seed": SEED, "top_k": TOP_K,
                      "top_p": TOP_P, "min_p": MIN_P, "num_draft": N_DRAFT},
           "timing": (f"median of {args.iters}; gpu_us = CUDA-graph replay of calls rotated past L2, "
                      f"eager_us = back-to-back eager calls (CUDA events; perf_counter on CPU); "
                      f"us = gpu_us if capturable else eager_us; tb_per_s = input bytes read once / us"),
           "results": results, "first_call": []}

    def save():
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)

    if args.first_call:
        doc["first_call"] = first_call(args, device)
        save()
        return

    progress = Progress(sum(len(p[3]) for p in plan))
    first_seen: set = set()
    given_up: dict = {}  # (function, label, backend) -> why (a timeout skips its later points)
    for (fn_name, label, kind, kwargs, seeded, sort_cfg), batch, vocab, names in plan:
        name = f"{fn_name}{'[' + label + ']' if label else ''} B={batch} V={vocab}"
        point = {"case": name, "function": fn_name, "label": label, "batch": batch, "vocab": vocab,
                 "num_draft": N_DRAFT if kind == "chain" else None, "backends": {}}
        results.append(point)
        if args.budget_s and time.perf_counter() - t_start > args.budget_s:
            point["skipped"] = "budget exhausted"
            for _ in names:
                progress.line(f"{name:<58} skipped (budget)")
            continue
        sets = None
        try:
            probe = make_inputs(kind, batch, vocab, scale, device, 1)
            nbytes = input_bytes(probe)
            sets = probe + make_inputs(kind, batch, vocab, scale, device, _copies(nbytes, device) - 1,
                                       seed=SEED + 1)
            point["bytes"] = nbytes
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory
            point["error"] = _error(exc)
        call = make_call(sampling, fn_name, kind, kwargs, seeded, sort_cfg)
        for backend in names:
            key = (fn_name, label, backend)
            if sets is None:
                entry = {"error": point["error"]}
            elif key in given_up or backend in given_up:
                entry = {"skipped": given_up.get(key) or given_up[backend]}
            else:
                first = (fn_name, backend) not in first_seen
                first_seen.add((fn_name, backend))
                limit = args.first_timeout if first else args.case_timeout
                try:
                    with deadline(limit):
                        entry = measure(flashinfer, sets, call, backend, args.iters, nbytes)
                except CaseTimeout as exc:
                    entry = {"error": _error(exc)}
                    given_up[key] = f"an earlier point timed out ({exc})"
                    if first and backend == "upstream":  # one JIT module serves every function
                        given_up[backend] = f"upstream's first call timed out ({exc}): JIT build"
                except Exception as exc:  # noqa: BLE001 - a backend that cannot run is a finding
                    entry = {"error": _error(exc)}
                if device == "cuda":
                    with contextlib.suppress(Exception):
                        torch.cuda.synchronize()
            point["backends"][backend] = entry
            progress.line(f"{name:<58} {backend:<18} " + (
                f"{entry['us']:10.2f} us {entry['tb_per_s']:6.3f} TB/s"
                + (" (eager)" if entry["gpu_us"] is None and device == "cuda" else "")
                + (f" -> {entry['chosen']}" if entry.get("chosen") else "")
                if "us" in entry else entry.get("error") or entry.get("skipped")))
        del sets
        if device == "cuda":
            torch.cuda.empty_cache()
        save()
    save()
    summary(results)


def summary(results: list) -> None:
    rows = [p for p in results if (p["function"], p["label"]) == TARGET]
    if not rows:
        return
    print(f"\n{TARGET[0]} [{TARGET[1]}]: us per call")
    keys = list(dict.fromkeys(k for p in rows for k in p["backends"]))
    print(f"{'batch':>6} {'vocab':>7} " + " ".join(f"{k:>18}" for k in keys))
    for p in rows:
        cells = [p["backends"][k].get("us") if k in p["backends"] else None for k in keys]
        print(f"{p['batch']:>6} {p['vocab']:>7} "
              + " ".join(f"{c:18.2f}" if c is not None else f"{'-':>18}" for c in cells))


if __name__ == "__main__":
    main()
