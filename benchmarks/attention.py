"""Batch attention benchmark: paged decode, paged and ragged causal prefill, every backend + auto.

    python benchmarks/attention.py --out results.json                 # this package
    PYTHONPATH=/tmp/anchor python benchmarks/attention.py --impl upstream --out up.json

The runner uses only the upstream-compatible wrapper API, so the same file measures upstream
FlashInfer when its package is first on PYTHONPATH (run it in a separate process; both packages
are named ``flashinfer``). Shapes are in the tables below. Timing: back-to-back eager ``run()``
calls between CUDA events, median of ``--iters`` groups; ``plan()`` host time median of 30
(``plan_ms``: page ids on the device, as an engine keeps them; decode also ``plan_host_indices_ms``
with every index array on the host).
Decode reports KV bytes read per second (ceiling 4.1 TB/s); prefill reports TFLOP/s of the
visible (causal) query-key pairs (ceiling 774 bf16).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time

import torch

import flashinfer

HQ, HKV, D, PAGE = 32, 8, 128, 16
DECODE_GRID = [(b, kv) for b in (1, 16, 64, 256) for kv in (512, 4096, 16384)]
DECODE_FP8 = [(16, 4096), (64, 4096)]
PREFILL_GRID = [(1, 16384), (4, 4096), (32, 1024)]  # (requests, tokens each), causal, q = kv

OURS = {"decode": ["auto", "cudnn", "triton"], "paged": ["auto", "fa3", "cudnn"],
        "ragged": ["auto", "fa3", "cudnn", "torch:flash_varlen"]}
UPSTREAM = {"decode": ["auto"], "paged": ["fa2", "fa3"], "ragged": ["fa2", "fa3"]}


def _time_eager(fn, iters: int, reps: int = 10) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return statistics.median(times)


def _time_host(fn, n: int = 30) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def _paged(batch: int, kv_len: int, kv_dtype) -> tuple:
    pages_per = -(-kv_len // PAGE)
    total_pages = batch * pages_per
    cache = torch.randn(total_pages, 2, PAGE, HKV, D, device="cuda", dtype=torch.bfloat16).to(kv_dtype)
    indices = torch.randperm(total_pages, device="cuda", dtype=torch.int64).to(torch.int32)
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages_per
    last = torch.full((batch,), kv_len - (pages_per - 1) * PAGE, dtype=torch.int32)
    return cache, indices, indptr, last


def _workspace() -> torch.Tensor:
    return torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")


def bench_decode(batch, kv_len, kv_dtype, backend, iters):
    cache, indices, indptr, last = _paged(batch, kv_len, kv_dtype)
    q = torch.randn(batch, HQ, D, device="cuda", dtype=torch.bfloat16)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_workspace(), "NHD", backend=backend)

    def plan():
        w.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=torch.bfloat16,
               kv_data_type=kv_dtype)
    t0 = time.perf_counter()
    plan()
    w.run(q, cache)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    scale = {} if kv_dtype == torch.bfloat16 else {"k_scale": 0.5, "v_scale": 0.5}
    ms = _time_eager(lambda: w.run(q, cache, **scale), iters)
    kv_bytes = 2 * batch * kv_len * HKV * D * cache.element_size()
    indices_host = indices.cpu()
    entry = {"ms": ms, "tb_per_s": kv_bytes / ms / 1e9, "plan_ms": _time_host(plan),
             "plan_host_indices_ms": _time_host(lambda: w.plan(
                 indptr, indices_host, last, HQ, HKV, D, PAGE, q_data_type=torch.bfloat16,
                 kv_data_type=kv_dtype)),
             "first_plan_run_s": first, "chosen": getattr(getattr(w, "decision", None), "name", None)}
    try:  # GPU time alone: a use_cuda_graph wrapper's run() captured once, replayed
        graph_ms = _time_graph_decode(cache, indices, indptr, last, q, kv_dtype, backend, scale, iters)
        entry.update(graph_ms=graph_ms, graph_tb_per_s=kv_bytes / graph_ms / 1e9)
    except Exception as exc:  # noqa: BLE001 - recorded, the eager figure stands
        entry["graph_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return entry


def _time_graph_decode(cache, indices, indptr, last, q, kv_dtype, backend, scale, iters) -> float:
    batch = last.shape[0]
    bufs = dict(paged_kv_indptr_buffer=indptr.to("cuda"), paged_kv_indices_buffer=indices.clone(),
                paged_kv_last_page_len_buffer=last.to("cuda"))
    kwargs = {} if backend == "auto" else {"backend": backend}
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_workspace(), "NHD", use_cuda_graph=True,
                                                      **bufs, **kwargs)
    w.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=torch.bfloat16,
           kv_data_type=kv_dtype)
    out = torch.empty(batch, HQ, D, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            w.run(q, cache, out=out, **scale)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, cache, out=out, **scale)
    return _time_eager(graph.replay, iters)


def bench_prefill(kind, requests, tokens, backend, iters):
    total = requests * tokens
    q = torch.randn(total, HQ, D, device="cuda", dtype=torch.bfloat16)
    qo_indptr = torch.arange(requests + 1, dtype=torch.int32) * tokens
    if kind == "paged":
        cache, indices, kv_indptr, last = _paged(requests, tokens, torch.bfloat16)
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_workspace(), "NHD", backend=backend)

        def plan():
            w.plan(qo_indptr, kv_indptr, indices, last, HQ, HKV, D, PAGE, causal=True,
                   q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
        run = lambda: w.run(q, cache)  # noqa: E731
    else:
        k = torch.randn(total, HKV, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(total, HKV, D, device="cuda", dtype=torch.bfloat16)
        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_workspace(), "NHD", backend=backend)

        def plan():
            w.plan(qo_indptr, qo_indptr, HQ, HKV, D, causal=True, q_data_type=torch.bfloat16)
        run = lambda: w.run(q, k, v)  # noqa: E731
    t0 = time.perf_counter()
    plan()
    run()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    ms = _time_eager(run, iters, reps=3)
    flops = 4 * HQ * D * requests * (tokens * (tokens + 1) // 2)
    return {"ms": ms, "tflops": flops / ms / 1e9, "plan_ms": _time_host(plan),
            "first_plan_run_s": first, "chosen": getattr(getattr(w, "decision", None), "name", None)}


def _describe(kind: str, entry: dict) -> str:
    if "ms" not in entry:
        return entry["error"]
    rate = entry.get("tb_per_s") or entry.get("tflops")
    graph = f" graph {entry['graph_ms']:.4f} ms" if "graph_ms" in entry else ""
    host = (f" (host indices {entry['plan_host_indices_ms']:.3f})"
            if "plan_host_indices_ms" in entry else "")
    return (f"{entry['ms']:8.4f} ms{graph} {rate:7.2f} {'TB/s' if kind == 'decode' else 'TFLOP/s'} "
            f"plan {entry['plan_ms']:.3f} ms{host} first {entry['first_plan_run_s']:.2f} s "
            f"-> {entry['chosen']}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--impl", choices=("ours", "upstream"), default="ours")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="only the issue's target shapes")
    args = parser.parse_args()
    backends = OURS if args.impl == "ours" else UPSTREAM
    decode = [(64, 4096)] if args.quick else DECODE_GRID
    prefill = [(4, 4096)] if args.quick else PREFILL_GRID
    cases = [("decode", b, kv, torch.bfloat16) for b, kv in decode]
    cases += [("decode", b, kv, torch.float8_e4m3fn) for b, kv in ([] if args.quick else DECODE_FP8)]
    cases += [(kind, r, t, torch.bfloat16) for kind in ("paged", "ragged") for r, t in prefill]
    results = []
    doc = {"command": "python " + " ".join(sys.argv), "impl": args.impl,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "flashinfer": getattr(flashinfer, "__version__", "?"),
           "shapes": {"num_qo_heads": HQ, "num_kv_heads": HKV, "head_dim": D, "page_size": PAGE},
           "timing": "eager back-to-back run() between CUDA events, median (ms); decode also graph_ms: "
                     "a use_cuda_graph wrapper's run() captured once and replayed (GPU time); plan() "
                     "host time median of 30 after 3 warm-up calls",
           "results": results}
    # a first call kept apart: the first case's first backend otherwise reads up to 20 % slow
    # (the GPU clock and the host's caches still cold; eager decode at batch 1 is launch-bound);
    # its first plan+run is the fresh process's, JIT included for upstream
    doc["process_warmup"] = {"case": "decode B=1 kv=512 bfloat16", "backend": "auto",
                             **bench_decode(1, 512, torch.bfloat16, "auto", 2)}
    for kind, a, b, kv_dtype in cases:
        name = (f"decode B={a} kv={b} {str(kv_dtype)[6:]}" if kind == "decode"
                else f"{kind} causal {a}x{b}")
        point = {"case": name, "kind": kind, "a": a, "b": b, "kv_dtype": str(kv_dtype), "backends": {}}
        for backend in backends[kind]:
            try:
                if kind == "decode":
                    entry = bench_decode(a, b, kv_dtype, backend, args.iters)
                else:
                    entry = bench_prefill(kind, a, b, backend, args.iters)
            except Exception as exc:  # a backend that cannot run a case is a finding
                entry = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
            point["backends"][backend] = entry
            print(f"{name:<34} {backend:<20} {_describe(kind, entry)}", flush=True)
            torch.cuda.empty_cache()
        results.append(point)
        with open(args.out, "w") as f:  # after every case: a run cut short keeps what it measured
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
