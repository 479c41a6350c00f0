"""Host cost of the CUDA calls a plan() makes through torch, on the device machine.

    python benchmarks/probe_cuda_call_costs.py [--reps 2000]

Prints the median host time per call in microseconds (the GPU is drained every 64 calls, so
the launch queue never fills).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

N = 16384


def per_call_us(fn, reps):
    times = []
    for i in range(reps):
        if i % 64 == 0:
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2000)
    args = ap.parse_args()
    dev = torch.randint(0, 1 << 20, (N,), device="cuda", dtype=torch.int32)
    dev2 = torch.empty_like(dev)
    host = torch.empty(N, dtype=torch.int32, pin_memory=True)
    ev = torch.cuda.Event()
    stream = torch.cuda.current_stream()
    rows = {
        "torch copy_ D2H (pinned, non_blocking)": lambda: host.copy_(dev, non_blocking=True),
        "torch copy_ H2D (pinned, non_blocking)": lambda: dev.copy_(host, non_blocking=True),
        "torch copy_ D2D": lambda: dev2.copy_(dev, non_blocking=True),
        "torch slice host[:n]": lambda: host[:N - 1],
        "torch Event.record()": lambda: ev.record(),
        "torch Event.record(stream)": lambda: ev.record(stream),
        "torch Event.query()": lambda: ev.query(),
        "torch.cuda.current_stream()": lambda: torch.cuda.current_stream(),
        "torch._C._cuda_getCurrentStream(0)": lambda: torch._C._cuda_getCurrentStream(0),
        "torch.cuda.current_stream().cuda_stream": lambda: torch.cuda.current_stream().cuda_stream,
        "tensor.data_ptr()": lambda: dev.data_ptr(),
    }
    for name, fn in rows.items():
        print(f"{per_call_us(fn, args.reps):7.2f} us  {name}", flush=True)


if __name__ == "__main__":
    main()
