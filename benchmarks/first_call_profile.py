"""Where the first call of a sampling function spends its time, in this (fresh) process: CUDA
initialised and inputs made first, then the first call under cProfile, the top functions by
cumulative time, and the second call for comparison.

    python benchmarks/first_call_profile.py [--top 25]

Run it twice: the second process finds Triton's on-disk cache warm (``~/.triton/cache``), so the
difference between the two runs is the compile; what remains is import / dispatch / launcher cost.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    t0 = time.perf_counter()
    probs = torch.softmax(torch.randn(256, 128256, device="cuda") * 4.0, -1)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    import flashinfer  # noqa: PLC0415 - timed after CUDA initialisation

    t2 = time.perf_counter()
    profile = cProfile.Profile()
    profile.enable()
    flashinfer.sampling.top_k_top_p_sampling_from_probs(probs, 50, 0.9)
    torch.cuda.synchronize()
    profile.disable()
    t3 = time.perf_counter()
    flashinfer.sampling.top_k_top_p_sampling_from_probs(probs, 50, 0.9)
    torch.cuda.synchronize()
    t4 = time.perf_counter()
    print(f"cuda init + inputs {t1 - t0:.2f} s, import flashinfer {t2 - t1:.2f} s, "
          f"first call {t3 - t2:.2f} s (profiled), second {1e3 * (t4 - t3):.2f} ms")
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(args.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()
