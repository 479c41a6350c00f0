"""Compile time of the Triton sampling kernel (top-k + top-p variant), stage by stage, without a GPU.

    PYTHONPATH=/tmp/t36site python benchmarks/compile_time.py [--arch 90] [--reps 2]

Compiles ``sample_probs_kernel`` as ``top_k_top_p_sampling_from_probs`` launches it on fp32
probabilities (``LAUNCH_SHAPE`` lanes and warps) for ``cuda:<arch>`` with whatever Triton is
importable (put the device's Triton version first on ``PYTHONPATH``: ``pip download
triton==3.6.0 --no-deps`` and ``pip install --no-deps --target /tmp/t36site <wheel>``), each time
into an empty cache. Prints the total and the time of each compiler stage (AST to TTIR, TTGIR,
LLVM IR, PTX, ptxas): what a cold first call pays on top of the launcher build.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time

STAGES = ("make_ir", "make_ttir", "make_ttgir", "make_llir", "make_ptx", "make_cubin")


def compile_once(arch: int) -> float:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from flashinfer.backends.triton import _sampling_kernels as K
    from flashinfer.backends.triton import sampling as S

    q, warps = S.LAUNCH_SHAPE
    sig = {"probs": "*fp32", "out": "*i32", "valid": "*i1", "idx_ptr": "*i32", "k_ptr": "*i32",
           "p_ptr": "*fp32", "mp_ptr": "*fp32", "k_val": "i32", "p_val": "fp32", "mp_val": "fp32",
           "seed_ptr": "*i32", "off_ptr": "*i32", "seed_val": "i64", "off_val": "i64",
           "seed_stride": "i32", "off_stride": "i32", "R": "i32", "V": "i32", "stride_row": "i32",
           "passes_ptr": "*i32"}
    const = dict(COUNT_PASSES=False, HAS_IDX=False, K_T=False, P_T=False, MP_T=False, HAS_K=True,
                 HAS_P=True, HAS_MP=False, FILTER=True, JOINT=0, SEED_T=False, OFF_T=False,
                 NP=S.NP, CH=min(S.RANK_CHUNK, q), Q=q, MAX_ROUNDS=S.MAX_ROUNDS,
                 PHILOX_ROUNDS=S.PHILOX_ROUNDS)
    sig.update(dict.fromkeys(const, "constexpr"))
    names = K.sample_probs_kernel.arg_names
    src = ASTSource(fn=K.sample_probs_kernel, signature=sig,
                    constexprs={(names.index(k),): v for k, v in const.items()})
    start = time.perf_counter()
    triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    import os

    import triton

    print(f"triton {triton.__version__}, cuda:{args.arch}")
    for rep in range(args.reps):
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton_ct_")
        prof = cProfile.Profile()
        prof.enable()
        total = compile_once(args.arch)
        prof.disable()
        stats = pstats.Stats(prof).stats
        stage = {name: ct for (_, _, name), (_, _, _, ct, _) in stats.items() if name in STAGES}
        parts = "  ".join(f"{name[5:]} {stage.get(name, 0.0):.2f}" for name in STAGES)
        print(f"run {rep}: {total:.2f} s (profiled)  {parts}")


if __name__ == "__main__":
    main()
