# Sourced by the benchmarks/device_check*.sh scripts (from the repo root on a GPU machine):
# installs the carried wheels into /tmp/site, puts them and this checkout on PYTHONPATH, and makes
# $OUT (the device tool's output folder, /tmp/out elsewhere). Wheels: .whl/ (cuDNN frontend),
# .whl_fa3/ (the FA3 forward wheel), .whl_cutlass/ (nvidia-cutlass and its pure-Python deps);
# carry the folders a call needs (64 MiB in all: .anchor and all three do not fit together).
set -u
export PYTHONUNBUFFERED=1
WHEELS=$(ls .whl/*.whl .whl_*/*.whl 2>/dev/null)
if [ -n "$WHEELS" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site $WHEELS
fi
export PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
