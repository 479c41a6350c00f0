"""Build FlashAttention-2's CUDA extension (``flash_attn_2_cuda``, flash_attn 2.8.4) for one GPU
architecture from a source copy, to run the ``flash_attn`` adapter's ``fa2`` variant where no
wheel exists (the H200's torch 2.11 / CUDA 13). Forward kernels only: the backward ones are
compiled empty (``FLASHATTENTION_DISABLE_BACKWARD``), dropout and ALiBi are compiled out (the
adapter uses neither), which leaves 72 kernel files of the 120.

The source copy (``.whl_fa2src/src``, git-ignored, about 28 MB: carry it), made from the stored
snapshot of Dao-AILab/flash-attention (``fetch github:Dao-AILab/flash-attention``) and the
nvidia-cutlass 4.2 wheel of ``.whl_cutlass``::

    src/csrc/flash_attn/        git archive HEAD csrc/flash_attn
    src/flash_attn/             __init__.py and flash_attn_interface.py of the same commit
    src/cutlass/include/        the wheel's cutlass_library/source/include

On the device (ninja resumes an interrupted build in ``--build``, which a warm machine keeps
between calls; ``build/`` is git-ignored and never carried, so a later call finds it)::

    python3 benchmarks/build_fa2.py --src .whl_fa2src/src --build build/fa2 --jobs 16
    PYTHONPATH=.whl_fa2src/src:build/fa2 python3 -c "import flash_attn"

The kernel files can be compiled on a machine without a GPU (nvcc 13.0 and a torch install:
an hour and a half on two cores, against about 8 minutes of device time on 16), and only
``flash_api.cpp`` compiled and linked on the device::

    python benchmarks/build_fa2.py --src .whl_fa2src/src --compile-objects OBJ --jobs 2
    python3 benchmarks/build_fa2.py --src .whl_fa2src/src --build build/fa2 --objects OBJ

The objects' only torch symbol is ``c10::cuda::c10_cuda_check_implementation`` (the same
signature since torch 2.0), so a torch other than the device's serves to compile them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

KERNEL_GROUPS = ("flash_fwd_hdim", "flash_fwd_split_hdim", "flash_fwd_split_align_hdim",
                 "flash_bwd_hdim")
DEFINES = ["-DFLASHATTENTION_DISABLE_BACKWARD", "-DFLASHATTENTION_DISABLE_DROPOUT",
           "-DFLASHATTENTION_DISABLE_ALIBI"]
NVCC_FLAGS = ["-O3", "-U__CUDA_NO_HALF_OPERATORS__",
              "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
              "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "--expt-relaxed-constexpr",
              "--expt-extended-lambda", "--use_fast_math"]


def sources(src: Path) -> list[str]:
    kernels = sorted(p for p in (src / "csrc/flash_attn/src").glob("*_sm80.cu")
                     if p.name.startswith(KERNEL_GROUPS))
    return [str(src / "csrc/flash_attn/flash_api.cpp")] + [str(p) for p in kernels]


def compile_objects(src: Path, out: Path, jobs: int, arch: str) -> None:
    """One ``.o`` per kernel file in ``out`` (kept ones skipped: a rerun resumes)."""
    import torch.utils.cpp_extension as ext

    out.mkdir(parents=True, exist_ok=True)
    include = [src / "csrc/flash_attn", src / "csrc/flash_attn/src", src / "cutlass/include",
               *ext.include_paths()]
    stub = out / "stub"  # CPU builds of torch lack this generated header; CUDA builds have it
    if not any((Path(d) / "c10/cuda/impl/cuda_cmake_macros.h").exists() for d in include):
        (stub / "c10/cuda/impl").mkdir(parents=True, exist_ok=True)
        (stub / "c10/cuda/impl/cuda_cmake_macros.h").write_text(
            "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        include.append(stub)
    sm = arch.replace(".", "")
    flags = (NVCC_FLAGS + DEFINES + ["-std=c++17", "-Xcompiler", "-fPIC", "-gencode",
                                     f"arch=compute_{sm},code=sm_{sm}"]
             + [f"-I{d}" for d in include])

    def one(cu: str) -> None:
        obj = out / (Path(cu).stem + ".o")
        if obj.exists():
            return
        subprocess.run(["nvcc", "-c", cu, "-o", f"{obj}.tmp", *flags], check=True)
        os.replace(f"{obj}.tmp", obj)
        print(f"{time.strftime('%H:%M:%S')} {obj.name}", flush=True)

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, sources(src)[1:]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--build", type=Path, help="where the extension is built (and imported from)")
    ap.add_argument("--compile-objects", type=Path, metavar="DIR",
                    help="only compile the kernel files into DIR (no GPU needed)")
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--arch", default="9.0", help="TORCH_CUDA_ARCH_LIST entry")
    ap.add_argument("--objects", type=Path, help="prebuilt kernel objects (*.o) to link")
    args = ap.parse_args()
    if args.compile_objects:
        compile_objects(args.src, args.compile_objects, args.jobs, args.arch)
        return
    if args.build is None:
        ap.error("--build is required unless --compile-objects is given")
    os.environ["MAX_JOBS"] = str(args.jobs)
    os.environ["TORCH_CUDA_ARCH_LIST"] = args.arch
    from torch.utils.cpp_extension import load  # after the environment is set

    args.build.mkdir(parents=True, exist_ok=True)
    files = sources(args.src)
    objects = []
    if args.objects:
        # absolute: ninja links from inside the build directory
        objects = sorted(str(p.resolve()) for p in args.objects.glob("*.o"))
        if len(objects) != len(files) - 1:
            raise SystemExit(f"--objects: {len(objects)} objects for {len(files) - 1} kernel files")
        files = files[:1]
    print(f"building flash_attn_2_cuda from {len(files)} files and {len(objects)} objects, "
          f"{args.jobs} jobs", flush=True)
    start = time.perf_counter()
    include = [str((args.src / d).resolve()) for d in ("csrc/flash_attn", "csrc/flash_attn/src",
                                                       "cutlass/include")]
    load(name="flash_attn_2_cuda", sources=files, build_directory=str(args.build),
         extra_include_paths=include, extra_cflags=["-O3"] + DEFINES,
         extra_cuda_cflags=NVCC_FLAGS + DEFINES, extra_ldflags=objects, with_cuda=True,
         verbose=False)
    print(f"built and imported in {time.perf_counter() - start:.0f} s: "
          f"{args.build / 'flash_attn_2_cuda.so'}", flush=True)


if __name__ == "__main__":
    main()
