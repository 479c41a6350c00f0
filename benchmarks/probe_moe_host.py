"""Where the eager time of one MoE layer call goes beyond its kernels (DeepSeek-V3 layer, torch
top-k routing, Triton backend).

    python benchmarks/probe_moe_host.py [--tokens 1 16 1024]

For each token count, through ``cutlass_fused_moe(backend="triton")`` and through the Triton
kernel entry point directly: the eager time between CUDA events (as ``moe.py``), the host time
of one call (perf_counter, no synchronisation; the GPU runs behind), the summed GPU kernel
times (torch profiler), and the replay time of a CUDA graph of the call. Then the host-side
torch ops of one facade call with the most self CPU time, and any synchronisation the call
makes (torch's sync debug mode). ``--cprofile``: instead, the Python functions with the
most own time over 200 calls of each kind (cProfile). ``--timeline``: instead, when each
Triton launch and torch allocation of a direct call starts and ends on the host (median of 30
calls, microseconds from the call's start).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
import warnings

import torch

from bench_timing import graph_ms
from moe import LAYER, _layer_call, _route, _weights
from profile_moe import kernel_times

from flashinfer.backends.triton import moe as tmoe
from flashinfer.fused_moe.core import ExpertSpec


def _median_ms(fn, iters: int = 15) -> tuple[float, float]:
    """(event ms, host ms) medians over ``iters`` eager calls, each from an idle GPU."""
    events, hosts = [], []
    for _ in range(iters):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t = time.perf_counter()
        fn()
        hosts.append((time.perf_counter() - t) * 1e3)
        end.record()
        end.synchronize()
        events.append(start.elapsed_time(end))
    return statistics.median(events), statistics.median(hosts)


def _cprofile(label: str, fn, calls: int = 200) -> None:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for i in range(calls):
        fn()
        if i % 20 == 19:  # keep the GPU queue short
            torch.cuda.synchronize()
    prof.disable()
    torch.cuda.synchronize()
    print(f"-- {label}: {calls} calls, own time")
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


def _timeline(label: str, fn, calls: int = 30) -> None:
    import triton

    marks: list[tuple[str, float, float]] = []

    def timed(name_of, inner):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            result = inner(*a, **kw)
            marks.append((name_of(a), t, time.perf_counter()))
            return result
        return wrapper

    jit = triton.runtime.jit.JITFunction
    saved = {"run": jit.run, "empty": torch.empty, "zeros": torch.zeros, "full": torch.full}
    jit.run = timed(lambda a: a[0].fn.__name__, saved["run"])
    for op in ("empty", "zeros", "full"):
        setattr(torch, op, timed(lambda a, _op=op: _op, saved[op]))
    rows = []
    try:
        for _ in range(calls + 3):
            torch.cuda.synchronize()
            marks.clear()
            t0 = time.perf_counter()
            fn()
            total = time.perf_counter() - t0
            rows.append([(n, (a - t0) * 1e6, (b - t0) * 1e6) for n, a, b in marks] +
                        [("(call)", 0.0, total * 1e6)])
    finally:
        jit.run = saved["run"]
        for op in ("empty", "zeros", "full"):
            setattr(torch, op, saved[op])
    rows = rows[3:]
    print(f"-- {label}: host timeline, us from the call's start (median of {calls})")
    for i, (name, _, _) in enumerate(rows[0]):
        start = statistics.median(r[i][1] for r in rows)
        end = statistics.median(r[i][2] for r in rows)
        print(f"   {name:28s} {start:8.1f} -> {end:8.1f}  ({end - start:6.1f})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 1024])
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--timeline", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    weights = _weights(LAYER, "cuda")
    w1, s1, w2, s2 = weights
    spec = ExpertSpec("fp8_block_scale", 3, 0, False)
    rows = []
    for tokens in args.tokens:
        x = torch.randn(tokens, LAYER["hidden"], device="cuda", dtype=torch.bfloat16)
        ids, values = _route(LAYER, tokens, "cuda", False, True)
        out = torch.empty_like(x)
        calls = {
            "facade": lambda: _layer_call(x, ids, values, weights, "triton"),
            "direct": lambda: tmoe.fused_moe(x, None, w1, s1, w2, s2, ids, values, spec, out),
        }
        if args.timeline:
            _timeline(f"T={tokens} direct", calls["direct"])
            continue
        if args.cprofile:
            for name, fn in calls.items():
                _cprofile(f"T={tokens} {name}", fn)
            continue
        for name, fn in calls.items():
            fn()
            event_ms, host_ms = _median_ms(fn)
            kernels_ms = sum(kernel_times(fn).values())
            replay_ms = graph_ms([None], lambda _args, _backend: fn(), "triton", 20)
            replay = "not capturable" if replay_ms is None else f"{replay_ms:.3f}"
            rows.append(f"T={tokens:<5d} {name:6s} event {event_ms:.3f} ms  host {host_ms:.3f} ms  "
                        f"kernels {kernels_ms:.3f} ms  graph {replay}")
            print(rows[-1], flush=True)
        fn = calls["facade"]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
        print(f"-- T={tokens}: host ops of 5 facade calls, most self CPU time first")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14,
                                        max_name_column_width=50))
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
        torch.cuda.set_sync_debug_mode("default")
        print(f"-- T={tokens}: synchronisations in one facade call: {len(caught)}")
        for w in caught[:5]:
            print("   ", str(w.message)[:160])
    print("\n".join(rows))


if __name__ == "__main__":
    main()
