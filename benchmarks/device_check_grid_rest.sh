#!/usr/bin/env bash
# One device call (carry .anchor): the sampling grid of every function but the top-k ones (those:
# device_check_pack_and_grid.sh), ours (auto) and upstream 0.7.2 (AOT modules) side by side.
source benchmarks/device_env.sh
R=$PWD
mkdir -p /tmp/anchor && python3 -m pip install -q --no-index --no-deps --target /tmp/anchor .anchor/*.whl && tar -C /tmp/anchor -xJf .anchor/flashinfer-0.7.2-pruned.tar.xz
for so in .anchor/aot/*.so; do m=$(basename $so .so); mkdir -p /tmp/anchor/flashinfer/data/aot/$m && cp $so /tmp/anchor/flashinfer/data/aot/$m/; done
echo "== grid upstream"; (cd /tmp && PYTHONPATH=/tmp/anchor:/tmp/site timeout 200 python3 $R/benchmarks/sampling.py --impl upstream --skip top_k_ \
  --budget-s 170 --first-timeout 20 --out $OUT/sampling_rest_grid_upstream.json 2>&1 | grep -v "^\[" | tail -5)
echo "== grid ours"; (cd benchmarks && timeout 220 python3 sampling.py --skip top_k_ --backends auto \
  --budget-s 190 --out $OUT/sampling_rest_grid_ours.json 2>&1 | grep -v "^\[" | tail -5)
