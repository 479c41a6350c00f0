#!/usr/bin/env bash
# Re-export the sampling kernel pack once every kernel is final (no carry), check it, time the
# first call with it, then the probability-sampling functions' grid with every backend.
source benchmarks/device_env.sh
source benchmarks/device_lib.sh
export_and_check_pack
first_call_with_pack
cd benchmarks && timeout 330 python3 sampling.py --only _from_probs --budget-s 300 \
  --out $OUT/sampling_probs_grid_all_backends.json 2>&1 | grep -v "^\[" | tail -3
