"""Host cost of an eager decode run(): where the microseconds go at small batch.

    python benchmarks/profile_run.py [--top 20] [--calls 2000]

For decode (32/8 heads, head dim 128, page 16, bf16) at small batches, with the cudnn and triton
backends: back-to-back run() throughput (host bound at these sizes), the cuDNN graph's own
``execute`` alone with the same arguments run() passed (keyed by tensor handles, as the adapter
does; keyed by uid; the ordered ``tensor_uids`` form), and a cProfile of run() by own time per
call.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

import flashinfer

HQ, HKV, D, PAGE = 32, 8, 128, 16


def per_call_us(fn, calls: int) -> float:
    """Back-to-back calls, one synchronisation at the end: host-bound throughput."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
    return best


def own_time_table(fn, calls: int, top: int) -> str:
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    rows = sorted(((own / calls * 1e6, n, f"{where.rsplit('/', 1)[-1]}:{line}({name})")
                   for (where, line, name), (_, n, own, _, _) in pstats.Stats(prof).stats.items()),
                  reverse=True)[:top]
    return "\n".join(f"{us:8.2f} us  {n:7d} x  {name}" for us, n, name in rows)


def setup(batch: int, kv: int, backend: str):
    ws = torch.empty(128 * 2**20, dtype=torch.uint8, device="cuda")
    pages_per = -(-kv // PAGE)
    total = batch * pages_per
    cache = torch.randn(total, 2, PAGE, HKV, D, device="cuda", dtype=torch.bfloat16)
    indices = torch.randperm(total, dtype=torch.int64).to(torch.int32)
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages_per
    last = torch.full((batch,), kv - (pages_per - 1) * PAGE, dtype=torch.int32)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
    w.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=torch.bfloat16)
    q = torch.randn(batch, HQ, D, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    return w, q, cache, out


def captured_cudnn_execute(run):
    """Run once with cuDNN's ``execute`` spied on; returns (graph class execute, self, args, kwargs)."""
    import cudnn
    cls = cudnn.pygraph
    original = cls.execute
    seen = {}

    def spy(self, *args, **kwargs):
        seen.update(graph=self, args=args, kwargs=kwargs)
        return original(self, *args, **kwargs)

    cls.execute = spy
    try:
        run()
    finally:
        cls.execute = original
    return original, seen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--batches", default="1,16,64")
    args = ap.parse_args()
    table = []
    for batch in map(int, args.batches.split(",")):
        kv = 512
        for backend in ("cudnn", "triton"):
            w, q, cache, out = setup(batch, kv, backend)
            run = lambda: w.run(q, cache)  # noqa: E731
            run_out = lambda: w.run(q, cache, out=out)  # noqa: E731
            row = {"batch": batch, "backend": backend, "run": per_call_us(run, args.calls),
                   "run_out": per_call_us(run_out, args.calls)}
            if backend == "cudnn":
                execute, seen = captured_cudnn_execute(run)
                g, a, k = seen["graph"], seen["args"], seen["kwargs"]
                pack = a[0]
                row["execute"] = per_call_us(lambda: execute(g, *a, **k), args.calls)
                by_uid = {handle.get_uid(): t for handle, t in pack.items()}
                row["execute_uids"] = per_call_us(lambda: execute(g, by_uid, *a[1:], **k),
                                                  args.calls)
                uids, buffers = list(by_uid), list(by_uid.values())
                try:  # the ordered form (cudnn-frontend 1.3x): buffers plus their int uids
                    row["execute_ordered"] = per_call_us(
                        lambda: execute(g, buffers, *a[1:], tensor_uids=uids, **k), args.calls)
                except Exception as exc:  # noqa: BLE001
                    print(f"ordered execute: {type(exc).__name__}: {exc}")
            row["empty"] = per_call_us(lambda: torch.empty_like(q), args.calls)
            table.append(row)
            print(f"\n===== decode B={batch} kv={kv} {backend}: run {row['run']:.1f} us per call =====")
            print(own_time_table(run, 500, args.top))
    nan = float("nan")
    print("\nbatch backend   run_us  run_out_us  execute_us  execute_uids_us  execute_ordered_us  empty_us")
    for r in table:
        print(f"{r['batch']:5d} {r['backend']:8s} {r['run']:7.1f} {r['run_out']:10.1f} "
              f"{r.get('execute', nan):10.1f} {r.get('execute_uids', nan):15.1f} "
              f"{r.get('execute_ordered', nan):18.1f} {r['empty']:8.1f}")


if __name__ == "__main__":
    main()
