"""MLA benchmark: ``BatchMLAPagedAttentionWrapper.run()`` at DeepSeek shapes, every MLA kernel
the capability database declares and ``auto``, FlashMLA called directly when it is installed,
and upstream FlashInfer 0.7.2's MLA (``fa2``, ``fa3``) side by side.

    python benchmarks/mla.py                              # GPU: the table below
    flashinfer bench mla --shapes quick                   # the issue's target points
    PYTHONPATH=/tmp/anchor:/tmp/site python benchmarks/mla.py --impl upstream

DeepSeek-V3 latent attention: ckv 512 + kpe 64, sm_scale 1/sqrt(192), 128 heads (one GPU) and 16
(8-way tensor parallel), bf16 (and fp8 e4m3 caches). The cases use only the upstream-compatible
wrapper API, so the same file measures upstream when its package is first on ``PYTHONPATH``
(a separate process). Timing: eager ``run()`` back to back between CUDA events, 10 calls per
group, median of ``--iters`` groups, after one plan(); ``plan_ms`` is plan()'s host time with
the index arrays on the host. A backend named ``<name>+graph`` is the CUDA-graph wrapper
(``use_cuda_graph=True`` and its four fixed buffers) with that backend: 10 run() calls captured
in one graph, median replay time per call (``auto+graph`` ours, ``fa2+graph`` / ``fa3+graph``
upstream's). Rates: TFLOP/s of the visible (query, key) pairs (4 * H *
(512 + 576) / 2 per pair) and TB/s of the latent cache read once (576 values per token).
"""

from __future__ import annotations

import sys

import torch

import harness
import timing

import flashinfer

FAMILY = "mla"
IMPLS = ("ours", "upstream")
TIMING = ("eager back-to-back run() between CUDA events, 10 calls a group, median of the "
          "iterations; plan() host time median of 30 after 3 warm-up calls; +graph: 10 run() "
          "calls of a use_cuda_graph wrapper in one CUDA graph, median replay per call")
CKV, KPE = 512, 64
SM_SCALE = 192 ** -0.5

# ------------------------------------------------------------------------------ shape table
#: (heads, batch, kv length each, query tokens per request, page size, kv dtype)
#: the issue's target points first (a run cut short at its budget still has them), then the grid
FULL = ([(h, 64, 4096, 2, 64, "bfloat16") for h in (128, 16)]         # MTP / speculative
        + [(h, 64, 4096, 1, p, "bfloat16") for h in (128, 16) for p in (1, 16)]
        + [(h, 64, 4096, 1, p, "float8_e4m3fn") for h in (128, 16) for p in (64, 1)]
        + [(h, b, kv, 1, 64, "bfloat16") for h in (128, 16) for b in (64, 128, 16, 1)
           for kv in (4096, 16384, 1024)])
QUICK = [(128, 64, 4096, 1, 64, "bfloat16"), (16, 64, 4096, 1, 64, "bfloat16"),
         (128, 64, 4096, 2, 64, "bfloat16"), (128, 64, 4096, 1, 1, "bfloat16")]
TINY = [(4, 2, 24, 1, 4, "float32"), (4, 2, 24, 2, 4, "float32")]
#: upstream's MLA backends (its "auto" is fa3 on SM 9.0)
UPSTREAM = ["fa2", "fa3"]


def cases(args) -> list[dict]:
    table = {"full": FULL, "quick": QUICK, "tiny": TINY}[args.shapes]
    dims = (32, 8) if args.shapes == "tiny" else (CKV, KPE)
    return [{"case": f"H={h} B={b} kv={kv} q={q} page={p} {dt}", "heads": h, "batch": b,
             "kv": kv, "q_len": q, "page": p, "kv_dtype": dt, "ckv": dims[0], "kpe": dims[1]}
            for h, b, kv, q, p, dt in table]


def backends(case: dict, args) -> list[str]:
    """Ours: auto, every declared MLA kernel but the reference (a loop over the requests) and
    FlashMLA direct (page 64, bf16); upstream: its fa2 / fa3 (CPU: auto and the reference)."""
    if args.device == "cpu":
        return harness.pick(args, ["auto", "reference"])
    if args.impl == "upstream":
        return harness.pick(args, UPSTREAM + [f"{b}+graph" for b in UPSTREAM])
    extra = ["flashmla_direct"] if case["page"] == 64 and case["kv_dtype"] == "bfloat16" else []
    kernels = [k for k in harness.declared_kernels("batch_mla") if k != "reference:default"]
    graphs = ["auto+graph"] + (["flashmla:dequant_graph+graph"]
                               if case["kv_dtype"] == "float8_e4m3fn" else [])
    return harness.pick(args, ["auto"] + kernels + extra + graphs)


def _inputs(case: dict, device: str) -> dict:
    """Index arrays on the host, the queries and a latent cache of shuffled pages."""
    b, kv, q_len, page = case["batch"], case["kv"], case["q_len"], case["page"]
    pages_each = -(-kv // page)
    n_pages = b * pages_each
    torch.manual_seed(0)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    kv_dtype = getattr(torch, case["kv_dtype"])
    width = case["ckv"] + case["kpe"]
    cache = torch.randn(n_pages, page, width, device=device, dtype=dtype).to(kv_dtype)
    return dict(
        qo_indptr=torch.arange(b + 1, dtype=torch.int32) * q_len,
        kv_indptr=torch.arange(b + 1, dtype=torch.int32) * pages_each,
        kv_indices=torch.randperm(n_pages, dtype=torch.int32),
        kv_len=torch.full((b,), kv, dtype=torch.int32),
        q=torch.randn(b * q_len, case["heads"], width, device=device, dtype=dtype),
        cache=cache, dtype=dtype, kv_dtype=kv_dtype)


def bench(case: dict, backend: str, iters: int, device: str) -> dict:
    """One backend's plan + run: eager run() time, rates, plan() host time."""
    t = _inputs(case, device)
    if backend == "flashmla_direct":
        return _flashmla_direct(case, t, iters)
    ckv, kpe = case["ckv"], case["kpe"]
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=device)
    graph = backend.endswith("+graph")
    if graph:  # the fixed buffers, sized for this batch and its pages
        bufs = {name: torch.zeros_like(t[key], device=device) for name, key in (
            ("qo_indptr", "qo_indptr"), ("kv_indptr", "kv_indptr"), ("kv_indices", "kv_indices"),
            ("kv_len_arr", "kv_len"))}
        w = flashinfer.mla.BatchMLAPagedAttentionWrapper(
            ws, use_cuda_graph=True, backend=backend.removesuffix("+graph"), **bufs)
    else:
        w = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws, backend=backend)

    def plan():
        w.plan(t["qo_indptr"], t["kv_indptr"], t["kv_indices"], t["kv_len"], case["heads"], ckv,
               kpe, case["page"], case["q_len"] > 1, SM_SCALE, t["dtype"], t["kv_dtype"])
    plan()
    q, cache = t["q"], t["cache"]
    scales = dict(ckv_scale=1.0, kpe_scale=1.0) if t["kv_dtype"] == torch.float8_e4m3fn else {}
    run = lambda: w.run(q[..., :ckv], q[..., ckv:], cache[..., :ckv], cache[..., ckv:],  # noqa: E731
                        **scales)
    run()
    if graph:
        ms = timing.graph_ms([()] * 10, lambda _args, _backend: run(), backend, iters)
        if ms is None:
            return {"error": "the run could not be captured in a CUDA graph"}
        return {**_rates(case, ms), "chosen": getattr(getattr(w, "decision", None), "name", None)}
    ms = timing.eager_ms(lambda: [run() for _ in range(10)], iters, calls=10, warmup=1)
    return {**_rates(case, ms), "plan_ms": timing.host_ms(plan),
            "chosen": getattr(getattr(w, "decision", None), "name", None)}


def _rates(case: dict, ms: float) -> dict:
    b, kv, q_len, h = case["batch"], case["kv"], case["q_len"], case["heads"]
    width = case["ckv"] + case["kpe"]
    pairs = b * sum(kv - q_len + i + 1 for i in range(q_len))  # causal for q_len > 1
    flops = 2 * h * pairs * (width + case["ckv"])
    nbytes = b * kv * width * getattr(torch, case["kv_dtype"]).itemsize
    return {"ms": ms, "tflops": flops / ms / 1e9, "tb_per_s": nbytes / ms / 1e9}


def _flashmla_direct(case: dict, t: dict, iters: int) -> dict:
    """FlashMLA's own call (``flash_mla`` from the ``sgl-flash-mla`` package): the cache as
    ``[pages, 64, 1, 576]``, a ``[B, pages]`` block table, the scheduler metadata made by the first
    call (its dense bf16 decode is the wheel's legacy op: ``use_legacy=True``)."""
    try:
        from flash_mla import flash_mla_with_kvcache, get_mla_metadata
    except ImportError as err:
        return {"skipped": f"flash_mla does not import: {err}"}
    b, q_len, h = case["batch"], case["q_len"], case["heads"]
    table = t["kv_indices"].view(b, -1).to(t["q"].device)
    lens = t["kv_len"].to(t["q"].device)
    q = t["q"].view(b, q_len, h, -1)
    cache = t["cache"].unsqueeze(2)
    meta, _ = get_mla_metadata()  # (filled by the first call)
    run = lambda: flash_mla_with_kvcache(q, cache, table, lens, case["ckv"], meta,  # noqa: E731
                                         softmax_scale=SM_SCALE, causal=q_len > 1,
                                         use_legacy=True)
    run()
    ms = timing.eager_ms(lambda: [run() for _ in range(10)], iters, calls=10, warmup=1)
    return _rates(case, ms)


def run_case(case: dict, args) -> dict:
    return harness.each_backend(case, args, backends(case, args), bench)


def main(argv=None, prog=None) -> int:
    return harness.main(sys.modules[__name__], argv, prog)


if __name__ == "__main__":
    sys.exit(main())
