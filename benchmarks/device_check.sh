#!/usr/bin/env bash
# Everything the foundation issue checks on a GPU machine, in one call (about 5 minutes on the H200):
#   bash benchmarks/device_check.sh            (from the repo root; wheels in .whl/, see README)
# Writes to $OUT: show_config.txt, gpu_tests.log, probe_cudnn.txt, first_call_*.json,
# foundation.json. Each step is bounded by `timeout` and prints as it goes.
source benchmarks/device_env.sh
echo "== show-config"; timeout 120 python3 -m flashinfer show-config > "$OUT/show_config.txt" 2>&1; tail -62 "$OUT/show_config.txt"
echo "== first call, fresh processes"
for b in auto cudnn; do
  timeout 120 python3 benchmarks/first_call.py --backend $b --json "$OUT/first_call_$b.json"
done
echo "== quickstart"; timeout 120 python3 examples/quickstart.py 2>&1 | grep -E "ran on|max \|"
echo "== cudnn probe"; timeout 150 python3 benchmarks/probe_cudnn.py > "$OUT/probe_cudnn.txt" 2>&1; tail -18 "$OUT/probe_cudnn.txt"
echo "== gpu tests"; timeout ${GPU_TEST_TIMEOUT:-240} python3 -m pytest -m gpu -q -p no:cacheprovider tests > "$OUT/gpu_tests.log" 2>&1; echo "pytest rc=$?"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -30
echo "== benchmark"; timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench_foundation.py --iters 20 --out "$OUT/foundation.json" 2>&1 | tail -16
