#!/usr/bin/env bash
# plan() host time, ours and upstream FlashInfer 0.7.2 (separate processes) in one device call,
# ours again after upstream (the host speed drifts); GROWING=1 adds the same for consecutive
# decode steps (plan_compare.py --growing, files *_growing*). Carry .whl and .anchor. Writes to $OUT.
source benchmarks/device_env.sh
R=$PWD
mkdir -p /tmp/anchor && python3 -m pip install -q --no-index --no-deps --target /tmp/anchor .anchor/*.whl && tar -C /tmp/anchor -xJf .anchor/flashinfer-0.7.2-pruned.tar.xz
A="--reps 300 --batches 1,64,256 --mode sync,pipelined"
echo "== ours 1"; timeout 150 python3 benchmarks/plan_compare.py $A --backends auto --out $OUT/plan_compare_ours_1.json 2>&1 | grep -v "^\["
echo "== upstream"; (cd /tmp && PYTHONPATH=/tmp/anchor:/tmp/site timeout 200 python3 $R/benchmarks/plan_compare.py --impl upstream $A --out $OUT/plan_compare_upstream.json 2>&1 | grep -E "^upstream")
echo "== ours 2"; timeout 150 python3 benchmarks/plan_compare.py $A --backends auto --out $OUT/plan_compare_ours_2.json 2>&1 | grep -v "^\["
if [ -n "${GROWING:-}" ]; then
  G="$A --growing"
  echo "== ours 1, growing"; timeout 150 python3 benchmarks/plan_compare.py $G --backends auto --out $OUT/plan_compare_growing_ours_1.json 2>&1 | grep -v "^\["
  echo "== upstream, growing"; (cd /tmp && PYTHONPATH=/tmp/anchor:/tmp/site timeout 200 python3 $R/benchmarks/plan_compare.py --impl upstream $G --out $OUT/plan_compare_growing_upstream.json 2>&1 | grep -E "^upstream")
  echo "== ours 2, growing"; timeout 150 python3 benchmarks/plan_compare.py $G --backends auto --out $OUT/plan_compare_growing_ours_2.json 2>&1 | grep -v "^\["
fi
