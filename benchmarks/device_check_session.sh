#!/usr/bin/env bash
# One call for two checks that fit one carry (.whl, .whl_cutlass and .anchor: 54 MiB): the CUTLASS
# adapter (device_check_cutlass.sh: warm-up, GPU tests, launch cost), then plan() host time of
# ours against upstream FlashInfer 0.7.2 (device_check_plan_compare.sh).
bash benchmarks/device_check_cutlass.sh
bash benchmarks/device_check_plan_compare.sh
