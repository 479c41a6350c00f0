"""Host time of ``plan()`` per batch wrapper and backend (CPU or GPU).

Batch 64, kv 4096, page 16, 32/8 heads, d128, bf16; ``indptr`` / ``last_page_len`` are CPU int32,
``kv_indices`` int32 on the device (as vLLM passes them). Also times the pure-Python part of the
cuDNN planner (``make_spec`` + ``build_metadata`` + ``pack``), which needs no cuDNN.
Prints the median of ``--iters`` calls in milliseconds.

    python3 benchmarks/plan_time.py [--iters 50] [--backends reference,triton,auto]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import flashinfer  # noqa: E402
from flashinfer.backends.cudnn import batch_buckets as cudnn_plan  # noqa: E402

BATCH, KV_LEN, PAGE, HQ, HKV, D = 64, 4096, 16, 32, 8, 128


def _median_ms(fn, iters: int) -> float:
    fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _inputs(device):
    pages_per = -(-KV_LEN // PAGE)
    indices = torch.randperm(BATCH * pages_per, dtype=torch.int64).to(torch.int32).to(device)
    indptr = torch.arange(BATCH + 1, dtype=torch.int32) * pages_per
    last = torch.full((BATCH,), KV_LEN - (pages_per - 1) * PAGE, dtype=torch.int32)
    qo_indptr = torch.arange(BATCH + 1, dtype=torch.int32)
    return indices, indptr, last, qo_indptr


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--backends", default="reference,triton,auto")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    indices, indptr, last, qo_indptr = _inputs(device)
    ws = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    print(f"device {device}; batch {BATCH}, kv {KV_LEN}, page {PAGE}, heads {HQ}/{HKV}, d {D}, bf16")
    for backend in args.backends.split(","):
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
        try:
            ms = _median_ms(lambda: w.plan(indptr, indices, last, HQ, HKV, D, PAGE,
                                           q_data_type=torch.bfloat16), args.iters)
            print(f"decode  plan  backend={backend:10s} {ms:8.3f} ms  ({w.decision.name})")
        except Exception as exc:  # noqa: BLE001 - a backend may not serve this machine
            print(f"decode  plan  backend={backend:10s} unavailable: {type(exc).__name__}: {exc}")
        if backend == "triton":
            continue
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
        try:
            ms = _median_ms(lambda: w.plan(qo_indptr, indptr, indices, last, HQ, HKV, D, PAGE,
                                           causal=True, q_data_type=torch.bfloat16), args.iters)
            print(f"prefill plan  backend={backend:10s} {ms:8.3f} ms  ({w.decision.name})")
        except Exception as exc:  # noqa: BLE001
            print(f"prefill plan  backend={backend:10s} unavailable: {type(exc).__name__}: {exc}")
    # the cuDNN planner's host part, on the plan the reference decode wrapper made
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend="reference")
    w.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=torch.bfloat16)
    plan = w._plan

    def cudnn_host():
        spec = cudnn_plan.make_spec(plan, device_index=0, scale=plan.sm_scale)
        cudnn_plan.pack(cudnn_plan.build_metadata(spec, plan).device_tensors())
    print(f"cudnn   host  (spec+metadata+pack)  {_median_ms(cudnn_host, args.iters):8.3f} ms")


if __name__ == "__main__":
    main()
