# Sourced by the benchmarks/device_check*.sh scripts (from the repo root on a GPU machine):
# installs the carried wheels (.whl/, when present) into /tmp/site, puts them and this checkout on
# PYTHONPATH, and makes $OUT (the device tool's output folder, /tmp/out elsewhere).
set -u
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
