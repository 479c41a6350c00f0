"""Probe the cuDNN attention adapter on a GPU: do its graphs build, and do they match the oracle?

Run from the repository root on a CUDA machine with nvidia-cudnn-frontend installed::

    timeout 600 python3 benchmarks/probe_cudnn.py

One line per case: status, first call (graph build + run), cached call (median of 5), the
largest absolute error of out (and its relative Frobenius error) and of the base-2 lse against
the oracle — the reference backend when it has the op, else float32 math in this file. Then a
decode sweep over consecutive kv_len values shows what a new shape costs once the first graph
exists (graphs are built per exact shape: one build per kv_len). Exit status 1 if any case fails.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from flashinfer.attention.params import AttentionParams  # noqa: E402
from flashinfer.dispatch import kernel_for  # noqa: E402

# name, op, dtype, layout, qo_len, kv_len, num_qo_heads, num_kv_heads, head_dim, causal, window
CASES = [
    ("prefill mha", "single_prefill", "bf16", "NHD", 512, 512, 16, 16, 128, False, -1),
    ("prefill causal gqa", "single_prefill", "bf16", "NHD", 1000, 3000, 32, 8, 128, True, -1),
    ("prefill causal gqa HND", "single_prefill", "fp16", "HND", 1000, 3000, 32, 8, 128, True, -1),
    ("prefill causal qo>kv", "single_prefill", "bf16", "NHD", 300, 100, 8, 2, 128, True, -1),
    ("prefill causal+window", "single_prefill", "bf16", "NHD", 700, 2048, 32, 8, 128, True, 255),
    ("prefill window only", "single_prefill", "fp16", "NHD", 400, 1000, 8, 8, 64, False, 63),
    ("prefill window qo>kv", "single_prefill", "bf16", "HND", 300, 120, 8, 2, 64, False, 31),
    ("prefill d256 causal", "single_prefill", "bf16", "NHD", 256, 512, 8, 8, 256, True, -1),
    ("prefill mqa d64", "single_prefill", "fp16", "NHD", 333, 777, 16, 1, 64, True, -1),
    ("decode gqa", "single_decode", "bf16", "NHD", 1, 4096, 32, 8, 128, False, -1),
    ("decode gqa HND", "single_decode", "fp16", "HND", 1, 1000, 32, 8, 128, False, -1),
    ("decode window", "single_decode", "bf16", "NHD", 1, 4096, 32, 8, 128, False, 1023),
    ("decode d256", "single_decode", "bf16", "NHD", 1, 2048, 16, 16, 256, False, -1),
    ("decode kv_len 1", "single_decode", "bf16", "NHD", 1, 1, 8, 8, 128, False, -1),
]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def inputs(n, m, hq, hk, d, dtype, layout):
    def make(rows, heads, dim):
        if layout == "HND":
            return torch.randn(heads, rows, dim, dtype=dtype, device="cuda").transpose(0, 1)
        return torch.randn(rows, heads, dim, dtype=dtype, device="cuda")
    return make(n, hq, d), make(m, hk, d), make(m, hk, d)


def local_oracle(q, k, v, params):
    """float32 attention with the contract's masks; lse base 2; rows with no key: 0 / -inf."""
    n, hq, _ = q.shape
    m, hk, _ = k.shape
    kf = k.float().repeat_interleave(hq // hk, dim=1)
    vf = v.float().repeat_interleave(hq // hk, dim=1)
    scores = torch.einsum("nhd,mhd->hnm", q.float(), kf) * params.sm_scale
    r_abs = torch.arange(n, device=q.device)[:, None] + (m - n)
    j = torch.arange(m, device=q.device)[None, :]
    visible = torch.ones(n, m, dtype=torch.bool, device=q.device)
    if params.causal:
        visible &= j <= r_abs
    if params.window_left >= 0:
        visible &= j >= r_abs - params.window_left
    scores = scores.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.nan_to_num(torch.exp(scores - lse[..., None]), nan=0.0)
    return torch.einsum("hnm,mhd->nhd", probs, vf), (lse / math.log(2.0)).t()


def oracle_for(op):
    try:
        return kernel_for("reference", op, "default"), "reference"
    except LookupError:
        return local_oracle, "local fp32"


def timed(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, (time.perf_counter() - start) * 1e3


def lse_error(lse, ref):
    finite = torch.isfinite(ref)
    if not torch.equal(torch.isneginf(lse), torch.isneginf(ref)):
        return math.inf
    return (lse[finite] - ref[finite].float()).abs().max().item() if finite.any() else 0.0


def run_case(case, kernels):
    name, op, dt, layout, n, m, hq, hk, d, causal, window = case
    dtype = DTYPES[dt]
    q, k, v = inputs(n, m, hq, hk, d, dtype, layout)
    params = AttentionParams(sm_scale=d ** -0.5, causal=causal, window_left=window,
                             return_lse=True, o_dtype=dtype)
    kernel = kernels[op]
    (out, lse), first = timed(lambda: kernel(q, k, v, params))
    cached = statistics.median(timed(lambda: kernel(q, k, v, params))[1] for _ in range(5))
    oracle, _ = oracle_for(op)
    ref_out, ref_lse = oracle(q, k, v, params)
    diff = (out.float() - ref_out.float())
    rel = (diff.norm() / ref_out.float().norm().clamp_min(1e-30)).item()
    err_out = diff.abs().max().item()
    err_lse = lse_error(lse, ref_lse)
    ok = not torch.isnan(out).any().item() and rel <= 1e-2 and err_lse <= 2e-2
    return ok, (f"{name:<24} {'ok' if ok else 'FAIL':<4} first {first:9.1f} ms  cached "
                f"{cached:8.3f} ms  max|dout| {err_out:.2e} (rel {rel:.1e})  max|dlse| {err_lse:.2e}")


def sweep(kernels, start=4096, count=8):
    """Decode at consecutive kv_len values: each builds a new graph."""
    q, k, v = inputs(1, start + count, 32, 8, 128, torch.bfloat16, "NHD")
    params = AttentionParams(sm_scale=128 ** -0.5, return_lse=True, o_dtype=torch.bfloat16)
    times = [timed(lambda: kernels["single_decode"](q, k[:n], v[:n], params))[1]
             for n in range(start, start + count)]
    return f"decode sweep kv_len {start}..{start + count - 1}: " + " ".join(f"{t:.1f}" for t in times) + " ms"


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device", flush=True)
        return 1
    from flashinfer.backends.cudnn import graph_cache_state, support

    versions = support.installed_versions()
    backend = support.version_text(versions.backend) if versions and versions.backend else "?"
    major, minor = torch.cuda.get_device_capability()
    print(f"torch {torch.__version__} cuda {torch.version.cuda} | {torch.cuda.get_device_name()} "
          f"SM {major}.{minor} | cudnn-frontend {'.'.join(map(str, versions.frontend))} "
          f"cuDNN {backend} | oracle "
          f"prefill={oracle_for('single_prefill')[1]} decode={oracle_for('single_decode')[1]}",
          flush=True)
    kernels = {op: kernel_for("cudnn", op, "default") for op in ("single_prefill", "single_decode")}
    torch.manual_seed(0)
    passed = 0
    for case in CASES:
        try:
            ok, line = run_case(case, kernels)
        except Exception as exc:  # noqa: BLE001 - report and go on to the next case
            ok, line = False, f"{case[0]:<24} ERROR {type(exc).__name__}: {str(exc)[:400]}"
        passed += ok
        print(line, flush=True)
    swept = True
    try:
        print(sweep(kernels), flush=True)
    except Exception as exc:  # noqa: BLE001 - the sweep is a measurement; report its failure
        swept = False
        print(f"decode sweep ERROR {type(exc).__name__}: {str(exc)[:400]}", flush=True)
    print(f"graph cache: {graph_cache_state()}", flush=True)
    print(f"{passed}/{len(CASES)} cases ok", flush=True)
    return 0 if passed == len(CASES) and swept else 1


if __name__ == "__main__":
    sys.exit(main())
