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

``--objects DIR`` links kernel objects compiled elsewhere (nvcc 13.0, ``-gencode
arch=compute_90,code=sm_90`` and the flags below, one ``.o`` per kernel file, e.g. on a
machine without a GPU: an hour on two cores, against about 8 minutes of device time on 16)
and compiles only ``flash_api.cpp`` there.
"""

from __future__ import annotations

import argparse
import os
import time
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--build", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--arch", default="9.0", help="TORCH_CUDA_ARCH_LIST entry")
    ap.add_argument("--objects", type=Path, help="prebuilt kernel objects (*.o) to link")
    args = ap.parse_args()
    os.environ["MAX_JOBS"] = str(args.jobs)
    os.environ["TORCH_CUDA_ARCH_LIST"] = args.arch
    from torch.utils.cpp_extension import load  # after the environment is set

    args.build.mkdir(parents=True, exist_ok=True)
    files = sources(args.src)
    objects = []
    if args.objects:
        objects = sorted(str(p) for p in args.objects.glob("*.o"))
        if len(objects) != len(files) - 1:
            raise SystemExit(f"--objects: {len(objects)} objects for {len(files) - 1} kernel files")
        files = files[:1]
    print(f"building flash_attn_2_cuda from {len(files)} files and {len(objects)} objects, "
          f"{args.jobs} jobs", flush=True)
    start = time.perf_counter()
    include = [str(args.src / d) for d in ("csrc/flash_attn", "csrc/flash_attn/src",
                                           "cutlass/include")]
    load(name="flash_attn_2_cuda", sources=files, build_directory=str(args.build),
         extra_include_paths=include, extra_cflags=["-O3"] + DEFINES,
         extra_cuda_cflags=NVCC_FLAGS + DEFINES, extra_ldflags=objects, with_cuda=True,
         verbose=False)
    print(f"built and imported in {time.perf_counter() - start:.0f} s: "
          f"{args.build / 'flash_attn_2_cuda.so'}", flush=True)


if __name__ == "__main__":
    main()
