"""Where plan() and run() spend host time: cProfile of the batch wrappers on the device.

    python benchmarks/profile_plan.py [--top 25]

For decode B=64 kv 4096 (cudnn, triton), paged prefill 4x4096 (fa3, cudnn) and ragged 4x4096
(fa3, cudnn), with the index arrays on the device (as attention.py passes them) and on the host:
median plan() and eager run() host time, then the top functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch

import flashinfer

HQ, HKV, D, PAGE = 32, 8, 128, 16


def _median_ms(fn, n=30):
    out = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)


def _setup(kind, backend, host_indices):
    ws = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    if kind == "decode":
        b, kv = 64, 4096
    else:
        b, kv = 4, 4096
    pages_per = -(-kv // PAGE)
    total = b * pages_per
    cache = torch.randn(total, 2, PAGE, HKV, D, device="cuda", dtype=torch.bfloat16)
    dev = "cpu" if host_indices else "cuda"
    indices = torch.randperm(total, dtype=torch.int64).to(torch.int32).to(dev)
    indptr = (torch.arange(b + 1, dtype=torch.int32) * pages_per).to(dev)
    last = torch.full((b,), kv - (pages_per - 1) * PAGE, dtype=torch.int32).to(dev)
    if kind == "decode":
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
        q = torch.randn(b, HQ, D, device="cuda", dtype=torch.bfloat16)
        plan = lambda: w.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=torch.bfloat16)  # noqa
        run = lambda: w.run(q, cache)  # noqa
    elif kind == "paged":
        qo = (torch.arange(b + 1, dtype=torch.int32) * kv).to(dev)
        q = torch.randn(b * kv, HQ, D, device="cuda", dtype=torch.bfloat16)
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
        plan = lambda: w.plan(qo, indptr, indices, last, HQ, HKV, D, PAGE, causal=True,  # noqa
                              q_data_type=torch.bfloat16)
        run = lambda: w.run(q, cache)  # noqa
    else:
        qo = (torch.arange(b + 1, dtype=torch.int32) * kv).to(dev)
        q = torch.randn(b * kv, HQ, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b * kv, HKV, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b * kv, HKV, D, device="cuda", dtype=torch.bfloat16)
        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
        plan = lambda: w.plan(qo, qo, HQ, HKV, D, causal=True, q_data_type=torch.bfloat16)  # noqa
        run = lambda: w.run(q, k, v)  # noqa
    return w, plan, run


def _profile(fn, n, top, sort="tottime"):
    """cProfile of ``n`` calls. ``sort="per_call"``: each function's own time per call of
    ``fn`` in microseconds (pstats' columns round to milliseconds), else pstats' table."""
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    if sort == "per_call":
        rows = sorted(((own / n * 1e6, calls, f"{where.rsplit('/', 1)[-1]}:{line}({name})")
                       for (where, line, name), (_, calls, own, _, _) in pstats.Stats(prof).stats.items()),
                      reverse=True)[:top]
        return "\n".join(f"{us:8.2f} us own per call  {calls:6d} x  {name}" for us, calls, name in rows)
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats(sort).print_stats(top)
    return "\n".join(line for line in s.getvalue().splitlines()[6:] if line.strip())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=22)
    ap.add_argument("--sort", default="tottime",
                    help="pstats key (tottime, cumulative) or per_call (own us per plan)")
    ap.add_argument("--only", default="", help="comma list of kinds (decode, paged, ragged)")
    ap.add_argument("--reps", type=int, default=50, help="calls profiled")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    table = []
    for kind, backend in (("decode", "cudnn"), ("decode", "triton"), ("paged", "fa3"),
                          ("paged", "cudnn"), ("ragged", "fa3"), ("ragged", "cudnn")):
        if only and kind not in only:
            continue
        for host in (False, True):
            try:
                w, plan, run = _setup(kind, backend, host)
                plan(); run(); torch.cuda.synchronize()
                plan_ms = _median_ms(plan)
                run_ms = _median_ms(run)
                table.append((kind, backend, "host" if host else "device", plan_ms, run_ms))
                if not host or kind == "decode" or args.only:
                    print(f"\n===== {kind} {backend} indices on {'host' if host else 'device'}: "
                          f"plan {plan_ms:.3f} ms, run (host) {run_ms:.3f} ms =====")
                    print(f"-- plan() x{args.reps} by {args.sort} --")
                    print(_profile(plan, args.reps, args.top, args.sort))
                    if not host:
                        print("-- run() x50 by own time --")
                        print(_profile(run, 50, 12))
            except Exception as exc:  # noqa: BLE001
                table.append((kind, backend, "host" if host else "device", float("nan"), float("nan")))
                print(f"{kind} {backend}: {type(exc).__name__}: {exc}")
    print("\nkind    backend  indices  plan_ms  run_host_ms")
    for row in table:
        print(f"{row[0]:7s} {row[1]:8s} {row[2]:7s} {row[3]:8.3f} {row[4]:8.3f}")


if __name__ == "__main__":
    main()
