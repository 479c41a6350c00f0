"""Attention compositions benchmark: state merging, cascade decode over a shared prefix,
block-sparse attention and POD (prefill + decode in one call), each against what it replaces
(a copy, flat batch decode, dense attention, the prefill and decode wrappers back to back) and
upstream FlashInfer 0.7.2's same wrappers.

    python benchmarks/compositions.py                      # GPU: the table below
    PYTHONPATH=/tmp/anchor:/tmp/site python benchmarks/compositions.py --impl upstream

Every case calls only the upstream-compatible API, so the same file measures upstream when its
package is first on ``PYTHONPATH`` (a separate process). bf16, 32 query / 8 KV heads, head dim
128, pages of 16 unless a case says otherwise. Timing: eager calls back to back between CUDA
events, a group of calls per sample, median of ``--iters`` samples, after one warm-up group.
Rates: ``merge``: TB/s of the bytes read and written (``gpu_ms``: 10 calls replayed from one
CUDA graph, the kernel without the host's cost); ``copy``: the same for a device copy of as
many bytes (the bandwidth a merge should approach); attention: TFLOP/s of the (query, key)
pairs actually visible (4 * D FLOP per pair and head), so a sparse run and its dense baseline
are comparable; decode: TB/s of the KV bytes the flat decode reads; cascade and its flat decode
also ``gpu_ms``: 5 calls of a ``use_cuda_graph=True`` wrapper replayed from one graph.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import torch

import harness
import timing

import flashinfer

FAMILY = "compositions"
IMPLS = ("ours", "upstream")
TIMING = ("eager calls back to back between CUDA events, a group of 10 (5 for the long cases) "
          "per sample, median of the samples after a warm-up group")
HQ, HK, D, PAGE = 32, 8, 128, 16
BF16 = torch.bfloat16
#: ours: POD with this many SMs left to the decode (FLASHINFER_POD_RESERVED_SMS), to set it from
RESERVED_SMS = (16, 32, 48)

# ------------------------------------------------------------------------------ shape table
FULL = ([{"kind": "merge", "rows": 4096, "heads": 32, "dim": 128}]
        + [{"kind": "cascade", "batch": b, "prefix": 32768, "unique": 128} for b in (64, 256)]
        + [{"kind": "pod", "prefill": p, "prefill_len": 4096 if p == 1 else 2048, "batch": 128,
            "kv": 4096 if p == 1 else 2048} for p in (1, 2)]
        + [{"kind": "sparse", "n": 8192, "block": blk, "density": dens}
           for blk in (64, 128) for dens in (0.1, 0.25, 0.5)])
QUICK = [FULL[0], FULL[1], FULL[3], FULL[6]]
TINY = [{"kind": "merge", "rows": 64, "heads": 4, "dim": 32},
        {"kind": "cascade", "batch": 4, "prefix": 64, "unique": 16},
        {"kind": "pod", "prefill": 1, "prefill_len": 32, "batch": 4, "kv": 32},
        {"kind": "sparse", "n": 128, "block": 32, "density": 0.5}]


def _name(c: dict) -> str:
    if c["kind"] == "merge":
        return f"merge_state {c['rows']}x{c['heads']}x{c['dim']}"
    if c["kind"] == "cascade":
        return f"cascade decode B={c['batch']} prefix={c['prefix']} unique={c['unique']}"
    if c["kind"] == "pod":
        return (f"pod {c['prefill']}x{c['prefill_len']} prefill + {c['batch']}x{c['kv']} "
                f"decode")
    return f"block-sparse {c['n']}x{c['n']} block {c['block']} density {c['density']:.2f}"


def cases(args) -> list[dict]:
    table = {"full": FULL, "quick": QUICK, "tiny": TINY}[args.shapes]
    return [{"case": _name(c), **c} for c in table]


def backends(case: dict, args) -> list[str]:
    """What is timed: the composition (``auto``; POD also its single-prefill form) and what it
    replaces; ours adds the kernels it could run on."""
    kind = case["kind"]
    if kind == "merge":
        base = ["auto", "copy"] + (["triton", "reference"] if args.impl == "ours" else [])
    elif kind == "cascade":  # ours: also every level on one batch prefill kernel
        base = ["auto", "flat_decode"] + (["flash_attn:fa3", "cudnn", "triton"]
                                          if args.impl == "ours" else [])
    elif kind == "pod":
        # upstream's BatchAttention hit an illegal memory access at 1 x 4096 + 128 x 4096 on the
        # H200 (compositions_upstream_h200_2026-12-04_0318utc.jsonl) and the error stuck to every
        # later call of the process: it is timed only when asked for (--backends batch_attention)
        base = ["auto", "back_to_back"] + (["batch_attention"] if args.impl == "ours" else []) + (
            ["single_prefill_pod"] if case["prefill"] == 1 else []) + (
            [f"reserve_{n}" for n in RESERVED_SMS] if args.impl == "ours" else [])
    else:  # ours: also each block_sparse_attention record (flex, and the paged mapping's kernels)
        base = ["auto", "dense"] + (["flash_attn:fa3", "cudnn", "cudnn:packed_gqa", "triton",
                                     "torch:flex"] if args.impl == "ours" else [])
    return harness.pick(args, base)


def _ws(device):
    return torch.empty(128 << 20, dtype=torch.uint8, device=device)


def _paged(pages_needed: int, device, seed: int):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(pages_needed, 2, PAGE, HK, D, device=device, generator=g).to(BF16)


def _i32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


# ------------------------------------------------------------------------------ the cases
def _merge(case, backend, iters, device):
    rows, h, d = case["rows"], case["heads"], case["dim"]
    g = torch.Generator(device=device).manual_seed(0)
    va, vb = (torch.randn(rows, h, d, device=device, generator=g).to(BF16) for _ in range(2))
    sa, sb = (torch.randn(rows, h, device=device, generator=g) * 4 for _ in range(2))
    nbytes = 3 * va.numel() * 2 + 3 * sa.numel() * 4  # two states read, one written
    if backend == "copy":
        src = torch.randn(nbytes // 4, device=device, generator=g)
        dst = torch.empty_like(src)
        ms = timing.eager_ms(lambda: [dst.copy_(src) for _ in range(10)], iters, calls=10,
                             warmup=1)
        return {"ms": ms, "tb_per_s": 2 * src.numel() * 4 / ms / 1e9}
    def group():
        for _ in range(10):
            flashinfer.merge_state(va, sa, vb, sb)
    if backend == "auto":
        ms = timing.eager_ms(group, iters, calls=10, warmup=1)
        gpu = timing.graph_ms([()] * 10, lambda _args, _b: flashinfer.merge_state(va, sa, vb, sb),
                              backend, iters) if device == "cuda" else None
    else:  # ours: one kernel forced for the attention family
        with flashinfer.use_backend(attention=backend):
            ms = timing.eager_ms(group, iters, calls=10, warmup=1)
        gpu = None
    entry = {"ms": ms, "tb_per_s": nbytes / ms / 1e9}
    if gpu is not None:  # the kernel alone (one CUDA graph of 10 calls: no host cost)
        entry.update(gpu_ms=gpu, gpu_tb_per_s=nbytes / gpu / 1e9)
    return entry


def _cascade(case, backend, iters, device):
    b, prefix, unique = case["batch"], case["prefix"], case["unique"]
    p_pages, u_pages = prefix // PAGE, -(-unique // PAGE)
    cache = _paged(p_pages + b * u_pages, device, seed=1)
    q = torch.randn(b, HQ, D, device=device, generator=torch.Generator(device=device)
                    .manual_seed(2)).to(BF16)
    shared = torch.arange(p_pages, dtype=torch.int32)
    own = p_pages + torch.arange(b * u_pages, dtype=torch.int32)
    last_u = (unique - 1) % PAGE + 1
    def fixed(t):  # a CUDA-graph wrapper's fixed buffer holding t
        return t.to(device)

    def wrapper(graph: bool):
        if backend == "flat_decode":
            indices = torch.cat([torch.cat([shared, own[i * u_pages:(i + 1) * u_pages]])
                                 for i in range(b)])
            indptr = torch.arange(b + 1, dtype=torch.int32) * (p_pages + u_pages)
            last = torch.full((b,), last_u, dtype=torch.int32)
            bufs = (dict(paged_kv_indptr_buffer=fixed(indptr), paged_kv_indices_buffer=fixed(indices),
                         paged_kv_last_page_len_buffer=fixed(last)) if graph else {})
            w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(device), "NHD", graph,
                                                              use_tensor_cores=True, **bufs)
            w.plan(indptr, indices, last, HQ, HK, D, PAGE, q_data_type=BF16)
            return w
        qo = [_i32([0, b]), torch.arange(b + 1, dtype=torch.int32)]
        kv_indptr = [_i32([0, p_pages]), torch.arange(b + 1, dtype=torch.int32) * u_pages]
        last = [_i32([PAGE]), torch.full((b,), last_u, dtype=torch.int32)]
        bufs = (dict(qo_indptr_buf_arr=[fixed(t) for t in qo],
                     paged_kv_indptr_buf_arr=[fixed(t) for t in kv_indptr],
                     paged_kv_indices_buf_arr=[fixed(shared), fixed(own)],
                     paged_kv_last_page_len_buf_arr=[fixed(t) for t in last]) if graph else {})
        named = {} if backend == "auto" else {"backend": backend}  # (upstream: no backend=)
        w = flashinfer.MultiLevelCascadeAttentionWrapper(2, _ws(device), "NHD", graph,
                                                         **named, **bufs)
        w.plan(qo, kv_indptr, [shared, own], last, HQ, HK, D, PAGE, causal=False,
               q_data_type=BF16)
        return w

    w = wrapper(False)  # auto, or every level on the named kernel
    call = lambda: w.run(q, cache)  # noqa: E731
    graph = None
    if device == "cuda":  # replayed in a CUDA graph, as engines run decode: no host cost
        try:
            gw = wrapper(True)
        except (ValueError, RuntimeError) as err:  # (NoBackendError: no graph-capable kernel)
            print(f"  {backend}: no CUDA-graph form ({str(err)[:120]})")
        else:
            graph = timing.graph_ms([()] * 5, lambda _args, _b: gw.run(q, cache), backend,
                                    iters)
    ms = timing.eager_ms(lambda: [call() for _ in range(5)], iters, calls=5, warmup=1)
    flat_bytes = b * (prefix + unique) * 2 * HK * D * 2
    entry = {"ms": ms, "tb_per_s": flat_bytes / ms / 1e9, **_where_time_goes(call), **_chosen(w)}
    if graph is not None:
        entry["gpu_ms"] = graph  # (the replayed graph: what the GPU takes, no host cost)
    return entry


def _where_time_goes(call) -> dict:
    """On a GPU: the host time of one call (Python and launches), each kernel's GPU time and
    their sum (an eager ms above that sum is host time or, for POD, below it overlap)."""
    if not torch.cuda.is_available():
        return {}
    kernels = timing.kernel_ms(call)
    return {"host_ms": timing.host_ms(call), "kernels_sum_ms": sum(kernels.values()),
            "kernels_ms": {k: round(v, 4) for k, v in kernels.items()}}


def _pod(case, backend, iters, device):
    n_p, len_p, b, kv = case["prefill"], case["prefill_len"], case["batch"], case["kv"]
    pages_p, pages_d = -(-len_p // PAGE), -(-kv // PAGE)
    cache = _paged(n_p * pages_p + b * pages_d, device, seed=3)
    g = torch.Generator(device=device).manual_seed(4)
    q_p = torch.randn(n_p * len_p, HQ, D, device=device, generator=g).to(BF16)
    q_d = torch.randn(b, HQ, D, device=device, generator=g).to(BF16)
    qo_p = torch.arange(n_p + 1, dtype=torch.int32) * len_p
    kv_p = torch.arange(n_p + 1, dtype=torch.int32) * pages_p
    ids_p = torch.arange(n_p * pages_p, dtype=torch.int32)
    last_p = torch.full((n_p,), (len_p - 1) % PAGE + 1, dtype=torch.int32)
    kv_d = torch.arange(b + 1, dtype=torch.int32) * pages_d
    ids_d = n_p * pages_p + torch.arange(b * pages_d, dtype=torch.int32)
    last_d = torch.full((b,), (kv - 1) % PAGE + 1, dtype=torch.int32)
    if backend == "auto" or backend.startswith("reserve_"):  # reserve_N: N SMs left to decode
        w = flashinfer.BatchPODWithPagedKVCacheWrapper(_ws(device), "NHD")
        reserve = backend.removeprefix("reserve_") if backend != "auto" else ""
        with _env("FLASHINFER_POD_RESERVED_SMS", reserve):  # (read by plan)
            w.plan(qo_p, kv_p, ids_p, last_p, torch.arange(b + 1, dtype=torch.int32), kv_d,
                   ids_d, last_d, HQ, HK, D, PAGE, q_data_type=BF16)
        call = lambda: w.run(q_p, cache, q_d, cache, causal_p=True)  # noqa: E731
        extra = lambda: {"chosen": getattr(w, "mode", None)}  # noqa: E731
    elif backend == "single_prefill_pod":  # contiguous k_p / v_p: the prefill's pages in order
        k_p = cache[:pages_p, 0].reshape(-1, HK, D)[:len_p]
        v_p = cache[:pages_p, 1].reshape(-1, HK, D)[:len_p]
        w = flashinfer.PODWithPagedKVCacheWrapper(_ws(device), "NHD")
        w.plan(kv_d, ids_d, last_d, HQ, HK, D, PAGE, q_data_type=BF16)
        call = lambda: w.run(q_p, k_p, v_p, q_d, cache, causal_p=True)  # noqa: E731
        extra = lambda: {}  # noqa: E731
    elif backend == "batch_attention":  # the holistic wrapper over both kinds of request
        w = flashinfer.BatchAttention("NHD", device=device)
        lens = torch.tensor([len_p] * n_p + [kv] * b, dtype=torch.int32)
        w.plan(torch.cat([qo_p, qo_p[-1] + 1 + torch.arange(b, dtype=torch.int32)]),
               torch.cat([kv_p, kv_d[1:] + kv_p[-1]]), torch.cat([ids_p, ids_d]), lens,
               HQ, HK, D, D, PAGE, causal=True, q_data_type=BF16, kv_data_type=BF16)
        q_all = torch.cat([q_p, q_d])
        call = lambda: w.run(q_all, cache)  # noqa: E731
        extra = lambda: {"chosen": getattr(w, "mode", None)}  # noqa: E731
    else:  # back_to_back: the batch prefill and decode wrappers one after the other
        wp = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_ws(device), "NHD")
        wp.plan(qo_p, kv_p, ids_p, last_p, HQ, HK, D, PAGE, causal=True, q_data_type=BF16)
        wd = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_ws(device), "NHD",
                                                           use_tensor_cores=True)
        wd.plan(kv_d, ids_d, last_d, HQ, HK, D, PAGE, q_data_type=BF16)
        call = lambda: (wp.run(q_p, cache), wd.run(q_d, cache))  # noqa: E731
        extra = lambda: {}  # noqa: E731
    call()
    ms = timing.eager_ms(lambda: [call() for _ in range(5)], iters, calls=5, warmup=1)
    return {"ms": ms, **_where_time_goes(call), **extra()}


@contextlib.contextmanager
def _env(name: str, value: str):
    """``os.environ[name] = value`` within the block (nothing when ``value`` is empty)."""
    old = os.environ.get(name)
    if value:
        os.environ[name] = value
    try:
        yield
    finally:
        if value:
            if old is None:
                os.environ.pop(name)
            else:
                os.environ[name] = old


def _sparse(case, backend, iters, device):
    n, blk, density = case["n"], case["block"], case["density"]
    nb = n // blk
    g = torch.Generator(device=device).manual_seed(5)
    q = torch.randn(n, HQ, D, device=device, generator=g).to(BF16)
    k, v = (torch.randn(n, HK, D, device=device, generator=g).to(BF16) for _ in range(2))
    blocks = torch.rand(nb, nb, generator=torch.Generator().manual_seed(6)) < density
    pairs = int(blocks.sum()) * blk * blk
    if backend == "dense":
        call = lambda: flashinfer.single_prefill_with_kv_cache(q, k, v, causal=False)  # noqa: E731
        pairs = n * n
        extra = lambda: {}  # noqa: E731
    else:
        w = flashinfer.BlockSparseAttentionWrapper(_ws(device), backend=backend)
        indptr = torch.cat([torch.zeros(1, dtype=torch.int64), blocks.sum(1).cumsum(0)]).int()
        indices = blocks.nonzero()[:, 1].int()
        w.plan(indptr, indices, n, n, blk, blk, HQ, HK, D, q_data_type=BF16, o_data_type=BF16)
        call = lambda: w.run(q, k, v)  # noqa: E731
        extra = lambda: _chosen(w)  # noqa: E731
    start = time.perf_counter()
    call()  # (flex compiles its kernel here: the first call's time is reported)
    if q.is_cuda:
        torch.cuda.synchronize()
    first_s = time.perf_counter() - start
    ms = timing.eager_ms(lambda: [call() for _ in range(5)], iters, calls=5, warmup=1)
    return {"ms": ms, "tflops": 4 * HQ * D * pairs / ms / 1e9, "first_call_s": round(first_s, 3),
            **extra()}


def _chosen(w) -> dict:
    """Our Decision's kernel name(s) (upstream's wrappers have none)."""
    d = getattr(w, "decision", None)
    if d is not None:
        return {"chosen": d.name}
    levels = getattr(w, "level_decisions", None)
    return {"chosen": "+".join(x.name for x in levels if x is not None)} if levels else {}


RUNNERS = {"merge": _merge, "cascade": _cascade, "pod": _pod, "sparse": _sparse}


def run_case(case: dict, args) -> dict:
    return harness.each_backend(case, args, backends(case, args), RUNNERS[case["kind"]])


def main(argv=None, prog=None) -> int:
    return harness.main(sys.modules[__name__], argv, prog)


if __name__ == "__main__":
    sys.exit(main())
