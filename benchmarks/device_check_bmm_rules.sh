#!/usr/bin/env bash
# bmm_fp8's batched rules on the GPU (carry .whl: the cuDNN frontend; CUTLASS not needed): the
# quick bmm_fp8 grid at DeepSeek-V3's MLA shapes with `auto`, and the first batched call in a
# fresh process (Triton compiles its kernel there: no warm-up covers the GEMMs yet), and the
# first call of the DeepSeek-V3 MoE layer in a fresh process (its Triton kernels compile there).
source benchmarks/device_env.sh
echo "== first batched bmm_fp8 call, fresh process"
timeout 120 python3 - <<'PY'
import time
started = time.perf_counter()
import torch, flashinfer
A = torch.randn(128, 16, 128, device="cuda").to(torch.float8_e4m3fn)
B = torch.randn(128, 512, 128, device="cuda").to(torch.float8_e4m3fn).transpose(1, 2)
one = torch.ones(1, device="cuda")
with flashinfer.record_decisions() as log:
    flashinfer.bmm_fp8(A, B, one, one, torch.bfloat16)
torch.cuda.synchronize()
print(f"first call (import included) {time.perf_counter() - started:.2f} s -> {[d.name for d in log]}")
PY
echo "== first MoE layer call, fresh process (weights made first, not timed)"
(cd benchmarks && timeout 200 python3 first_call_moe.py --tokens 16 1024)
echo "== bmm_fp8 grid"
(cd benchmarks && timeout 200 python3 gemm.py --quick --only bmm_fp8 --iters 10 --out $OUT/gemm_bmm_fp8_rules.json 2>&1 \
  | grep -v "^\[" | tail -10)
