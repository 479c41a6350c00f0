"""Which (M, N, K) does cuBLASLt's block-wise fp8 recipe (``gemm_fp8_nt_groupwise`` on the torch
backend: 1x128 activation scales, 128x128 weight scales) compute correctly? Relative error of
the torch and triton backends against the float64 reference on random inputs, one line per
case. On the H200 (2026-11-30, cuBLASLt of CUDA 13) K with a number of 128-wide scale blocks
that is not a multiple of 4 (K 256, 384, 640, 768, 896, 1,152) came back wrong without an
error, hence the torch record's ``k`` limit.

    python benchmarks/probe_blockwise_scales.py
"""

from __future__ import annotations

import torch

import flashinfer
from flashinfer.gemm import gemm_fp8_nt_groupwise


def case(m: int, n: int, k: int, gm: int, backend: str) -> str:
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + k)
    a = torch.randn(m, k, generator=gen, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, generator=gen, device="cuda").to(torch.float8_e4m3fn)
    a_scale = torch.rand(-(-m // gm), k // 128, generator=gen, device="cuda") + 0.5
    b_scale = torch.rand(-(-n // 128), k // 128, generator=gen, device="cuda") + 0.5
    args = (a, b, a_scale, b_scale, "K", 1, (gm, 128, 128))
    try:
        with flashinfer.record_decisions() as log:
            out = gemm_fp8_nt_groupwise(*args, backend=backend).double()
    except Exception as exc:  # noqa: BLE001 - a refusal is a finding
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}"
    want = gemm_fp8_nt_groupwise(*args, backend="reference").double()
    rel = ((out - want).norm() / want.norm()).item()
    return f"{'+'.join(d.name for d in log):28s} rel err {rel:.2e} {'ok' if rel < 1e-2 else 'WRONG'}"


CASES = ([(m, 512, k) for k in (256, 384, 512, 640, 768, 896, 1024, 1152, 7168) for m in (1, 16, 64)]
         + [(64, n, k) for n in (96, 144, 200, 576) for k in (512, 7168)])


def main() -> None:
    for m, n, k in CASES:
        for backend in ("torch", "triton"):
            print(f"m={m:<3d} n={n:<4d} k={k:<5d} 1x128 {backend:7s} {case(m, n, k, 1, backend)}",
                  flush=True)


if __name__ == "__main__":
    main()
