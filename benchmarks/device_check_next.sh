#!/usr/bin/env bash
# Next session's device call (no carry): the top-p bracket renormalisation (written without a
# GPU on 2026-11-30, renorm_probs variant triton:bracket) — its GPU tests, its grid with every
# backend against the general kernel (upstream's: sampling_rest_grid_upstream_0.7.2_h200_
# 2026-11-30_1205utc.json), and a warps sweep (106 registers at 16 warps: one program per SM).
source benchmarks/device_env.sh
source benchmarks/device_lib.sh
gpu_tests tests/test_triton_top_p_bracket.py tests/test_sampling_gpu.py -k "renorm or bracket"
cd benchmarks && timeout 120 python3 sampling.py --only top_p_renorm --budget-s 100 \
  --out $OUT/sampling_top_p_renorm_grid.json 2>&1 | grep -v "^\[" | tail -20
