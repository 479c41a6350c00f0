#!/usr/bin/env bash
# Issue 5's MoE target: the DeepSeek-V3 layer (256 experts, top-8, hidden 7168, intermediate
# 2048, fp8 128x128 experts), upstream FlashInfer 0.7.2's cutlass_fused_moe against ours, in one
# device call (carry .whl and .anchor: 54 MiB). Upstream's full fused_moe_90 module (248 sources)
# does not build within a lease; .anchor/aot/fused_moe_90.so is its minimal build for the DeepSeek
# fp8 block-scale path, made without a GPU by benchmarks/build_upstream_fused_moe_minimal.sh
# (upstream's own compile commands, 15 of its sources, stubs for the other dtype combinations).
# Its expert GEMMs are DeepGEMM kernels that upstream compiles with nvcc at run time: nvcc must
# be found (CUDA_HOME), and the first call of each token count is untimed in moe.py's median.
# Routing: torch's top-k (--plain-routing) in both processes, so upstream builds no routing op.
# FLASHINFER_DISABLE_JIT=1 makes upstream fail at once, instead of starting its 248-source build,
# should it not find the AOT module (its DeepGEMM run-time compile is C++ and unaffected).
source benchmarks/device_env.sh
R=$PWD
export CUDA_HOME=/usr/local/cuda PATH=$PATH:/usr/local/cuda/bin
mkdir -p /tmp/anchor && python3 -m pip install -q --no-index --no-deps --target /tmp/anchor .anchor/*.whl && tar -C /tmp/anchor -xJf .anchor/flashinfer-0.7.2-pruned.tar.xz
for so in .anchor/aot/*.so; do m=$(basename $so .so); mkdir -p /tmp/anchor/flashinfer/data/aot/$m && cp $so /tmp/anchor/flashinfer/data/aot/$m/; done
T="--tokens 1 16 256 1024 4096 --iters 10 --plain-routing"
echo "== upstream"; (cd /tmp && FLASHINFER_DISABLE_JIT=1 PYTHONPATH=/tmp/anchor:/tmp/site timeout 300 python3 $R/benchmarks/moe.py --impl upstream $T --out $OUT/moe_upstream.json 2>&1 | tail -8)
echo "== ours"; (cd benchmarks && timeout 200 python3 moe.py $T --out $OUT/moe_ours.json 2>&1 | grep -v "^\[" | tail -16)
