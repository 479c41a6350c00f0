"""Host time of a decode ``plan()``: this package against upstream FlashInfer, same machine.

    python benchmarks/plan_compare.py --out ours.json
    PYTHONPATH=/tmp/anchor python benchmarks/plan_compare.py --impl upstream --out up.json

Decode, kv 4096, 32/8 heads, d128, page 16, bf16, batch {1, 16, 64, 256}. ``indptr`` and
``last_page_len`` on the host, page ids on the device (as engines keep them; ours also with
``FLASHINFER_TRUST_DEVICE_PAGE_IDS=1``, no check, as upstream) and — ours only, upstream's run()
reads them where they are — on the host. ``--mode sync``: each plan() is timed
alone after a ``torch.cuda.synchronize()`` (an idle GPU), with a run() every ``--run-every``
plans; ``--mode pipelined``: a serving loop, plan() then run() with no synchronisation, so the
host runs ahead of the GPU and a plan() that waits for the device pays for it. ``--reps`` timed
plans after a warm-up; median, p10 and p90 in milliseconds. Run each implementation in its own
process (both packages are named ``flashinfer``). The device host's speed varies between
machine starts: compare implementations measured in one call.

``--growing``: the plans of consecutive decode steps, as a serving loop makes them — request
``r`` holds ``KV - 15 + (5 r + step) % 32`` tokens, so at every step some requests cross a page
boundary and the page-id count changes (32 distinct steps, cycled). Without it every plan()
repeats one batch.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
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


def batch_at_step(batch: int, step: int | None, indices: torch.Tensor):
    """(indptr, page ids, last_page_len) of decode step ``step`` (see ``--growing``); None:
    every request holds ``KV`` tokens."""
    if step is None:
        lens = torch.full((batch,), KV)
    else:
        lens = KV - PAGE + 1 + (torch.arange(batch) * 5 + step) % (2 * PAGE)
    pages = (lens + PAGE - 1) // PAGE
    indptr = torch.zeros(batch + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(pages, 0)
    last = (lens - (pages - 1) * PAGE).to(torch.int32)
    return indptr, indices[:int(indptr[-1])], last


def time_plans(batch: int, backend: str | None, ids: str, reps: int, run_every: int,
               mode: str, growing: bool = False) -> dict:
    """``ids``: where the page ids are — "host", "device" or "device-trusted" (device, with
    ``FLASHINFER_TRUST_DEVICE_PAGE_IDS=1``: no bounds check, no synchronisation)."""
    os.environ["FLASHINFER_TRUST_DEVICE_PAGE_IDS"] = "1" if ids == "device-trusted" else "0"
    pages = KV // PAGE + 1  # room for the longest request of a growing batch
    total = batch * pages
    cache = torch.randn(total, 2, PAGE, HKV, D, device="cuda", dtype=torch.bfloat16)
    indices = torch.randperm(total, device="cuda", dtype=torch.int64).to(torch.int32)
    if ids == "host":
        indices = indices.cpu()
    steps = [batch_at_step(batch, step, indices) for step in range(32)] if growing else [
        batch_at_step(batch, None, indices)]
    q = torch.randn(batch, HQ, D, device="cuda", dtype=torch.bfloat16)
    ws = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    kwargs = {} if backend is None else {"backend": backend}
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", **kwargs)
    step = 0

    def plan():
        nonlocal step
        indptr, ids_now, last = steps[step % len(steps)]
        step += 1
        w.plan(indptr, ids_now, last, HQ, HKV, D, PAGE, q_data_type=torch.bfloat16)

    for _ in range(20):
        plan()
        w.run(q, cache)
    times = []
    torch.cuda.synchronize()
    for i in range(reps):
        if mode == "sync":
            torch.cuda.synchronize()
        t = time.perf_counter()
        plan()
        times.append((time.perf_counter() - t) * 1e3)
        if mode == "pipelined" or (run_every and i % run_every == 0):
            w.run(q, cache)
    torch.cuda.synchronize()
    chosen = getattr(getattr(w, "decision", None), "name", None)
    return {"batch": batch, "backend": backend or "auto", "ids": ids, "mode": mode,
            "growing": growing, "chosen": chosen, **_stats(times)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--impl", choices=("ours", "upstream"), default="ours")
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--run-every", type=int, default=4)
    ap.add_argument("--backends", default="auto,cudnn,triton")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--mode", default="sync", help="sync, pipelined or both (comma list)")
    ap.add_argument("--growing", action="store_true", help="consecutive decode steps (see above)")
    args = ap.parse_args()
    backends = [None] if args.impl == "upstream" else [
        None if b == "auto" else b for b in args.backends.split(",")]
    where = ("device",) if args.impl == "upstream" else ("device", "device-trusted", "host")
    rows = []
    for mode in args.mode.split(","):
        for batch in map(int, args.batches.split(",")):
            for backend in backends:
                for ids in where:
                    row = time_plans(batch, backend, ids, args.reps, args.run_every, mode,
                                     args.growing)
                    rows.append(row)
                    print(f"{args.impl:8s} {mode:9s} B={batch:<4d} {row['backend']:7s} ids "
                          f"{ids:14s} plan median {row['median_ms']:.3f} "
                          f"ms (p10 {row['p10_ms']:.3f}, p90 {row['p90_ms']:.3f}) -> {row['chosen']}",
                          flush=True)
    doc = {"command": "python benchmarks/plan_compare.py " + " ".join(
               f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
            if v is not False).replace(" True", ""),
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
