"""What the device page-id check adds to plan() (decode B=64, kv 4096, cuDNN and Triton).

    python benchmarks/plan_check_probe.py [--reps 300] [--against flashinfer_old]

Times, with an idle GPU before each plan() (``torch.cuda.synchronize()``): plan() with host
ids, trusted device ids and checked device ids (``benchmarks/plan_timeline.py`` splits a
plan() into its pieces); then the bare GPU round trip of a 64 KiB device-to-host copy into pinned memory, waited for by an event, by a stream
synchronisation and by polling ``event.query()``.

``--against NAME``: an older copy of the package importable as ``NAME`` (``git archive <rev>
flashinfer | tar -x -C build/old && mv build/old/flashinfer build/old/NAME``, on PYTHONPATH): both
are timed in this process, in alternating blocks of plans, so that a change is compared on
the same machine state (the host speed drifts between processes and machine starts).
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import time

import numpy as np
import torch

import flashinfer

HQ, HKV, D, PAGE, KV, B = 32, 8, 128, 16, 4096, 64


def med(xs):
    return statistics.median(xs) * 1e3


def wrapper_and_plan(fi, backend, ids):
    os.environ["FLASHINFER_TRUST_DEVICE_PAGE_IDS"] = "1" if ids == "device-trusted" else "0"
    pages = KV // PAGE
    total = B * pages
    cache = torch.randn(total, 2, PAGE, HKV, D, device="cuda", dtype=torch.bfloat16)
    indices = torch.randperm(total, device="cuda", dtype=torch.int64).to(torch.int32)
    if ids == "host":
        indices = indices.cpu()
    indptr = torch.arange(B + 1, dtype=torch.int32) * pages
    last = torch.full((B,), PAGE, dtype=torch.int32)
    q = torch.randn(B, HQ, D, device="cuda", dtype=torch.bfloat16)
    ws = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend=backend)

    def plan():
        w.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=torch.bfloat16)

    for _ in range(20):
        plan()
        w.run(q, cache)
    return w, plan, lambda: w.run(q, cache)


def time_plan(plan, run, reps):
    times = []
    for i in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        plan()
        times.append(time.perf_counter() - t)
        if i % 4 == 0:
            run()
    torch.cuda.synchronize()
    return times


def round_trips(reps):
    n = B * KV // PAGE
    ids = torch.randint(0, n, (n,), device="cuda", dtype=torch.int32)
    host = torch.empty(n, dtype=torch.int32, pin_memory=True)
    ev = torch.cuda.Event()
    out = {}
    for how in ("event.synchronize", "stream.synchronize", "event.query poll", "aminmax+2 values"):
        xs = []
        small = torch.empty(2, dtype=torch.int32, pin_memory=True)
        for _ in range(reps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            if how == "aminmax+2 values":
                lo, hi = torch.aminmax(ids)
                small.copy_(torch.stack((lo, hi)), non_blocking=True)
                ev.record()
                ev.synchronize()
            else:
                host.copy_(ids, non_blocking=True)
                ev.record()
                if how == "event.synchronize":
                    ev.synchronize()
                elif how == "stream.synchronize":
                    torch.cuda.current_stream().synchronize()
                else:
                    while not ev.query():
                        pass
            xs.append(time.perf_counter() - t)
        out[how] = med(xs)
    xs = []
    a = host.numpy()
    for _ in range(reps):
        t = time.perf_counter()
        int(a.view(np.uint32).max())
        xs.append(time.perf_counter() - t)
    out["numpy max 16384"] = med(xs)
    return out


def ab_rows(other, reps):
    """Median plan() time of this package and ``other``, alternating blocks of 25 plans."""
    lines = []
    for backend in ("cudnn", "triton"):
        for ids in ("host", "device-trusted", "device"):
            cases = {name: wrapper_and_plan(fi, backend, ids)
                     for name, fi in (("new", flashinfer), ("old", other))}
            times = {name: [] for name in cases}
            for _ in range(max(reps // 25, 1)):
                for name, (_, plan, run) in cases.items():
                    times[name] += time_plan(plan, run, 25)
            new, old = med(times["new"]), med(times["old"])
            lines.append(f"{backend:7s} ids {ids:15s} plan median new {new:.3f} ms, old {old:.3f} "
                         f"ms ({new / old:.2f}x)")
            print(lines[-1], flush=True)
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--no-bare", action="store_true", help="skip the bare round trips")
    ap.add_argument("--against", default="", help="an older copy's module name (A/B)")
    args = ap.parse_args()
    print(f"flashinfer from {os.path.dirname(flashinfer.__file__)}")
    if args.against:
        ab_rows(importlib.import_module(args.against), args.reps)
    for backend in ("cudnn", "triton"):
        for ids in ("host", "device-trusted", "device"):
            w, plan, run = wrapper_and_plan(flashinfer, backend, ids)
            times = time_plan(plan, run, args.reps)
            print(f"{backend:7s} ids {ids:15s} plan median {med(times):.3f} ms", flush=True)
    for how, ms in ({} if args.no_bare else round_trips(args.reps)).items():
        print(f"bare round trip {how:20s} {ms * 1e3:.1f} us", flush=True)


if __name__ == "__main__":
    main()
