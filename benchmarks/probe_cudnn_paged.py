"""Probe of the cuDNN batch attention planners on one GPU (run by hand on the H200).

    PYTHONUNBUFFERED=1 timeout 900 python benchmarks/probe_cudnn_paged.py [--iters 50]

Every step prints its own wall time; every graph build is timed (the first run of a new bucket).
Steps: paged decode B=64 x kv 4096 (32/8 heads, d128, page 16, bf16; HND and NHD) correctness
vs float32 torch and KV-read bandwidth (target >= 3.9 TB/s); a second batch composition in the
same bucket (no rebuild, plan time); padded batches (B=3 prefill: padded requests with
seq_len_q 0; decode B=50); CUDA-graph capture + replay; paged and ragged causal prefill 4 x 4096
TFLOP/s (target >= 530 paged). A failing step prints its error and the probe goes on.
"""

from __future__ import annotations

import argparse
import math
import time
import traceback

import torch

from flashinfer.backends import cudnn as adapter
from flashinfer.dispatch import kernel_for
from flashinfer.attention.batch_params import BatchPlan, KVInput, RunScales

DEV = torch.device("cuda")
DT = torch.bfloat16
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:8.2f}s] {msg}", flush=True)


def step(name):
    def wrap(fn):
        def run(*args, **kwargs):
            log(f"--- {name}")
            start = time.perf_counter()
            try:
                result = fn(*args, **kwargs)
                log(f"--- {name}: done in {time.perf_counter() - start:.3f} s")
                return result
            except Exception:  # noqa: BLE001 - a probe reports and goes on
                traceback.print_exc()
                log(f"--- {name}: FAILED after {time.perf_counter() - start:.3f} s")
                return None
        return run
    return wrap


def make_plan(op, qo_lens, kv_lens, *, page=16, heads=(32, 8), dim=128, causal=False,
              layout="HND", cuda_graph=False, pool=None, fixed=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    qo = torch.tensor([0] + list(qo_lens)).cumsum(0).to(torch.int32)
    lens = torch.tensor(kv_lens, dtype=torch.int32)
    if op == "batch_prefill_ragged":
        kv_indptr, indices, last = torch.tensor([0] + list(kv_lens)).cumsum(0).to(torch.int32), None, None
    else:
        counts = [-(-n // page) for n in kv_lens]
        kv_indptr = torch.tensor([0] + counts).cumsum(0).to(torch.int32)
        pool = pool or int(kv_indptr[-1])
        indices = torch.randperm(pool, generator=g)[:int(kv_indptr[-1])].to(torch.int32)
        last = torch.tensor([(n - 1) % page + 1 for n in kv_lens], dtype=torch.int32)

    def dev(name, t):
        if t is None:
            return None
        if fixed is None:
            return t.to(DEV)
        fixed[name][:t.numel()].copy_(t)
        return fixed[name][:t.numel()]

    return BatchPlan(
        op=op, device=DEV, batch_size=len(kv_lens), num_qo_heads=heads[0], num_kv_heads=heads[1],
        head_dim_qk=dim, head_dim_vo=dim, page_size=0 if indices is None else page,
        kv_layout=layout, q_dtype=DT, kv_dtype=DT, o_dtype=DT, causal=causal, window_left=-1,
        logits_soft_cap=0.0, sm_scale=1 / math.sqrt(dim),
        q_len_per_req=1 if op == "batch_decode" else 0, qo_indptr_host=qo,
        kv_indptr_host=kv_indptr, kv_lens_host=lens, kv_last_page_len_host=last,
        qo_indptr=dev("qo", qo), kv_indptr=dev("kvp", kv_indptr), kv_indices=dev("idx", indices),
        kv_lens=dev("lens", lens), kv_last_page_len=dev("last", last), total_qo=int(qo[-1]),
        max_qo_len=max(qo_lens), max_kv_len=max(kv_lens), cuda_graph=cuda_graph)


def inputs(plan, pool):
    torch.manual_seed(0)
    q = torch.randn(plan.total_qo, plan.num_qo_heads, plan.head_dim_qk, device=DEV, dtype=DT)
    h, d = plan.num_kv_heads, plan.head_dim_qk
    if plan.op == "batch_prefill_ragged":
        n = int(plan.kv_indptr_host[-1])
        return q, KVInput(torch.randn(n, h, d, device=DEV, dtype=DT), torch.randn(n, h, d, device=DEV, dtype=DT))
    p = plan.page_size
    shape = (pool, 2, p, h, d) if plan.kv_layout == "NHD" else (pool, 2, h, p, d)
    cache = torch.randn(shape, device=DEV, dtype=DT)
    return q, KVInput(cache[:, 0], cache[:, 1])


def oracle(plan, q, kv):
    """float32 per-request attention on the GPU, bottom-right causal; lse base 2."""
    out = torch.zeros(q.shape[0], plan.num_qo_heads, plan.head_dim_vo, device=DEV)
    lse = torch.full((q.shape[0], plan.num_qo_heads), -math.inf, device=DEV)
    group = plan.num_qo_heads // plan.num_kv_heads
    for b in range(plan.batch_size):
        lo, hi = int(plan.qo_indptr_host[b]), int(plan.qo_indptr_host[b + 1])
        m = int(plan.kv_lens_host[b])
        if plan.op == "batch_prefill_ragged":
            s0 = int(plan.kv_indptr_host[b])
            k, v = kv.k[s0:s0 + m], kv.v[s0:s0 + m]
        else:
            pages = plan.kv_indices[int(plan.kv_indptr_host[b]):int(plan.kv_indptr_host[b + 1])].long()
            k, v = kv.k[pages], kv.v[pages]
            if plan.kv_layout == "HND":
                k, v = k.transpose(1, 2), v.transpose(1, 2)
            k, v = k.flatten(0, 1)[:m], v.flatten(0, 1)[:m]
        k, v = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
        n = hi - lo
        s = torch.einsum("qhd,khd->hqk", q[lo:hi].float(), k) * plan.sm_scale
        if plan.causal:
            keep = torch.arange(m, device=DEV)[None] <= torch.arange(n, device=DEV)[:, None] + m - n
            s = s.masked_fill(~keep, -math.inf)
        r = torch.logsumexp(s, -1)
        out[lo:hi] = torch.einsum("hqk,khd->qhd", torch.exp(s - r[..., None]).nan_to_num(0), v)
        lse[lo:hi] = (r / math.log(2)).t()
    return out, lse


def planner(op):
    return kernel_for("cudnn", op, "default")


def run_once(plan, q, kv):
    t = time.perf_counter()
    runner = planner(plan.op)(plan)
    torch.cuda.synchronize()
    t_plan = time.perf_counter() - t
    out = torch.full((q.shape[0], plan.num_qo_heads, plan.head_dim_vo), math.nan, device=DEV, dtype=DT)
    lse = torch.full((q.shape[0], plan.num_qo_heads), math.nan, device=DEV)
    misses = adapter.batch_graph_cache_state().get("misses", 0)
    t = time.perf_counter()
    runner(q, kv, out, lse, RunScales())
    torch.cuda.synchronize()
    t_run = time.perf_counter() - t
    built = adapter.batch_graph_cache_state()["misses"] - misses
    log(f"plan {t_plan * 1e3:.3f} ms; first run {t_run * 1e3:.1f} ms "
        f"({'with ' + str(built) + ' graph build(s)' if built else 'no build'})")
    return runner, out, lse


def check(plan, q, kv, out, lse):
    ref_out, ref_lse = oracle(plan, q, kv)
    err = ((out.float() - ref_out).norm() / ref_out.norm().clamp_min(1e-12)).item()
    finite = torch.isfinite(ref_lse)
    lse_err = (lse - ref_lse)[finite].abs().max().item() if finite.any() else 0.0
    nan = torch.isnan(out).any().item() or torch.isnan(lse).any().item()
    log(f"correctness: rel err out {err:.2e}, max abs err lse {lse_err:.2e}, NaN {nan} -> "
        f"{'OK' if err < 2e-2 and lse_err < 5e-2 and not nan else 'WRONG'}")


def bench(runner, q, kv, out, lse, iters):
    for _ in range(3):
        runner(q, kv, out, lse, RunScales())
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        runner(q, kv, out, lse, RunScales())
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e-3  # seconds


@step("decode B=64 kv=4096 32/8 d128 page 16 bf16")
def decode(layout, iters):
    b, n = 64, 4096
    plan = make_plan("batch_decode", [1] * b, [n] * b, layout=layout)
    q, kv = inputs(plan, b * n // 16)
    runner, out, lse = run_once(plan, q, kv)
    check(plan, q, kv, out, lse)
    for with_lse in (True, False):
        sec = bench(runner, q, kv, out, lse if with_lse else None, iters)
        kv_bytes = 2 * b * n * plan.num_kv_heads * plan.head_dim_qk * 2
        log(f"{layout} lse={with_lse}: {sec * 1e6:.1f} us, KV read {kv_bytes / sec / 1e12:.2f} TB/s "
            f"(target >= 3.9)")
    # a new composition in the same bucket: no rebuild
    plan2 = make_plan("batch_decode", [1] * 40, [3000 + 17 * i for i in range(40)], layout=layout,
                      pool=b * n // 16, seed=1)
    runner2, out2, lse2 = run_once(plan2, q[:40], kv)
    check(plan2, q[:40], kv, out2, lse2)
    t = time.perf_counter()
    for _ in range(20):
        planner("batch_decode")(plan2)
    log(f"plan() of a composition in a built bucket: {(time.perf_counter() - t) / 20 * 1e3:.3f} ms "
        f"(host; target <= 0.25 ms at batch 64)")


@step("padded prefill: B=3 (one padded request with seq_len_q 0), causal, ragged lengths")
def padded_prefill():
    plan = make_plan("batch_prefill_paged", [100, 1, 37], [300, 16, 37], causal=True, layout="NHD")
    q, kv = inputs(plan, 40)
    _, out, lse = run_once(plan, q, kv)
    check(plan, q, kv, out, lse)


@step("CUDA graph: decode B=8 capture once, re-plan twice, replay")
def cuda_graph():
    fixed = {name: torch.zeros(n, dtype=torch.int32, device=DEV) for name, n in (
        ("qo", 9), ("kvp", 9), ("idx", 1024), ("lens", 8), ("last", 8))}
    plan = make_plan("batch_decode", [1] * 8, [100 * (i + 1) for i in range(8)], cuda_graph=True,
                     pool=1024, fixed=fixed)
    q, kv = inputs(plan, 1024)
    runner, out, lse = run_once(plan, q, kv)
    graph = torch.cuda.CUDAGraph()
    t = time.perf_counter()
    with torch.cuda.graph(graph):
        runner(q, kv, out, lse, RunScales())
    log(f"capture {1e3 * (time.perf_counter() - t):.1f} ms")
    for seed in (1, 2):
        plan = make_plan("batch_decode", [1] * 8, [37 * seed + 200 * i + 1 for i in range(8)],
                         cuda_graph=True, pool=1024, fixed=fixed, seed=seed)
        planner("batch_decode")(plan)
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        check(plan, q, kv, out, lse)


@step("causal prefill 4 x 4096, 32/8 heads, d128, bf16")
def prefill(op, layout, iters):
    b, n = 4, 4096
    plan = make_plan(op, [n] * b, [n] * b, causal=True, layout=layout)
    q, kv = inputs(plan, b * n // 16)
    runner, out, lse = run_once(plan, q, kv)
    check(plan, q, kv, out, lse)
    sec = bench(runner, q, kv, out, None, iters)
    flops = 4 * b * plan.num_qo_heads * plan.head_dim_qk * n * n / 2
    log(f"{op} {layout}: {sec * 1e3:.3f} ms, {flops / sec / 1e12:.0f} TFLOP/s "
        f"(target >= {530 if op == 'batch_prefill_paged' else 560})")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    import cudnn

    log(f"torch {torch.__version__}, cudnn-frontend {cudnn.__version__}, cuDNN "
        f"{cudnn.backend_version()}, {torch.cuda.get_device_name()}")
    decode("HND", args.iters)
    decode("NHD", args.iters)
    padded_prefill()
    cuda_graph()
    prefill("batch_prefill_paged", "HND", args.iters)
    prefill("batch_prefill_paged", "NHD", args.iters)
    prefill("batch_prefill_ragged", "NHD", args.iters)
    log(f"graph cache: {adapter.batch_graph_cache_state()}")


if __name__ == "__main__":
    main()
