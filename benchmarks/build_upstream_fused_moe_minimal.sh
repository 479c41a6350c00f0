#!/usr/bin/env bash
# Build upstream FlashInfer 0.7.2.post1's SM90 CUTLASS fused-MoE module (fused_moe_90, what
# flashinfer.fused_moe.cutlass_fused_moe loads on H100/H200) ahead of time, without a GPU, reduced
# to what the DeepSeek FP8 block-scale path (BF16 activations x FP8 128x128 block-scaled weights,
# use_deepseek_fp8_block_scale=True) executes. Every object is compiled with upstream's own
# ninja command (its JitSpec's build.ninja, FLASHINFER_CUDA_ARCH_LIST=9.0a); only the SET of
# sources differs from upstream's 248:
#   compiled: the FFI binding, cutlass_fused_moe_instantiation.cu (all CutlassMoeFCRunner types),
#     deepgemm_jit_setup.cu, fp8_blockscale_gemm.cu (the DeepSeek GEMM runner; its grouped GEMM is
#     DeepGEMM, JIT-compiled with nvcc at run time), moe_gemm_kernels_bf16_fp8.cu (the runner's
#     MoeGemmRunner<bf16,fp8>: no TMA-WS / generated CUTLASS kernel is reachable from it),
#     moe_gemm_tma_warp_specialized_input.cu, moe_gemm_mixed_utils.cu, memoryUtils.cu,
#     preQuantScaleKernel.cu and the six host .cpp files;
#   left out: the 14 other moe_gemm_kernels_*.cu and all 220 generated CUTLASS instantiations. The
#     231 MoeGemmRunner<other dtypes> methods the binding still references become weak stubs that
#     throw (a call for another dtype combination raises instead of killing the process).
# The link adds a driver stub with libcuda.so.1's soname so the module records NEEDED libcuda.so.1,
# as upstream's link against the CUDA toolkit's stub does (DeepGEMM's runtime calls cuLibrary*).
# Needs nvcc 13.0 at /usr/local/cuda and PyPI. ~7 CPU-minutes on this 2-core machine.
set -eu
W=${W:-/tmp/moe_build}
OUTSO=${OUTSO:-$W/minimal/link/fused_moe_90.so}
mkdir -p $W && cd $W
# upstream 0.7.2.post1 in full (the .anchor tarball lacks csrc/fused_moe/cutlass_backend/)
if [ ! -d wheel/x/flashinfer ]; then
  python3 -m pip download -q --no-deps flashinfer-python==0.7.2.post1 -d wheel
  mkdir -p wheel/x && (cd wheel/x && unzip -q -o ../flashinfer_python-0.7.2.post1-py3-none-any.whl)
fi
[ -d deps/tvm_ffi ] || python3 -m pip install -q --target deps "apache-tvm-ffi==0.1.15.post2" nvidia-ml-py tqdm einops requests packaging click
# headers a compiler-only CUDA 13.0 lacks: nvrtc.h (deep_gemm) and cublasLt.h (tensorrt_llm common)
if [ ! -f nvrtc/nvidia/cu13/include/nvrtc.h ]; then
  python3 -m pip download -q --no-deps "nvidia-cuda-nvrtc>=13.0,<13.1" -d nvrtc && (cd nvrtc && unzip -q -o ./*.whl)
fi
if [ ! -f cublas/nvidia/cu13/include/cublasLt.h ]; then
  python3 -m pip download -q --no-deps "nvidia-cublas>=13.0,<13.1" -d cublas && (cd cublas && unzip -q -o ./*.whl 'nvidia/cu13/include/*')
fi
mkdir -p nvrtc/linkdir && ln -sf $W/nvrtc/nvidia/cu13/lib/libnvrtc.so.13 nvrtc/linkdir/libnvrtc.so
export CPATH=$W/nvrtc/nvidia/cu13/include:$W/cublas/nvidia/cu13/include
export CUDA_HOME=/usr/local/cuda FLASHINFER_CUDA_ARCH_LIST="9.0a" FLASHINFER_WORKSPACE_BASE=$W/ws
export PYTHONPATH=$W/wheel/x:$W/deps
NINJA=$(python3 -c "
import flashinfer.jit.fused_moe as fm
s = fm.gen_cutlass_fused_moe_sm90_module(use_fast_build=False); s.write_ninja(); print(s.ninja_path)")
D=$(dirname $NINJA)
OBJS=""
for src in fused_moe/cutlass_backend/flashinfer_cutlass_fused_moe_binding \
    fused_moe/cutlass_backend/cutlass_fused_moe_instantiation fused_moe/cutlass_backend/deepgemm_jit_setup \
    fp8_blockscale_gemm/fp8_blockscale_gemm moe_gemm/moe_gemm_kernels_bf16_fp8 \
    moe_gemm/moe_gemm_tma_warp_specialized_input moe_gemm/moe_gemm_mixed_utils common/memoryUtils \
    kernels/preQuantScaleKernel; do
  d=$(basename $(dirname $src)); b=$(basename $src); OBJS="$OBJS $D/${d}_${b}.cuda.o"
done
for o in common_envUtils common_logger common_stringUtils common_tllmException \
    cutlass_kernels_cutlass_heuristic lora_lora; do OBJS="$OBJS $D/$o.o"; done
(cd $D && ninja -j${MAX_JOBS:-2} -f build.ninja $OBJS)
# stubs: MoeGemmRunner methods for the dtype combinations left out, and libcuda.so.1's soname
mkdir -p $W/minimal/stubs $W/minimal/link && cd $W/minimal/stubs
c++ $OBJS -shared -L/usr/local/cuda/lib64 -lcudart -o nostub.so
nm -u --format=posix nostub.so | awk '{print $1}' | grep -v @ > undef.txt
grep 13MoeGemmRunner undef.txt > stub_syms.txt
python3 - <<'EOF'
syms = open('stub_syms.txt').read().split()
with open('moe_gemm_runner_stubs.S', 'w') as f:
    f.write('\t.text\n')
    for s in syms:
        f.write(f'\t.weak {s}\n\t.type {s}, @function\n{s}:\n'
                f'\tjmp flashinfer_minimal_moe_stub_trap@PLT\n\t.size {s}, .-{s}\n')
    f.write('\t.section .note.GNU-stack,"",@progbits\n')
open('stub_trap.cpp', 'w').write('''#include <stdexcept>
extern "C" __attribute__((visibility("default"))) void flashinfer_minimal_moe_stub_trap() {
  throw std::runtime_error(
      "fused_moe_90 minimal build: this MoE dtype combination was not compiled "
      "(only the DeepSeek BF16 x FP8 block-scale path is)");
}
''')
print(len(syms), 'stubbed MoeGemmRunner methods')
EOF
gcc -c -fPIC moe_gemm_runner_stubs.S -o moe_gemm_runner_stubs.o
c++ -c -fPIC -O2 -std=c++17 stub_trap.cpp -o stub_trap.o
grep "^cu[A-Z]" undef.txt | awk '{print "void " $1 "(void) {}"}' > libcuda_stub.c
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o libcuda.so libcuda_stub.c
# upstream's link rule ($cxx $in $ldflags), with the stub objects and the driver stub added
c++ $OBJS moe_gemm_runner_stubs.o stub_trap.o -shared -L$W/minimal/stubs -L/usr/local/cuda/lib64 \
  -L/usr/local/cuda/lib64/stubs -L$W/nvrtc/linkdir -lcudart -lcuda -lnvrtc -o $OUTSO
left=$(nm -u $OUTSO | grep -v @ | grep -vE " (TVMFFI|_ZN3tvm|_ZTIN3tvm|_ZTVN3tvm|_ITM|__gmon|cu[A-Z])" || true)
[ -z "$left" ] || { echo "unexpected undefined symbols:"; echo "$left"; exit 1; }
ls -la $OUTSO
