"""Attention benchmark: single-request decode and prefill, paged decode, paged and ragged causal
prefill through the batch wrappers, every backend and ``auto``; upstream FlashInfer 0.7.2 side
by side (batch wrappers).

    python benchmarks/attention.py                         # GPU: the tables below
    flashinfer bench attention --shapes quick              # the issue's target points
    PYTHONPATH=/tmp/anchor:/tmp/site python benchmarks/attention.py --impl upstream
    python benchmarks/attention.py --plot ours.jsonl upstream.jsonl   # table and plot of both

The batch cases use only the upstream-compatible wrapper API, so the same file measures upstream
FlashInfer when its package is first on ``PYTHONPATH`` (a separate process: both packages are
named ``flashinfer``; ``bash benchmarks/device.sh upstream attention`` runs both). Timing:
single-request calls as every runner (``timing.py``: CUDA-graph and eager time over inputs
rotated past the L2); batch ``run()`` back to back between CUDA events (10 calls per decode
group, 3 per prefill group), median of ``--iters`` groups, decode also ``graph_ms`` (a
``use_cuda_graph`` wrapper's ``run()`` captured once and replayed); ``plan()`` host time, median
of 30 (``plan_ms``: page ids on the device, as an engine keeps them; decode also
``plan_host_indices_ms`` with every index array on the host); ``first_plan_run_s``: the first
plan + run of that wrapper (JIT builds included for upstream). Decode reports KV bytes read per
second (ceiling 4.1 TB/s); prefill TFLOP/s of the visible (causal) query-key pairs (774 bf16).
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict

import torch

import harness
import timing

import flashinfer

FAMILY = "attention"
IMPLS = ("ours", "upstream")
TIMING = ("single: " + timing.METHOD + "; batch: eager back-to-back run() between CUDA events, "
          "median of the iterations; decode graph_ms = a use_cuda_graph wrapper's run() "
          "captured once and replayed; plan() host time median of 30 after 3 warm-up calls")

# ------------------------------------------------------------------------------ shape table
HEADS = {"hq": 32, "hkv": 8, "d": 128, "page": 16}  # Llama-3.1-8B/70B-like GQA, bf16
TINY_HEADS = {"hq": 4, "hkv": 2, "d": 64, "page": 16}
#: single_decode_with_kv_cache: (kv length, kv layout)
SINGLE_DECODE = [(4096, "NHD"), (32768, "NHD"), (32768, "HND")]
#: single_prefill_with_kv_cache, causal: (query length, kv length, kv heads)
SINGLE_PREFILL = [(1024, 1024, 8), (4096, 4096, 8), (8192, 8192, 32), (256, 4096, 8)]
#: paged decode: (batch, kv length each), bf16 KV; DECODE_FP8 the same with fp8 e4m3 KV
DECODE = [(b, kv) for b in (1, 16, 64, 256) for kv in (512, 4096, 16384)]
DECODE_FP8 = [(16, 4096), (64, 4096)]
#: paged and ragged causal prefill: (requests, tokens each), query length = kv length
PREFILL = [(1, 16384), (4, 4096), (32, 1024)]
#: the same with ALiBi (paged and ragged): (requests, tokens each)
PREFILL_ALIBI = [(4, 1024)]
QUICK = {"single_decode": [(32768, "NHD")], "single_prefill": [(4096, 4096, 8)],
         "decode": [(64, 4096)], "decode_fp8": [], "prefill": [(4, 4096)]}
TINY = {"single_decode": [(64, "NHD")], "single_prefill": [(16, 32, 2)],
        "decode": [(2, 40)], "decode_fp8": [], "prefill": [(2, 24)], "prefill_alibi": [(2, 24)]}

#: the batch backends timed: ours, and upstream's (``tensor_cores``: its decode wrapper with
#: use_tensor_cores=True, what vLLM passes, 0.26 against 0.40 ms at B=64 kv 4096 on the H200)
OURS = {"decode": ["auto", "cudnn", "triton"], "paged": ["auto", "fa3", "cudnn", "triton"],
        "ragged": ["auto", "fa3", "cudnn", "torch:flash_varlen", "triton"]}
#: ALiBi prefill, which no vendor kernel serves: our Triton kernel against the reference
OURS_ALIBI = ["auto", "triton", "reference"]
UPSTREAM = {"decode": ["auto", "tensor_cores"], "paged": ["fa2", "fa3"], "ragged": ["fa2", "fa3"]}
SINGLE_OP = {"single_decode": "single_decode", "single_prefill": "single_prefill"}


def cases(args) -> list[dict]:
    """The shape tables of ``args.shapes``: single-request cases (ours only), then decode, paged
    and ragged prefill."""
    full = {"single_decode": SINGLE_DECODE, "single_prefill": SINGLE_PREFILL, "decode": DECODE,
            "decode_fp8": DECODE_FP8, "prefill": PREFILL, "prefill_alibi": PREFILL_ALIBI}
    table = {"full": full, "quick": QUICK, "tiny": TINY}[args.shapes]
    heads = TINY_HEADS if args.shapes == "tiny" else HEADS
    out = []
    if args.impl == "ours":  # upstream: the batch wrappers only
        out += [{"case": f"single_decode kv{kv} hq{heads['hq']} hkv{heads['hkv']} d{heads['d']} {layout}",
                 "kind": "single_decode", "kv": kv, "layout": layout, **heads}
                for kv, layout in table["single_decode"]]
        out += [{"case": f"single_prefill causal {qo}/{kv} hq{heads['hq']} hkv{hkv} d{heads['d']}",
                 "kind": "single_prefill", "qo": qo, "kv": kv, **heads, "hkv": hkv}
                for qo, kv, hkv in table["single_prefill"]]
    for dtype, grid in (("bfloat16", table["decode"]), ("float8_e4m3fn", table["decode_fp8"])):
        out += [{"case": f"decode B={b} kv={kv} {dtype}", "kind": "decode", "batch": b, "kv": kv,
                 "kv_dtype": dtype, **heads} for b, kv in grid]
    out += [{"case": f"{kind} causal {r}x{t}", "kind": kind, "batch": r, "kv": t, **heads}
            for kind in ("paged", "ragged") for r, t in table["prefill"]]
    out += [{"case": f"{kind} causal alibi {r}x{t}", "kind": kind, "batch": r, "kv": t,
             "alibi": True, **heads}
            for kind in ("paged", "ragged") for r, t in table.get("prefill_alibi", [])]
    return out


def backends(case: dict, args) -> list[str]:
    """Single-request: auto and every declared kernel; batch: the OURS / UPSTREAM lists of its
    kind (CPU: auto and the reference)."""
    if args.device == "cpu":
        return harness.pick(args, ["auto", "reference"])
    if case["kind"] in SINGLE_OP:
        return harness.pick(args, ["auto"] + harness.declared_kernels(SINGLE_OP[case["kind"]]))
    if case.get("alibi"):
        return harness.pick(args, OURS_ALIBI if args.impl != "upstream" else [])
    return harness.pick(args, (UPSTREAM if args.impl == "upstream" else OURS)[case["kind"]])


# ------------------------------------------------------------------------------ single request
def single_inputs(case: dict, device: str) -> tuple[list, object, int, int]:
    """(rotated argument sets, call(args, backend), bytes moved, flops) of a single-request case."""
    hq, hkv, d = case["hq"], case["hkv"], case["d"]
    randn = lambda *s: torch.randn(*s, device=device, dtype=torch.bfloat16)  # noqa: E731
    if case["kind"] == "single_decode":
        shape = (case["kv"], hkv, d) if case["layout"] == "NHD" else (hkv, case["kv"], d)
        nbytes = 2 * 2 * case["kv"] * hkv * d + 2 * 2 * hq * d
        sets = [(randn(hq, d), randn(*shape), randn(*shape))
                for _ in range(timing.copies(nbytes, device))]
        return sets, lambda a, b: flashinfer.single_decode_with_kv_cache(
            *a, kv_layout=case["layout"], backend=b), nbytes, 4 * hq * case["kv"] * d
    qo, kv = case["qo"], case["kv"]
    nbytes = 2 * 2 * qo * hq * d + 2 * 2 * kv * hkv * d
    sets = [(randn(qo, hq, d), randn(kv, hkv, d), randn(kv, hkv, d))
            for _ in range(timing.copies(nbytes, device))]
    pairs = qo * kv - qo * (qo - 1) // 2  # visible (query, key) pairs, bottom-right causal
    return sets, lambda a, b: flashinfer.single_prefill_with_kv_cache(
        *a, causal=True, backend=b), nbytes, 4 * hq * d * pairs


# ------------------------------------------------------------------------------ batch wrappers
def _workspace(device: str) -> torch.Tensor:
    return torch.empty((256 if device == "cuda" else 8) * 2**20, dtype=torch.uint8, device=device)


def _paged(case: dict, kv_dtype: torch.dtype, device: str) -> tuple:
    """A paged KV cache of ``batch`` requests of ``kv`` tokens each, pages in random order."""
    batch, kv, page, hkv, d = case["batch"], case["kv"], case["page"], case["hkv"], case["d"]
    pages_per = -(-kv // page)
    total = batch * pages_per
    cache = torch.randn(total, 2, page, hkv, d, device=device, dtype=torch.bfloat16).to(kv_dtype)
    indices = torch.randperm(total, device=device, dtype=torch.int64).to(torch.int32)
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages_per
    last = torch.full((batch,), kv - (pages_per - 1) * page, dtype=torch.int32)
    return cache, indices, indptr, last


def _wrapper_kwargs(backend: str) -> dict:
    """Constructor arguments of a backend label (``tensor_cores``: upstream's tensor-core decode)."""
    return {"use_tensor_cores": True} if backend == "tensor_cores" else {"backend": backend}


def bench_decode(case: dict, backend: str, iters: int, device: str) -> dict:
    """One backend's paged decode: first plan + run, eager ``run()`` time and KV TB/s, ``plan()``
    host time (device and host page ids), and on a GPU the CUDA-graph time of ``run()``."""
    kv_dtype = getattr(torch, case["kv_dtype"])
    hq, hkv, d, page = case["hq"], case["hkv"], case["d"], case["page"]
    cache, indices, indptr, last = _paged(case, kv_dtype, device)
    q = torch.randn(case["batch"], hq, d, device=device, dtype=torch.bfloat16)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_workspace(device), "NHD",
                                                      **_wrapper_kwargs(backend))

    def plan(ids=indices):
        w.plan(indptr, ids, last, hq, hkv, d, page, q_data_type=torch.bfloat16,
               kv_data_type=kv_dtype)
    t0 = time.perf_counter()
    plan()
    w.run(q, cache)
    if device == "cuda":
        torch.cuda.synchronize()
    first = time.perf_counter() - t0
    scale = {} if kv_dtype == torch.bfloat16 else {"k_scale": 0.5, "v_scale": 0.5}
    ms = timing.eager_ms(lambda: [w.run(q, cache, **scale) for _ in range(10)], iters, calls=10,
                         warmup=1)
    kv_bytes = 2 * case["batch"] * case["kv"] * hkv * d * cache.element_size()
    entry = {"ms": ms, "tb_per_s": kv_bytes / ms / 1e9, "plan_ms": timing.host_ms(plan),
             "first_plan_run_s": first, "chosen": getattr(getattr(w, "decision", None), "name", None)}
    if device != "cuda":
        return entry
    entry["plan_host_indices_ms"] = timing.host_ms(lambda: plan(indices.cpu()))
    try:  # GPU time alone: a use_cuda_graph wrapper's run() captured once, replayed
        graph = _decode_graph_ms(case, cache, indices, indptr, last, q, kv_dtype, backend, scale,
                                 iters)
        entry.update(graph_ms=graph, graph_tb_per_s=kv_bytes / graph / 1e9)
    except Exception as exc:  # noqa: BLE001 - recorded, the eager figure stands
        entry["graph_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return entry


def _decode_graph_ms(case, cache, indices, indptr, last, q, kv_dtype, backend, scale, iters):
    """Per-call ms of a ``use_cuda_graph`` decode wrapper's ``run()`` captured once, replayed."""
    hq, hkv, d, page = case["hq"], case["hkv"], case["d"], case["page"]
    bufs = dict(paged_kv_indptr_buffer=indptr.to("cuda"), paged_kv_indices_buffer=indices.clone(),
                paged_kv_last_page_len_buffer=last.to("cuda"))
    kwargs = {} if backend == "auto" else _wrapper_kwargs(backend)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_workspace("cuda"), "NHD", use_cuda_graph=True,
                                                      **bufs, **kwargs)
    w.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=torch.bfloat16,
           kv_data_type=kv_dtype)
    out = torch.empty(case["batch"], hq, d, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            w.run(q, cache, out=out, **scale)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, cache, out=out, **scale)
    return timing.eager_ms(lambda: [graph.replay() for _ in range(10)], iters, calls=10, warmup=3)


def bench_prefill(case: dict, backend: str, iters: int, device: str) -> dict:
    """One backend's paged or ragged causal prefill: first plan + run, eager ``run()`` time and
    TFLOP/s, ``plan()`` host time."""
    requests, tokens, hq, hkv, d = case["batch"], case["kv"], case["hq"], case["hkv"], case["d"]
    total = requests * tokens
    mode = "ALIBI" if case.get("alibi") else "NONE"
    q = torch.randn(total, hq, d, device=device, dtype=torch.bfloat16)
    qo_indptr = torch.arange(requests + 1, dtype=torch.int32) * tokens
    if case["kind"] == "paged":
        cache, indices, kv_indptr, last = _paged(case, torch.bfloat16, device)
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_workspace(device), "NHD", backend=backend)

        def plan():
            w.plan(qo_indptr, kv_indptr, indices, last, hq, hkv, d, case["page"], causal=True,
                   q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
                   pos_encoding_mode=mode)
        run = lambda: w.run(q, cache)  # noqa: E731
    else:
        k = torch.randn(total, hkv, d, device=device, dtype=torch.bfloat16)
        v = torch.randn(total, hkv, d, device=device, dtype=torch.bfloat16)
        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_workspace(device), "NHD", backend=backend)

        def plan():
            w.plan(qo_indptr, qo_indptr, hq, hkv, d, causal=True, q_data_type=torch.bfloat16,
                   pos_encoding_mode=mode)
        run = lambda: w.run(q, k, v)  # noqa: E731
    t0 = time.perf_counter()
    plan()
    run()
    if device == "cuda":
        torch.cuda.synchronize()
    first = time.perf_counter() - t0
    ms = timing.eager_ms(lambda: [run() for _ in range(3)], iters, calls=3, warmup=1)
    flops = 4 * hq * d * requests * (tokens * (tokens + 1) // 2)
    return {"ms": ms, "tflops": flops / ms / 1e9, "plan_ms": timing.host_ms(plan),
            "first_plan_run_s": first, "chosen": getattr(getattr(w, "decision", None), "name", None)}


def prepare(args) -> dict:
    """A first decode kept apart: the first case's first backend otherwise reads up to 20 % slow
    (the GPU clock and the host's caches still cold; eager decode at batch 1 is launch-bound);
    its first plan + run is the fresh process's, JIT included for upstream."""
    if args.device != "cuda":
        return {}
    case = {"batch": 1, "kv": 512, "kv_dtype": "bfloat16", **HEADS}
    return {"process_warmup": {"case": "decode B=1 kv=512 bfloat16", "backend": "auto",
                               **bench_decode(case, "auto", 2, "cuda")}}


def run_case(case: dict, args) -> dict:
    """Every backend of one case: single-request calls as every runner, batch wrappers by
    bench_decode / bench_prefill."""
    names = backends(case, args)
    if case["kind"] in SINGLE_OP:
        sets, call, nbytes, flops = single_inputs(case, args.device)
        rate = {"flops": flops} if case["kind"] == "single_prefill" else {"nbytes": nbytes}
        return {"bytes": nbytes, "flops": flops,
                "backends": harness.time_backends(sets, call, names, args.iters, **rate)}
    bench = bench_decode if case["kind"] == "decode" else bench_prefill
    out = {}
    for backend in names:
        try:
            out[backend] = bench(case, backend, args.iters, args.device)
        except Exception as exc:  # noqa: BLE001 - a backend that cannot run a case is a finding
            out[backend] = harness.error_entry(exc)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return {"backends": out}


# ------------------------------------------------------------------------------ summary, plot
def _rate(entry: dict) -> float | None:
    return entry.get("tb_per_s", entry.get("tflops"))


def summary(runs) -> str:
    """Per case: auto's rate and kernel, our best single backend, upstream's best, the ratios
    the targets use; then decode's CUDA-graph rates against upstream's."""
    table, order = harness.merged(runs)
    lines = [f"{'case':44s} {'auto':>9s} {'chosen':>22s} {'best ours':>24s} {'upstream':>20s} "
             f"{'auto/best':>9s} {'auto/up':>8s}"]
    for case in order:
        row = {k: v for k, v in table[case].items() if "ms" in v}
        auto = row.get("auto")
        ours = {k: v for k, v in row.items() if not k.startswith("upstream:") and k != "auto"}
        up = {k: v for k, v in row.items() if k.startswith("upstream:")}
        if auto is None and not up:
            continue
        best = max(ours, key=lambda k: _rate(ours[k])) if ours else None
        up_best = max(up, key=lambda k: _rate(up[k])) if up else None
        auto_rate = _rate(auto) if auto else None
        ratio = lambda other: f"{auto_rate / _rate(other):.2f}" if auto_rate and other else "-"  # noqa: E731
        lines.append(
            f"{case:44s} {(f'{auto_rate:.2f}' if auto_rate else '-'):>9s} "
            f"{str((auto or {}).get('chosen'))[:22]:>22s} "
            f"{(f'{best} {_rate(ours[best]):.2f}' if best else '-'):>24s} "
            f"{(f'{up_best[9:]} {_rate(up[up_best]):.2f}' if up_best else '-'):>20s} "
            f"{ratio(ours.get(best)):>9s} {ratio(up.get(up_best)):>8s}")
    lines.append(f"\n{'decode, CUDA-graph replay (GPU time)':44s} {'auto TB/s':>10s} "
                 f"{'upstream':>10s} {'auto/up':>8s}")
    for case in order:
        auto, up = table[case].get("auto", {}), table[case].get("upstream:auto", {})
        if "graph_tb_per_s" in auto:
            ours, u = auto["graph_tb_per_s"], up.get("graph_tb_per_s")
            lines.append(f"{case:44s} {ours:10.2f} {(f'{u:.2f}' if u else '-'):>10s} "
                         f"{(f'{ours / u:.2f}' if u else '-'):>8s}")
    return "\n".join(lines)


def plot(runs):
    """Decode TB/s against batch, a panel per KV length (bf16; ``auto`` bold, upstream dashed);
    causal prefill TFLOP/s per case and backend; single-request time per case and backend."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    table, order = harness.merged(runs)
    rows = {r["case"]: r for _, records in runs for r in records}
    decode = [c for c in order if rows[c]["kind"] == "decode" and rows[c]["kv_dtype"] == "bfloat16"]
    prefill = [c for c in order if rows[c]["kind"] in ("paged", "ragged")]
    single = [c for c in order if rows[c]["kind"] in SINGLE_OP]
    kvs = sorted({rows[c]["kv"] for c in decode})
    panels = len(kvs) + bool(prefill) + bool(single)
    fig, axes = plt.subplots(1, max(panels, 1), figsize=(5 * max(panels, 1), 4.2), squeeze=False)
    axes = list(axes[0])
    for kv in kvs:
        ax = axes.pop(0)
        series = defaultdict(list)
        for c in decode:
            if rows[c]["kv"] == kv:
                for label, entry in table[c].items():
                    if "ms" in entry:
                        series[label].append((rows[c]["batch"], entry["tb_per_s"]))
        for label, pts in sorted(series.items()):
            pts.sort()
            style = dict(lw=2.5) if label == "auto" else dict(ls="--") if label.startswith("up") else {}
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label, **style)
        ax.set_xscale("log", base=2)
        ax.set(title=f"paged decode, kv {kv}, bf16", xlabel="batch", ylabel="TB/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for group, metric, unit in ((prefill, "tflops", "TFLOP/s"), (single, "ms", "ms (log)")):
        if not group:
            continue
        ax = axes.pop(0)
        labels = sorted({k for c in group for k, e in table[c].items() if "ms" in e})
        width = 0.8 / max(1, len(labels))
        for i, label in enumerate(labels):
            pts = [(j, table[c][label][metric]) for j, c in enumerate(group)
                   if "ms" in table[c].get(label, {})]
            ax.bar([j + i * width for j, _ in pts], [y for _, y in pts], width, label=label)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(group))])
        ax.set_xticklabels([c.replace(" causal", "\n").replace(" hq", "\nhq") for c in group],
                           fontsize=6)
        if metric == "ms":
            ax.set_yscale("log")
        ax.set(ylabel=unit, title="causal prefill, bf16" if metric == "tflops" else "single request")
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def main(argv=None, prog=None) -> int:
    return harness.main(sys.modules[__name__], argv, prog)


if __name__ == "__main__":
    sys.exit(main())
