"""Host time of a decode ``plan()``: this package against upstream FlashInfer, same machine.

    python benchmarks/plan_compare.py --out ours.json
    PYTHONPATH=/tmp/anchor python benchmarks/plan_compare.py --impl upstream --out up.json

Decode, kv 4096, 32/8 heads, d128, page 16, bf16, batch {1, 16, 64, 256}. ``indptr`` and
``last_page_len`` on the host, page ids on the device (as engines keep them) and — ours only,
upstream's run() reads them where they are — on the host. Each plan() is timed alone after a
``torch.cuda.synchronize()`` (an idle GPU), ``--reps`` times after a warm-up, interleaved with a
run() every ``--run-every`` plans as a serving step would; median, p10 and p90 in milliseconds.
Run each implementation in its own process (both packages are named ``flashinfer``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time

import torch

import flashinfer

HQ, HKV, D, PAGE, KV = 32, 8, 128, 16, 4096
BATCHES = (1, 16, 64, 256)


def _stats(times: list[float]) -> dict:
    times = sorted(times)
    pick = lambda q: times[min(len(times) - 1, int(q * len(times)))]  # noqa: E731
    return {"median_ms": statistics.median(times), "p10_ms": pick(0.1), "p90_ms": pick(0.9)}


def time_plans(batch: int, backend: str | None, ids_on_host: bool, reps: int, run_every: int) -> dict:
    pages = KV // PAGE
    total = batch * pages
    cache = torch.randn(total, 2, PAGE, HKV, D, device="cuda", dtype=torch.bfloat16)
    indices = torch.randperm(total, device="cuda", dtype=torch.int64).to(torch.int32)
    if ids_on_host:
        indices = indices.cpu()
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages
    last = torch.full((batch,), PAGE, dtype=torch.int32)
    q = torch.randn(batch, HQ, D, device="cuda", dtype=torch.bfloat16)
    ws = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    kwargs = {} if backend is None else {"backend": backend}
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", **kwargs)

    def plan():
        w.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=torch.bfloat16)

    for _ in range(20):
        plan()
        w.run(q, cache)
    times = []
    for i in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        plan()
        times.append((time.perf_counter() - t) * 1e3)
        if run_every and i % run_every == 0:
            w.run(q, cache)
    chosen = getattr(getattr(w, "decision", None), "name", None)
    return {"batch": batch, "backend": backend or "auto", "ids_on_host": ids_on_host,
            "chosen": chosen, **_stats(times)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--impl", choices=("ours", "upstream"), default="ours")
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--run-every", type=int, default=4)
    ap.add_argument("--backends", default="auto,cudnn,triton")
    args = ap.parse_args()
    backends = [None] if args.impl == "upstream" else [
        None if b == "auto" else b for b in args.backends.split(",")]
    hosts = (False,) if args.impl == "upstream" else (False, True)
    rows = []
    for batch in BATCHES:
        for backend in backends:
            for on_host in hosts:
                row = time_plans(batch, backend, on_host, args.reps, args.run_every)
                rows.append(row)
                print(f"{args.impl:8s} B={batch:<4d} {row['backend']:7s} ids on "
                      f"{'host  ' if on_host else 'device'} plan median {row['median_ms']:.3f} ms "
                      f"(p10 {row['p10_ms']:.3f}, p90 {row['p90_ms']:.3f}) -> {row['chosen']}",
                      flush=True)
    doc = {"command": "python benchmarks/plan_compare.py " + " ".join(
               f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
           "impl": args.impl, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "flashinfer": getattr(flashinfer, "__version__", "?"),
           "shape": {"kv_len": KV, "num_qo_heads": HQ, "num_kv_heads": HKV, "head_dim": D,
                     "page_size": PAGE, "dtype": "bfloat16"},
           "results": rows}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
