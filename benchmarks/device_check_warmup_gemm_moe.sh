#!/usr/bin/env bash
# The GEMM and MoE warm-up on the GPU (carry .whl: the cuDNN frontend): the Triton fp8 GEMM GPU
# tests (their kernels no longer specialise on M), `flashinfer warmup` of the GEMMs and of the
# DeepSeek-V3 MoE layer, then first calls in a fresh process (which should now find every kernel).
source benchmarks/device_env.sh
source benchmarks/device_lib.sh
GPU_TESTS_TIMEOUT=120 gpu_tests -m gpu tests/test_triton_gemm.py
echo "== warmup"; timeout 150 python3 -m flashinfer warmup --only bmm_fp8,groupwise --moe 256,8,7168,2048 2>&1 | tail -9
echo "== first calls, fresh process"
(cd benchmarks && timeout 120 python3 - <<'PY'
import time
started = time.perf_counter()
import torch, flashinfer
print(f"imports {time.perf_counter() - started:.2f} s")
for m in (1, 7, 300):  # M = 1 and M not a multiple of 16: one compile per tile height now
    A = torch.randn(128, m, 128, device="cuda").to(torch.float8_e4m3fn)
    B = torch.randn(128, 512, 128, device="cuda").to(torch.float8_e4m3fn).transpose(1, 2)
    one = torch.ones(1, device="cuda")
    t = time.perf_counter()
    flashinfer.bmm_fp8(A, B, one, one, torch.bfloat16)
    torch.cuda.synchronize()
    print(f"first bmm_fp8 call M={m}: {time.perf_counter() - t:.2f} s")
PY
)
(cd benchmarks && timeout 120 python3 first_call_moe.py --tokens 16 1024)
