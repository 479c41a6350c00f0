#!/usr/bin/env bash
# Build upstream FlashInfer 0.7.2's sampling modules (sampling, and topk for top-k-first
# filtering) ahead of time, without a GPU, with upstream's own JIT build (its ninja file, nvcc
# flags and sources), for SM 9.0a, into .anchor/aot/<module>.so (see
# `bash benchmarks/device.sh upstream sampling`). Needs nvcc 13.0 at /usr/local/cuda, the .anchor/
# tarball and PyPI (apache-tvm-ffi, the curand headers). On 2 cores (2026-11-30) the sampling
# module took 112 s, the topk module 20 minutes (its cub_topk.cu alone ~18).
set -eu
R=$PWD
W=${W:-/tmp/upstream_sampling_build}
mkdir -p $W/anchor $W/deps
tar -C $W/anchor -xJf .anchor/flashinfer-0.7.2-pruned.tar.xz
python3 -m pip install -q --target $W/deps "apache-tvm-ffi==0.1.15.post2" nvidia-ml-py tqdm einops requests packaging click
# upstream's sampling.cuh includes curand.h, which a compiler-only CUDA install lacks
python3 -m pip download -q --no-deps -d $W/curand nvidia-curand
(cd $W/curand && unzip -q -o ./*.whl)
CURAND=$(dirname "$(find $W/curand -name curand.h | head -1)")
# the link names -lcuda from $CUDA_HOME/lib64/stubs; an empty stub with the driver's soname
# satisfies it (the module resolves the driver through the CUDA runtime at load time)
mkdir -p $W/stubs && echo "" > $W/stubs/empty.c
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o $W/stubs/libcuda.so $W/stubs/empty.c
mkdir -p /usr/local/cuda/lib64/stubs && cp -n $W/stubs/libcuda.so /usr/local/cuda/lib64/stubs/
cp -n $CURAND/*.h /usr/local/include/
mkdir -p $R/.anchor/aot
for module in sampling topk; do
  CUDA_HOME=/usr/local/cuda FLASHINFER_CUDA_ARCH_LIST="9.0a" FLASHINFER_WORKSPACE_BASE=$W/jit \
  PYTHONPATH=$W/anchor:$W/deps MAX_JOBS=2 python3 -c "
import importlib
spec = getattr(importlib.import_module('flashinfer.jit.$module'), 'gen_${module}_module')()
spec.build(); print(spec.jit_library_path)
" | tail -1 | xargs -I{} cp {} $R/.anchor/aot/$module.so
done
ls -la $R/.anchor/aot/
