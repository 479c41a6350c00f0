"""GEMM benchmark: bf16 and fp8 GEMMs at the layer shapes of Llama-3.1-70B and DeepSeek-V3,
every backend and ``auto``, beside the vendor kernel called directly.

    python benchmarks/gemm.py                          # GPU: the grid below
    flashinfer bench gemm --shapes quick               # the issue's target points
    python benchmarks/gemm.py --only bmm_fp8 --repeats 3

Shapes: M in {1, 16, 128, 1024, 8192} x the (N, K) of each layer below, plus the square 8192^3
points of the targets (fp8 >= 1,300 TFLOP/s, every point >= 0.97x the best single vendor kernel),
and ``grouped_mm_bf16`` with 8 / 64 / 256 experts of DeepSeek-V3's expert gate_up shape (N 2048,
K 7168), 16, 128 or 1,024 tokens each (target: grouped bf16 >= 600 TFLOP/s). Functions:
``mm_bf16`` (a [M, K] @ w.T, w [N, K] bf16), ``mm_fp8`` (per-tensor scales),
``gemm_fp8_nt_groupwise`` with DeepSeek-V3's recipe (1x128 activations, 128x128 weights),
``bmm_fp8`` (per-tensor scales) at DeepSeek-V3's batched MLA shapes (one batch entry per head:
the absorbed W_UK and W_UV products) for M in {1, 16, 128, 1024}. ``vendor`` is the kernel the
torch backend wraps, called directly (``torch.mm`` / ``torch._scaled_mm`` /
``torch._grouped_mm``): the best single vendor kernel the target compares against. Timing:
CUDA-graph replay of calls over input copies rotated past the L2, the graphs of all backends of
a point replayed in turn (``timing.interleaved_graph_ms``), eager time where a path cannot be
captured; TFLOP/s = 2 M N K (x groups) / time.
"""

from __future__ import annotations

import statistics
import sys

import torch

import harness
import timing

import flashinfer
from flashinfer import quantization as Q

FAMILY = "gemm"
TIMING = ("median of the iterations; graph_ms = CUDA-graph replay over copies rotated past the "
          "L2, the graphs of all backends of a point replayed in turn (those over 4x the fastest "
          "in rounds of their own); eager_ms = back-to-back calls; ms = graph_ms when capturable; "
          "with --repeats, medians over the repeats (ms_repeats)")

# ------------------------------------------------------------------------------ shape table
LAYERS = {  # name: (N, K)
    "llama70b.qkv": (10240, 8192), "llama70b.o": (8192, 8192),
    "llama70b.gate_up": (57344, 8192), "llama70b.down": (8192, 28672),
    "dsv3.q_a": (1536, 7168), "dsv3.kv_a": (576, 7168), "dsv3.o": (7168, 16384),
    "dsv3.gate_up": (36864, 7168), "dsv3.down": (7168, 18432),
}
MS = (1, 16, 128, 1024, 8192)
SQUARE = (8192, 8192)
FUNCTIONS = ("mm_bf16", "mm_fp8", "gemm_fp8_nt_groupwise")
#: bmm_fp8: name -> (batch, N, K); M in BATCHED_MS
BATCHED = {"dsv3.mla_uk": (128, 512, 128), "dsv3.mla_uv": (128, 128, 512)}
BATCHED_MS = (1, 16, 128, 1024)
#: grouped bf16 GEMM (``grouped_mm_bf16``): experts x (N, K) of one expert, tokens per expert
#: (1,024 rows per expert: prefill-sized, where the grouped bf16 target of 600 TFLOP/s applies)
GROUPED = [(e, 2048, 7168, m) for e in (8, 64, 256) for m in (16, 128, 1024)]
#: CPU: every function once at a tiny shape: (function, M, N, K, groups)
TINY = [("mm_bf16", 1, 256, 256, 0), ("mm_bf16", 16, 256, 256, 0), ("mm_fp8", 16, 256, 256, 0),
        ("gemm_fp8_nt_groupwise", 16, 256, 256, 0), ("bmm_fp8", 16, 128, 128, 2),
        ("grouped_mm_bf16", 4, 128, 128, 2)]

BACKENDS = ("auto", "torch", "triton", "cudnn", "cutlass", "vendor")
VENDOR_BACKENDS = ("torch", "cudnn", "cutlass", "vendor")
#: the functions each backend serves (the others would only record "no such kernel"):
#: cudnn's matmul graphs and CUTLASS (mm_fp8 runs op bmm_fp8); our Triton kernels
#: (``grouped_mm_bf16`` runs op segment_gemm, triton opt-in: timed only when asked for)
SERVES = {"cudnn": ("mm_bf16", "mm_fp8", "bmm_fp8"), "cutlass": ("mm_bf16", "mm_fp8", "bmm_fp8"),
          "triton": ("mm_fp8", "bmm_fp8", "gemm_fp8_nt_groupwise", "grouped_mm_bf16")}
TARGET = 0.97
#: points under this many flops (a few microseconds) are timed over GRAPH_PASSES passes of their
#: input copies per graph, so that one replay spans tens of microseconds: a CUDA event pair
#: resolves about 0.5 us, and the 1-2 us a replay pays for the switch from another backend's
#: graph is spread over many calls
SMALL_POINT_FLOPS = 2e9
GRAPH_PASSES = 8


def add_arguments(parser) -> None:
    parser.add_argument("--repeats", type=int, default=1,
                        help="measure each point this many times (fresh inputs and graphs), "
                             "report the median")


def cases(args) -> list[dict]:
    """The grid of ``args.shapes``: (function, M, N, K, groups) per case."""
    if args.shapes == "tiny":
        grid = TINY
    else:
        quick = args.shapes == "quick"
        layers = [SQUARE] if quick else [*LAYERS.values(), SQUARE]
        grid = [(fn, m, n, k, 0) for fn in FUNCTIONS for n, k in layers
                for m in ((8192,) if quick else MS)]
        if quick:
            grid += [(fn, m, *LAYERS["dsv3.gate_up"], 0) for fn in FUNCTIONS for m in (16, 1024)]
        grid += [("bmm_fp8", m, n, k, b) for b, n, k in BATCHED.values() for m in BATCHED_MS]
        grid += [("grouped_mm_bf16", m, n, k, e) for e, n, k, m in GROUPED
                 if not quick or e == 256]
    return [{"case": f"{fn} M={m} N={n} K={k}" + (f" x{g}" if g else ""), "function": fn,
             "m": m, "n": n, "k": k, "groups": g} for fn, m, n, k, g in grid]


def backends(case: dict, args) -> list[str]:
    """BACKENDS less those that do not serve the function (CPU: auto and the reference)."""
    if args.device == "cpu":
        return harness.pick(args, ["auto", "reference"])
    fn = case["function"]
    return [b for b in harness.pick(args, BACKENDS) if fn in SERVES.get(b, (fn,))]


# ------------------------------------------------------------------------------ calls
def make_inputs(fn: str, m: int, n: int, k: int, device: str, groups: int = 0):
    """One set of call arguments ``(a, b, extra)`` for ``fn``: ``bmm_fp8`` has ``groups`` batch
    entries, ``grouped_mm_bf16`` ``groups`` experts of ``m`` tokens each (offsets in ``extra``)."""
    if fn == "bmm_fp8":
        aq, a_s = Q.quantize_fp8_per_tensor(torch.randn(groups, m, k, device=device))
        wq, w_s = Q.quantize_fp8_per_tensor(torch.randn(groups, n, k, device=device) / k ** 0.5)
        return aq, wq.transpose(1, 2), (a_s.reshape(1), w_s.reshape(1))  # B column-major
    if fn == "grouped_mm_bf16":
        a = torch.randn(groups * m, k, device=device).bfloat16()
        w = (torch.randn(groups, n, k, device=device) / k ** 0.5).bfloat16()
        offsets = torch.arange(0, (groups + 1) * m, m, dtype=torch.int32, device=device)
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


def call(fn: str, args, backend: str):
    """``fn`` on one argument set through ``backend`` (``vendor``: the vendor kernel directly)."""
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


def bench_point(case: dict, names: list[str], iters: int, device: str) -> dict:
    """One grid point: every backend's first call (plans, compiles, errors), eager time, and
    the GPU time of CUDA graphs of all backends replayed in turn (interleaved_graph_ms)."""
    fn, m, n, k, groups = (case[key] for key in ("function", "m", "n", "k", "groups"))
    one = make_inputs(fn, m, n, k, device, groups)
    nbytes = sum(t.numel() * t.element_size() for t in one[:2])
    copies = max(1, min(8, -(-2 * timing.L2_BYTES // max(nbytes, 1)))) if device == "cuda" else 1
    sets = [one] + [make_inputs(fn, m, n, k, device, groups) for _ in range(copies - 1)]
    flops = 2 * m * n * k * max(groups, 1)
    calls = sets * (GRAPH_PASSES if flops < SMALL_POINT_FLOPS else 1)
    entries, graphs = {}, {}
    for backend in names:
        try:
            call(fn, one, backend)
            entry = {"eager_ms": timing.eager_ms(lambda: [call(fn, s, backend) for s in sets],
                                                 iters, calls=len(sets))}
            if device == "cuda":
                graphs[backend] = timing.capture(calls, lambda a, b: call(fn, a, b), backend)
            if backend == "auto":
                entry["chosen"] = harness.chosen(lambda: call(fn, one, "auto"))
        except Exception as exc:  # noqa: BLE001 - a backend that cannot run a point is a finding
            entry = harness.error_entry(exc)
        entries[backend] = entry
    captured = {b: g for b, g in graphs.items() if g is not None}
    graph_times = timing.interleaved_graph_ms(captured, len(calls), iters) if captured else {}
    for backend, entry in entries.items():
        if "eager_ms" in entry:
            entry["graph_ms"] = graph_times.get(backend)
            entry["ms"] = entry["graph_ms"] if entry["graph_ms"] is not None else entry["eager_ms"]
            entry["tflops"] = flops / entry["ms"] / 1e9
    return entries


def merge_repeats(repeats: list[dict]) -> dict:
    """One point's entries from ``bench_point``'s repeats (fresh inputs and graphs each): every
    time is the median over the repeats, which are kept under ``ms_repeats``. A
    backend-to-backend ratio of a few-microsecond point moved by up to 10 % between processes on
    the H200 (the bmm_fp8 W_UV point at M = 128: Triton 0.89x to 1.13x cuDNN in the runs of
    2026-11-30), more than within one set of graphs."""
    merged = repeats[0]
    for backend, entry in merged.items():
        if "ms" not in entry or len(repeats) == 1:
            continue
        runs = [r[backend] for r in repeats if "ms" in r.get(backend, {})]
        flops = entry["tflops"] * entry["ms"] * 1e9
        entry["ms_repeats"] = [r["ms"] for r in runs]
        for key in ("eager_ms", "graph_ms", "ms"):
            if entry.get(key) is not None:
                entry[key] = statistics.median(r[key] for r in runs)
        entry["tflops"] = flops / entry["ms"] / 1e9
    return merged


def run_case(case: dict, args) -> dict:
    """One point, measured ``--repeats`` times (medians)."""
    names = backends(case, args)
    entries = merge_repeats([bench_point(case, names, args.iters, args.device)
                             for _ in range(args.repeats)])
    return {"backends": entries}


# ------------------------------------------------------------------------------ summary, plot
def vs_vendor(runs) -> dict:
    """``{case: (auto speed / best single vendor kernel, auto's kernel, that vendor)}``; on the
    CPU (no vendor kernel timed) against the reference."""
    table, order = harness.merged(runs)
    out = {}
    for case in order:
        row = table[case]
        vendors = [(e["ms"], b) for b, e in row.items()
                   if b in VENDOR_BACKENDS + ("reference",) and "ms" in e]
        auto = row.get("auto", {})
        if vendors and "ms" in auto:
            best_ms, best = min(vendors)
            out[case] = (best_ms / auto["ms"], auto.get("chosen"), best)
    return out


def summary(runs) -> str:
    """auto / best single vendor kernel at every point, then each function's lowest point."""
    ratios = vs_vendor(runs)
    lines = [f"auto / best single vendor kernel (target >= {TARGET}):"]
    lines += [f"  {case:46s} {r:.2f} (auto: {kernel}; best vendor: {best})"
              for case, (r, kernel, best) in ratios.items()]
    lines.append(f"\n{'function':24s} {'points':>6} {'lowest':>7}  at")
    for fn in dict.fromkeys(case.split()[0] for case in ratios):
        mine = {c: v for c, v in ratios.items() if c.split()[0] == fn}
        low = min(mine, key=lambda c: mine[c][0])
        lines.append(f"{fn:24s} {len(mine):>6} {mine[low][0]:>7.3f}  {low} ({mine[low][1]})")
    return "\n".join(lines)


def plot(runs):
    """A panel per function: auto's speed relative to the best single vendor kernel of each
    point, red below the 0.97 target."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    ratios = vs_vendor(runs)
    functions = list(dict.fromkeys(case.split()[0] for case in ratios)) or ["(none)"]
    fig, axes = plt.subplots(len(functions), 1, figsize=(13, 3.2 * len(functions)), squeeze=False)
    for ax, fn in zip(axes[:, 0], functions):
        keys = [c for c in ratios if c.split()[0] == fn]
        values = [ratios[c][0] for c in keys]
        ax.bar(range(len(keys)), values, color=["tab:red" if r < TARGET else "tab:blue" for r in values])
        ax.axhline(TARGET, color="black", linestyle="--", linewidth=1)
        ax.set_ylim(min([0.8] + [r - 0.05 for r in values]), max([1.1] + [r + 0.05 for r in values]))
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels([c.split(" ", 1)[1] for c in keys], rotation=90, fontsize=6)
        ax.set_ylabel("auto / best vendor")
        ax.set_title(f"{fn}: speed of auto relative to the best single vendor kernel "
                     f"(target >= {TARGET})", fontsize=9)
    fig.tight_layout()
    return fig


def main(argv=None, prog=None) -> int:
    return harness.main(sys.modules[__name__], argv, prog)


if __name__ == "__main__":
    sys.exit(main())
