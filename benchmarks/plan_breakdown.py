"""What one decode plan() costs on this host, piece by piece, without a profiler's overhead.

    python benchmarks/plan_breakdown.py [--reps 400]

Decode B=64, kv 4096, 32/8 heads, d128, page 16, bf16, index arrays on the host (and, for the
whole plan(), also on the device). Each piece is timed on its own, repeated, median in
microseconds; the primitives (an event record, a pinned copy, ...) show what the floor is.
The pieces do not add up exactly to plan(): caches are warm in a loop of one piece.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import flashinfer
from flashinfer import dispatch
from flashinfer.backends.cudnn import _batch_graphs as cg
from flashinfer.backends.cudnn import batch_buckets as bp
from flashinfer.attention.batch_checks import (
    check_indptr, host_index_arrays, page_indices, paged_kv_lens,
)

HQ, HKV, D, PAGE, B, KV = 32, 8, 128, 16, 64, 4096


def us(fn, reps: int) -> float:
    for _ in range(20):
        fn()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=400)
    n = ap.parse_args().reps
    pages = KV // PAGE
    total = B * pages
    ws = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    indices = torch.randperm(total, dtype=torch.int64).to(torch.int32)
    indptr = torch.arange(B + 1, dtype=torch.int32) * pages
    last = torch.full((B,), PAGE, dtype=torch.int32)
    rows = []

    def add(name, fn):
        rows.append((name, us(fn, n)))

    for backend in ("cudnn", "triton"):
        for where in ("host", "device"):
            dev = "cpu" if where == "host" else "cuda"
            args = (indptr.to(dev), indices.to(dev), last.to(dev))
            w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
            add(f"plan() {backend}, indices on the {where}",
                lambda w=w, a=args: w.plan(*a, HQ, HKV, D, PAGE, q_data_type=torch.bfloat16))
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend="cudnn")
    w.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=torch.bfloat16)
    plan = w._plan  # planned with the page ids on the host
    host_plan = plan
    w.plan(indptr, indices.cuda(), last, HQ, HKV, D, PAGE, q_data_type=torch.bfloat16)
    plan = w._plan  # page ids on the device
    add("  host_index_arrays (2 host arrays)", lambda: host_index_arrays(("a", indptr), ("b", last)))
    d_ind, d_last = indptr.cuda(), last.cuda()
    add("  host_index_arrays (2 device arrays)", lambda: host_index_arrays(("a", d_ind), ("b", d_last)))
    add("  check_indptr", lambda: check_indptr("indptr", indptr, B))
    add("  paged_kv_lens", lambda: paged_kv_lens(indptr, last, PAGE))
    add("  page_indices (host)", lambda: page_indices("indices", indices, total))
    d_indices = indices.cuda()
    add("  page_indices (device)", lambda: page_indices("indices", d_indices, total))
    arrays = {"qo_indptr": plan.qo_indptr_host, "kv_indptr": plan.kv_indptr_host,
              "kv_lens": plan.kv_lens_host, "kv_last_page_len": plan.kv_last_page_len_host,
              "kv_indices": indices}
    none = dict.fromkeys(arrays)
    add("  PlanUpload.upload", lambda: w._upload.upload(arrays, none, True))
    add("  _finish_plan (cudnn, host ids)", lambda: w._finish_plan(host_plan, total - 1, arrays, none, True))
    def decide_all():
        for problem in w._problems[2]:
            try:
                dispatch.decide(problem, "cudnn")
            except dispatch.NoBackendError:
                pass
    add("    dispatch.decide x4", decide_all)
    add("    cudnn planner (one-phase, own upload)", lambda: cg.plan(plan))
    add("    cudnn prepare (host ids)", lambda: cg.prepare(host_plan))
    add("    cudnn prepare (device ids)", lambda: cg.prepare(plan))
    spec = bp.make_spec(plan, device_index=0, scale=plan.sm_scale)
    add("      make_spec", lambda: bp.make_spec(plan, device_index=0, scale=plan.sm_scale))
    add("      decode_arrays (host ids)", lambda: bp.decode_arrays(spec, host_plan))
    add("      decode_arrays (device ids)", lambda: bp.decode_arrays(spec, plan))
    add("      _Buffers (allocation)", lambda: cg._Buffers(spec, plan.device, B))
    buffers = cg._Buffers(spec, plan.device, B)
    add("      (prefill path: build_metadata + upload)",
        lambda: buffers.upload(bp.build_metadata(spec, plan)))
    add("      fill_page_table", lambda: bp.fill_page_table(buffers.page_table,
                                                           buffers.tensors["page_src"], plan.kv_indices))
    # primitives
    ev = torch.cuda.Event()
    pinned = torch.empty(1 << 17, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(1 << 17, dtype=torch.uint8, device="cuda")
    small = torch.empty(1 << 17, dtype=torch.uint8)
    add("  prim: Event.record()", lambda: ev.record())
    add("  prim: Event.synchronize() (done)", lambda: ev.synchronize())
    add("  prim: torch.cuda.current_stream()", torch.cuda.current_stream)
    add("  prim: torch.empty(64 KiB, cuda)", lambda: torch.empty(1 << 16, dtype=torch.uint8, device="cuda"))
    add("  prim: H2D 64 KiB pinned, non_blocking", lambda: dst[:1 << 16].copy_(pinned[:1 << 16], non_blocking=True))
    pageable = torch.empty(1 << 17, dtype=torch.uint8)
    add("  prim: H2D 64 KiB pageable, non_blocking", lambda: dst[:1 << 16].copy_(pageable[:1 << 16], non_blocking=True))
    add("  prim: H2D 128 KiB pageable, non_blocking", lambda: dst.copy_(pageable, non_blocking=True))
    add("  prim: H2D 128 KiB pinned + Event.record + sync", lambda: (dst.copy_(pinned, non_blocking=True), ev.record(), ev.synchronize()))
    def unsigned_max():
        return int(d_indices.view(torch.uint32).max())
    try:
        assert unsigned_max() == int(d_indices.max())
        neg = d_indices.clone()
        neg[5] = -3
        assert int(neg.view(torch.uint32).max()) == 2**32 - 3
        add("  prim: ids.view(uint32).max() -> int (one reduction, one sync)", unsigned_max)
    except Exception as exc:  # noqa: BLE001 - a probe: report and go on
        print(f"# uint32 max unsupported: {type(exc).__name__}: {exc}")
    add("  prim: torch._C._cuda_getCurrentStream", lambda: torch._C._cuda_getCurrentStream(0))
    add("  prim: torch.index_select 16k from unfolded", lambda: torch.index_select(d_indices.unfold(0, 256, 1), 0, d_ind[:-1]))
    add("  prim: CPU copy_ 64 KiB (torch)", lambda: pinned[:1 << 16].copy_(small[:1 << 16]))
    add("  prim: CPU copy 64 KiB (numpy)", lambda: np.copyto(pinned[:1 << 16].numpy(), small[:1 << 16].numpy()))
    add("  prim: D2H 65 int32 (sync)", lambda: d_ind.to("cpu"))
    add("  prim: index_select 16k", lambda: torch.index_select(d_indices, 0, d_indices.long()[:16384] % 16384))
    # eager run() at batch 1 (host-bound there): the wrapper's checks, then the runner's parts
    cache = torch.randn(pages, 2, PAGE, HKV, D, device="cuda", dtype=torch.bfloat16)
    w1 = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend="cudnn")
    w1.plan(torch.tensor([0, pages], dtype=torch.int32), torch.arange(pages, dtype=torch.int32),
            torch.tensor([PAGE], dtype=torch.int32), HQ, HKV, D, PAGE, q_data_type=torch.bfloat16)
    q = torch.randn(1, HQ, D, device="cuda", dtype=torch.bfloat16)
    out = w1.run(q, cache)
    runner = next(iter(w1._runners.values()))
    p1 = w1._plan
    from flashinfer.attention.batch_params import KVInput, RunScales
    from flashinfer.attention.batch_checks import paged_kv_pages
    add("run() cudnn, batch 1, kv 4096", lambda: w1.run(q, cache))
    add("  _check_run", lambda: w1._check_run(q, None))
    add("  paged_kv_pages", lambda: paged_kv_pages(cache, p1, w1._max_page, w1._check_kv))
    kvin = KVInput(*paged_kv_pages(cache, p1, w1._max_page, w1._check_kv))
    scales = RunScales()
    add("  runner(...)", lambda: runner(q, kvin, out, None, scales))
    add("    _binding", lambda: cg._binding(0))
    add("    kv_key(container(k), container(v))",
        lambda: cg.kv_key(cg.container(kvin.k, "NHD"), cg.container(kvin.v, "NHD")))
    add("  prim: torch.empty(out, cuda)", lambda: torch.empty_like(out))
    add("  prim: masked_fill_", lambda: out.masked_fill_(runner.buffers.tensors["dead_rows"][:1, None, None], 0))
    torch.cuda.synchronize()
    print(f"# decode B={B} kv={KV} {HQ}/{HKV} heads d{D} page {PAGE}; median of {n}, microseconds")
    for name, t in rows:
        print(f"{name:48s} {t:8.1f}")


if __name__ == "__main__":
    main()
