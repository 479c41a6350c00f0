"""Host time of one eager call per backend (CUTLASS against torch and cuDNN): mm_bf16 and
bmm_fp8 at small shapes, where the host time is the whole cost. Prints a table; ``--out``
writes JSON.

    python benchmarks/probe_cutlass_launch.py --out probe.json

Each row: the median over 200 calls of the host time of one call (no synchronisation between
calls), and the GPU time of one call from CUDA events over the same 200 calls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import flashinfer


def _cases(device):
    a = torch.randn(16, 1024, device=device).bfloat16()
    w = torch.randn(1024, 1024, device=device).bfloat16()
    A = torch.randn(16, 16, 128, device=device).to(torch.float8_e4m3fn)
    B = torch.randn(16, 512, 128, device=device).to(torch.float8_e4m3fn).transpose(1, 2)
    one = torch.ones(1, device=device)
    return {
        "mm_bf16 16x1024x1024": lambda backend: flashinfer.mm_bf16(a, w.t(), backend=backend),
        "bmm_fp8 16x(16x512x128)": lambda backend: flashinfer.bmm_fp8(
            A, B, one, one, torch.bfloat16, backend=backend),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--backends", default="torch,cudnn,cutlass")
    ap.add_argument("--profile", default="cutlass",
                    help="backend whose calls are profiled (cProfile, top functions printed)")
    args = ap.parse_args()
    rows = []
    for name, call in _cases("cuda").items():
        for backend in args.backends.split(","):
            try:
                for _ in range(5):
                    call(backend)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - a backend that cannot run it is a finding
                rows.append({"case": name, "backend": backend, "error": str(exc)[:120]})
                continue
            host = []
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(200):
                t = time.perf_counter()
                call(backend)
                host.append((time.perf_counter() - t) * 1e6)
            end.record()
            end.synchronize()
            rows.append({"case": name, "backend": backend, "host_us": statistics.median(host),
                         "per_call_us": start.elapsed_time(end) * 1e3 / 200})
    if args.profile:
        import cProfile
        import pstats

        for name, call in _cases("cuda").items():
            profiler = cProfile.Profile()
            profiler.runcall(lambda: [call(args.profile) for _ in range(50)])
            print(f"== {name}, {args.profile}: cProfile of 50 calls (cumulative)")
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(14)
    for r in rows:
        if "error" in r:
            print(f"{r['case']:26s} {r['backend']:8s} error: {r['error']}")
        else:
            print(f"{r['case']:26s} {r['backend']:8s} host {r['host_us']:8.1f} us   "
                  f"wall per call {r['per_call_us']:8.1f} us")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
