#!/usr/bin/env bash
# One device call: GPU correctness of everything (see benchmarks/README or the issue log).
# Usage on the device machine, from the repo root: bash benchmarks/device_check.sh
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}
echo "== show-config"; timeout 120 python3 -m flashinfer show-config 2>&1 | tee "$OUT/show_config.txt" | tail -60
echo "== first call (fresh process)"; timeout 120 python3 benchmarks/first_call.py --json "$OUT/first_call.json"
echo "== cudnn probe"; timeout 150 python3 benchmarks/probe_cudnn.py 2>&1 | tee "$OUT/probe_cudnn.txt" | tail -25
echo "== quickstart"; timeout 120 python3 examples/quickstart.py 2>&1 | tail -20
echo "== gpu tests"; timeout ${GPU_TEST_TIMEOUT:-330} python3 -m pytest -m gpu -q -p no:cacheprovider --maxfail=60 tests ${GPU_TEST_ARGS:-} > "$OUT/gpu_tests.log" 2>&1; echo "pytest rc=$?"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -40
