"""Where one decode plan() spends its host time, measured inside plan() itself.

    python benchmarks/plan_timeline.py [--reps 600] [--backend cudnn]

Decode B=64, kv 4096, 32/8 heads, d128, page 16, bf16; page ids on the device (checked and
trusted) and on the host. The functions plan() calls are wrapped by a thin timer (well under a
microsecond each), so every piece is timed where it runs, with the caches as plan() leaves them
(a piece timed alone in a loop runs warm and reads several times faster). Prints, per case,
the median plan() and the median inclusive time of each wrapped function (``calls`` per plan).
The GPU is idle before each plan(); every fourth plan() is followed by a run().
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections import defaultdict

import torch

import flashinfer
from flashinfer.attention import batch_decode, batch_wrapper as batch_plan, upload as plan_upload
from flashinfer import dispatch

HQ, HKV, D, PAGE, KV, B = 32, 8, 128, 16, 4096, 64


def wrapper_and_plan(fi, backend, ids):
    """A decode wrapper of ``backend`` over B requests of KV tokens, page ids ``ids`` (host,
    device-trusted, device-checked), planned and run 20 times: (wrapper, plan(), run())."""
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


SPENT: dict = defaultdict(float)
CALLS: dict = defaultdict(int)


def timed(name, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[name] += time.perf_counter() - t
            CALLS[name] += 1
    return wrapper


def wrap_all():
    from flashinfer.backends.cudnn import _batch_graphs as graphs
    from flashinfer.backends.cudnn import batch_buckets as cudnn_plan

    targets = [
        (batch_decode, ["host_index_arrays", "check_indptr", "page_indices", "paged_kv_lens",
                        "planned_device_fields", "set_plan_attributes"]),
        (batch_decode.BatchDecodeWithPagedKVCacheWrapper, ["_plan_decode"]),
        (batch_plan.BatchWrapperBase, ["_finish_plan", "_drop_plan"]),
        (batch_plan, ["bind_device_arrays"]),
        (batch_plan.DeviceIdsCheck, ["resolve"]),
        (dispatch, ["decide_each"]),
        (plan_upload.PlanUpload, ["upload", "_staging", "current_stream", "host_copy"]),
        (graphs, ["prepare", "_finish_decode", "gather_decode_table", "decode_arrays",
                  "_spec_and_buffers"]),
        (cudnn_plan, ["decode_arrays", "gather_decode_table"]),
    ]
    for owner, names in targets:
        for name in names:
            fn = getattr(owner, name, None)
            if fn is None:
                continue
            label = f"{getattr(owner, '__name__', owner).rsplit('.', 1)[-1]}.{name}"
            setattr(owner, name, timed(label, fn))


def case(backend, ids, reps):
    w, plan, run = wrapper_and_plan(flashinfer, backend, ids)  # 20 plans and runs done
    totals, pieces = [], defaultdict(list)
    for i in range(reps):
        torch.cuda.synchronize()
        SPENT.clear()
        CALLS.clear()
        t = time.perf_counter()
        plan()
        totals.append(time.perf_counter() - t)
        for name, s in SPENT.items():
            pieces[name].append((s, CALLS[name]))
        if i % 4 == 0:
            run()
    torch.cuda.synchronize()
    print(f"== {backend} ids {ids}: plan median {statistics.median(totals) * 1e6:.1f} us "
          f"-> {w.decision.backend if w.decision else '?'}")
    rows = sorted(((statistics.median(s for s, _ in xs) * 1e6, name, xs[0][1])
                   for name, xs in pieces.items()), reverse=True)
    for us, name, calls in rows:
        print(f"   {us:7.1f} us  {calls:2d} x  {name}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=600)
    ap.add_argument("--backend", default="auto")
    args = ap.parse_args()
    wrap_all()
    for ids in ("device", "device-trusted", "host"):
        case(args.backend, ids, args.reps)


if __name__ == "__main__":
    main()
