#!/usr/bin/env bash
# Build the sampling kernel pack on the GPU, check it, and time the first call with and without it
# (no carry). Writes the pack to $OUT/packs/ (commit it under flashinfer/kernel_packs/).
source benchmarks/device_env.sh
source benchmarks/device_lib.sh
export_and_check_pack
first_call_with_pack
