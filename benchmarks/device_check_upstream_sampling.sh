#!/usr/bin/env bash
# Upstream FlashInfer 0.7.2's sampling side by side with ours, in one device call (carry .whl and
# .anchor). Upstream's JIT build of its sampling module does not finish within a device call
# (>530 s there), so its modules (sampling, and topk for top-k-first filtering) are built ahead
# of time on a machine with nvcc 13.0 and no GPU, with upstream's own build
# (benchmarks/build_upstream_sampling.sh), carried as .anchor/aot/<module>.so and installed where
# upstream looks for AOT modules (flashinfer/data/aot/<module>/<module>.so): upstream then loads
# them instead of compiling.
source benchmarks/device_env.sh
R=$PWD
mkdir -p /tmp/anchor && python3 -m pip install -q --no-index --no-deps --target /tmp/anchor .anchor/*.whl && tar -C /tmp/anchor -xJf .anchor/flashinfer-0.7.2-pruned.tar.xz
for so in .anchor/aot/*.so; do m=$(basename $so .so); mkdir -p /tmp/anchor/flashinfer/data/aot/$m && cp $so /tmp/anchor/flashinfer/data/aot/$m/; done
echo "== upstream"; (cd /tmp && PYTHONPATH=/tmp/anchor:/tmp/site timeout 240 python3 $R/benchmarks/sampling.py --impl upstream --quick --only top_k_top_p --budget-s 110 --first-timeout 20 --out $OUT/sampling_upstream.json 2>&1 | grep -v "^\[" | tail -16)
echo "== ours"; (cd benchmarks && timeout 200 python3 sampling.py --quick --only top_k_top_p --budget-s 110 --out $OUT/sampling_ours.json 2>&1 | grep -v "^\[" | tail -16)
