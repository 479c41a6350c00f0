"""GEMM benchmark (issue 5): bf16 and fp8 GEMMs at the layer shapes of Llama-3.1-70B and
DeepSeek-V3, every backend and ``auto``, beside the vendor kernel called directly.

    python benchmarks/gemm.py --out results.json            # H200: the grid below
    python benchmarks/gemm.py --quick --out results.json    # the issue's target points only
    python benchmarks/gemm.py --smoke --out /tmp/smoke.json # CPU: tiny shapes, reference/torch

Shapes: M in {1, 16, 128, 1024, 8192} x the (N, K) of each layer below, plus the square
8192^3 points of the targets (fp8 >= 1,300 TFLOP/s, every point >= 0.97x the best single vendor
kernel), and ``grouped_mm_bf16`` with 8 / 64 / 256 experts of DeepSeek-V3's expert gate_up
shape (N 2048, K 7168), 16 or 128 tokens each (target: grouped bf16 >= 600 TFLOP/s). Functions: ``mm_bf16`` (a [M, K] @ w.T, w [N, K] bf16), ``mm_fp8`` (per-tensor scales),
``gemm_fp8_nt_groupwise`` with DeepSeek-V3's recipe (1x128 activations, 128x128 weights),
``bmm_fp8`` (per-tensor scales) at DeepSeek-V3's batched MLA shapes (one batch entry per head:
the absorbed W_UK and W_UV products) for M in {1, 16, 128, 1024}.
``vendor`` is the kernel the torch backend wraps, called directly (``torch.mm`` /
``torch._scaled_mm``): the best single vendor kernel the target compares against.
Timing: CUDA-graph replay of calls over input copies rotated past the L2 (bench_timing.py),
eager time where a path cannot be captured; TFLOP/s = 2 M N K / time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time

import torch

from bench_timing import capture, cuda_events, interleaved_graph_ms

import flashinfer
from flashinfer import quantization as Q

LAYERS = {  # name: (N, K)
    "llama70b.qkv": (10240, 8192), "llama70b.o": (8192, 8192),
    "llama70b.gate_up": (57344, 8192), "llama70b.down": (8192, 28672),
    "dsv3.q_a": (1536, 7168), "dsv3.kv_a": (576, 7168), "dsv3.o": (7168, 16384),
    "dsv3.gate_up": (36864, 7168), "dsv3.down": (7168, 18432),
}
MS = (1, 16, 128, 1024, 8192)
SQUARE = {"square.8192": (8192, 8192)}
FUNCTIONS = ("mm_bf16", "mm_fp8", "gemm_fp8_nt_groupwise")
#: bmm_fp8: name -> (batch, N, K); M in BATCHED_MS
BATCHED = {"dsv3.mla_uk": (128, 512, 128), "dsv3.mla_uv": (128, 128, 512)}
BATCHED_MS = (1, 16, 128, 1024)
#: grouped bf16 GEMM (``grouped_mm_bf16``): experts x (N, K) of one expert, tokens per expert
#: (1,024 rows per expert: prefill-sized, where the grouped bf16 target of 600 TFLOP/s applies)
GROUPED = [(e, 2048, 7168, m) for e in (8, 64, 256) for m in (16, 128, 1024)]
BACKENDS = ("auto", "torch", "triton", "cudnn", "cutlass", "vendor")
VENDOR_BACKENDS = ("torch", "cudnn", "cutlass", "vendor")
#: functions the cudnn matmul graphs serve (mm_fp8 runs op bmm_fp8)
CUDNN_FUNCTIONS = ("mm_bf16", "mm_fp8", "bmm_fp8")
#: functions the CUTLASS adapter serves (backends/cutlass/)
CUTLASS_FUNCTIONS = ("mm_bf16", "mm_fp8", "bmm_fp8")
#: functions our Triton kernels serve (the others would only record "no such kernel");
#: ``grouped_mm_bf16`` runs op segment_gemm (triton opt-in: timed only when asked for)
TRITON_FUNCTIONS = ("mm_fp8", "bmm_fp8", "gemm_fp8_nt_groupwise", "grouped_mm_bf16")
L2_BYTES = 60 * 2**20


def _inputs(fn: str, m: int, n: int, k: int, device: str, experts: int = 0):
    """One set of call arguments: (a, b, extra) for ``fn`` (``grouped``: ``m`` tokens per expert,
    equal loads, offsets in ``extra``; ``bmm_fp8``: ``experts`` is the batch)."""
    if fn == "bmm_fp8":
        aq, a_s = Q.quantize_fp8_per_tensor(torch.randn(experts, m, k, device=device))
        wq, w_s = Q.quantize_fp8_per_tensor(torch.randn(experts, n, k, device=device) / k ** 0.5)
        return aq, wq.transpose(1, 2), (a_s.reshape(1), w_s.reshape(1))  # B column-major
    if fn == "grouped_mm_bf16":
        a = torch.randn(experts * m, k, device=device).bfloat16()
        w = (torch.randn(experts, n, k, device=device) / k ** 0.5).bfloat16()
        offsets = torch.arange(0, (experts + 1) * m, m, dtype=torch.int32, device=device)
        return a, w, offsets
    a = torch.randn(m, k, device=device)
    w = torch.randn(n, k, device=device) / k ** 0.5
    if fn == "mm_bf16":
        return a.bfloat16(), w.bfloat16().t(), None  # b [k, n] column-major, as upstream
    if fn == "mm_fp8":
        aq, a_s = Q.quantize_fp8_per_tensor(a)
        wq, w_s = Q.quantize_fp8_per_tensor(w)
        return aq, wq, (a_s * w_s).reshape(1)
    aq, a_s = Q.quantize_fp8_blockwise(a, (1, 128))
    wq, w_s = Q.quantize_fp8_blockwise(w, (128, 128))
    return aq, wq, (a_s, w_s)


def _call(fn: str, args, backend: str):
    a, b, extra = args
    if fn == "grouped_mm_bf16":
        if backend == "vendor":  # torch's CUTLASS grouped GEMM: offsets are the segment ends
            return torch._grouped_mm(a, b.transpose(1, 2), offs=extra[1:])
        return flashinfer.grouped_mm_bf16(a, b, extra, backend=backend)
    if fn == "bmm_fp8":
        a_s, w_s = extra
        if backend == "vendor":  # cuBLASLt has no batched fp8 GEMM: one call per batch entry
            return [torch._scaled_mm(a[i], b[i], a_s, w_s, out_dtype=torch.bfloat16)
                    for i in range(a.shape[0])]
        return flashinfer.bmm_fp8(a, b, a_s, w_s, torch.bfloat16, backend=backend)
    if backend == "vendor":
        if fn == "mm_bf16":
            return torch.mm(a, b)
        if fn == "mm_fp8":
            one = torch.ones((), device=a.device)
            return torch._scaled_mm(a, b.t(), extra, one, out_dtype=torch.bfloat16)
        a_s, w_s = extra
        return torch._scaled_mm(a, b.t(), a_s.t().contiguous().t(), w_s.contiguous().t(),
                                out_dtype=torch.bfloat16)
    if fn == "mm_bf16":
        return flashinfer.mm_bf16(a, b, backend=backend)
    if fn == "mm_fp8":
        return flashinfer.mm_fp8(a, b, extra, backend=backend)
    a_s, w_s = extra
    return flashinfer.gemm.gemm_fp8_nt_groupwise(a, b, a_s, w_s, "K", 1, (1, 128, 128),
                                                 backend=backend)


def _eager_ms(sets, fn, backend, iters) -> float:
    times = []
    for _ in range(iters):
        if sets[0][0].is_cuda:
            start, end = cuda_events()
            start.record()
            for args in sets:
                _call(fn, args, backend)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / len(sets))
        else:
            t = time.perf_counter()
            for args in sets:
                _call(fn, args, backend)
            times.append((time.perf_counter() - t) * 1e3 / len(sets))
    return statistics.median(times)


def _chosen(fn, args) -> str | None:
    with flashinfer.record_decisions() as log:
        _call(fn, args, "auto")
    return "+".join(sorted({d.name for d in log})) or None


#: points under this many flops (a few microseconds) are timed over GRAPH_PASSES passes of their
#: input copies per graph, so that one replay spans tens of microseconds: a CUDA event pair
#: resolves about 0.5 us, and the 1-2 us a replay pays for the switch from another backend's
#: graph is spread over many calls
SMALL_POINT_FLOPS = 2e9
GRAPH_PASSES = 8


def bench_point(fn, m, n, k, backends, iters, device, experts: int = 0) -> dict:
    """One grid point: every backend's first call (plans, compiles, errors), eager time, and
    the GPU time of CUDA graphs of all backends replayed in turn (interleaved_graph_ms)."""
    one = _inputs(fn, m, n, k, device, experts)
    nbytes = sum(t.numel() * t.element_size() for t in one[:2])
    copies = max(1, min(8, -(-2 * L2_BYTES // max(nbytes, 1)))) if device == "cuda" else 1
    sets = [one] + [_inputs(fn, m, n, k, device, experts) for _ in range(copies - 1)]
    point = {"function": fn, "m": m, "n": n, "k": k,
             ("batch" if fn == "bmm_fp8" else "experts"): experts, "backends": {}}
    flops = 2 * m * n * k * max(experts, 1)
    calls = sets * (GRAPH_PASSES if flops < SMALL_POINT_FLOPS else 1)
    graphs = {}
    for backend in backends:
        if (backend == "triton" and fn not in TRITON_FUNCTIONS
                or backend == "cudnn" and fn not in CUDNN_FUNCTIONS
                or backend == "cutlass" and fn not in CUTLASS_FUNCTIONS):
            continue
        try:
            _call(fn, one, backend)
            entry = {"eager_ms": _eager_ms(sets, fn, backend, iters)}
            if device == "cuda":
                graphs[backend] = capture(calls, lambda a, b: _call(fn, a, b), backend)
            if backend == "auto":
                entry["chosen"] = _chosen(fn, one)
        except Exception as exc:  # noqa: BLE001 - a backend that cannot run a point is a finding
            entry = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        point["backends"][backend] = entry
    captured = {b: g for b, g in graphs.items() if g is not None}
    graph_times = interleaved_graph_ms(captured, len(calls), iters) if captured else {}
    for backend, entry in point["backends"].items():
        if "eager_ms" in entry:
            entry["graph_ms"] = graph_times.get(backend)
            entry["ms"] = entry["graph_ms"] if entry["graph_ms"] is not None else entry["eager_ms"]
            entry["tflops"] = flops / entry["ms"] / 1e9
    return point

def merge_repeats(points: list) -> dict:
    """One point from ``bench_point``'s repeats (fresh inputs and graphs each): every time is the
    median over the repeats, which are kept under ``ms_repeats``. A backend-to-backend ratio of a
    few-microsecond point moved by up to 10 % between processes on the H200 (the bmm_fp8 W_UV
    point at M = 128: Triton 0.89x to 1.13x cuDNN in the runs of 2026-11-30), more than within one
    set of graphs."""
    merged = points[0]
    for backend, entry in merged["backends"].items():
        if "ms" not in entry:
            continue
        runs = [p["backends"][backend] for p in points if "ms" in p["backends"].get(backend, {})]
        flops = entry["tflops"] * entry["ms"] * 1e9
        entry["ms_repeats"] = [r["ms"] for r in runs]
        for key in ("eager_ms", "graph_ms", "ms"):
            if entry.get(key) is not None:
                entry[key] = statistics.median(r[key] for r in runs)
        entry["tflops"] = flops / entry["ms"] / 1e9
    return merged


def best_vendor(point: dict) -> tuple[str, float] | None:
    """The fastest single vendor kernel of a point (cuBLAS through torch or called directly,
    cuDNN, CUTLASS): ``(backend, ms)``, or ``None`` when none ran."""
    times = [(e["ms"], b) for b, e in point["backends"].items() if b in VENDOR_BACKENDS and "ms" in e]
    return (min(times)[1], min(times)[0]) if times else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="target points only")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes")
    ap.add_argument("--only", default="", help="substring filter on function names")
    ap.add_argument("--repeats", type=int, default=1,
                    help="measure each point this many times (fresh inputs and graphs), report "
                         "the median")
    ap.add_argument("--backends", default="",
                    help="comma-separated subset of the backends (default: all)")
    args = ap.parse_args()
    device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        grid = [(fn, m, 256, 256) for fn in ("mm_bf16",) for m in (1, 16)]
        backends = ("auto", "reference", "torch")
    else:
        layers = dict(SQUARE) if args.quick else {**LAYERS, **SQUARE}
        ms = (8192,) if args.quick else MS
        grid = [(fn, m, n, k) for fn in FUNCTIONS for (n, k) in layers.values() for m in ms]
        if args.quick:
            grid += [(fn, m, *LAYERS["dsv3.gate_up"]) for fn in FUNCTIONS for m in (16, 1024)]
        backends = BACKENDS
    if args.backends:
        unknown = set(args.backends.split(",")) - set(backends)
        if unknown:
            ap.error(f"--backends: unknown {sorted(unknown)}; choose from {list(backends)}")
        backends = tuple(b for b in backends if b in args.backends.split(","))
    grid = [g + (0,) for g in grid]
    if not args.smoke:
        grid += [("bmm_fp8", m, n, k, batch) for batch, n, k in BATCHED.values()
                 for m in BATCHED_MS]
    if not args.smoke:
        grouped = [g for g in GROUPED if g[0] == 256] if args.quick else GROUPED
        grid += [("grouped_mm_bf16", m, n, k, e) for e, n, k, m in grouped]
    grid = [g for g in grid if args.only in g[0]]
    doc = {"command": "python " + " ".join(sys.argv),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
           "torch": torch.__version__, "layers": LAYERS,
           "timing": "median of --iters; graph_ms = CUDA-graph replay over copies rotated past "
                     "the L2, the graphs of all backends of a point replayed in turn (those over 4x "
                     "the fastest in rounds of their own); eager_ms = "
                     "back-to-back calls; ms = graph_ms when capturable; with --repeats, medians over "
                     "repeats (ms_repeats)",
           "results": []}
    for i, (fn, m, n, k, experts) in enumerate(grid):
        point = merge_repeats([bench_point(fn, m, n, k, backends, args.iters, device, experts)
                               for _ in range(args.repeats)])
        doc["results"].append(point)
        cells = " ".join(f"{b}:{e['tflops']:.0f}" if "tflops" in e else f"{b}:ERR"
                         for b, e in point["backends"].items())
        groups = f" {'B' if fn == 'bmm_fp8' else 'E'}={experts}" if experts else ""
        print(f"[{i + 1}/{len(grid)}] {fn:22s} M={m:<5d} N={n:<6d} K={k:<6d}{groups} TFLOP/s {cells}",
              flush=True)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    print("\nauto / best single vendor kernel (target >= 0.97):")
    for point in doc["results"]:
        auto, best = point["backends"].get("auto", {}), best_vendor(point)
        if "ms" in auto and best:
            print(f"  {point['function']:22s} M={point['m']:<5d} N={point['n']:<6d} "
                  f"K={point['k']:<6d} {best[1] / auto['ms']:.2f} (auto: {auto.get('chosen')}; "
                  f"best vendor: {best[0]})")


if __name__ == "__main__":
    main()
