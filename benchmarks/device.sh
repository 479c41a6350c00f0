#!/usr/bin/env bash
# The device entry script: `bash benchmarks/device.sh MODE [ARGS...]`, from the repo root on the
# GPU machine (the device tool's working copy). Carry `.whl` (../shared/device/fetch-wheels.sh
# --fa3) for the vendor backends; results land in $OUT.
#
#   tests FILE...      the GPU tests (-m gpu; MARK= runs every test of the files, the Triton
#                      kernel tests then run on the GPU too), log $OUT/gpu_tests_<stem>.log,
#                      verdict printed; TIMEOUT (default 540 s) bounds the run (SIGINT, so
#                      pytest and the sanitizer still print their summaries)
#   memcheck FILE...   the same under compute-sanitizer's memcheck, with torch's caching allocator
#                      off (PYTORCH_NO_CUDA_MEMORY_CACHING=1) so an access past a tensor is past
#                      its allocation and gets reported; log $OUT/memcheck_<stem>.log, its ERROR
#                      SUMMARY printed. PYTEST_K narrows the cases (pytest -k) for both modes.
#   pack               re-export the shipped Triton kernel pack ($OUT/packs/, copy it into
#                      flashinfer/kernel_packs/) and check it (benchmarks/check_kernel_pack.py)
source benchmarks/device_env.sh

stem() { local s; s=$(basename "$1" .py); [ $# -gt 1 ] && s="${s}_and_$(($# - 1))_more"; echo "$s"; }
k_args() {
  if [ -n "${PYTEST_K:-}" ]; then echo "-k"; echo "$PYTEST_K"; fi
  if [ -n "${MARK-gpu}" ]; then echo "-m"; echo "${MARK-gpu}"; fi
}
bounded() { timeout -s INT -k 30 "${TIMEOUT:-540}" "$@"; }

mode=${1:?mode: tests, memcheck or pack}; shift
case "$mode" in
  tests)
    log="$OUT/gpu_tests_$(stem "$@").log"
    mapfile -t K < <(k_args)
    echo "== gpu tests: $* ${K[*]:-}"
    bounded python3 -m pytest -q -p no:cacheprovider -rfE "${K[@]}" "$@" > "$log" 2>&1
    echo "pytest rc=$?"
    grep -E "^(FAILED|ERROR)| passed| failed|no tests ran" "$log" | cut -c1-240 | tail -12 ;;
  memcheck)
    log="$OUT/memcheck_$(stem "$@").log"
    mapfile -t K < <(k_args)
    echo "== memcheck: $* ${K[*]:-}"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 bounded compute-sanitizer --tool memcheck \
      --report-api-errors no --print-limit 20 \
      python3 -m pytest -q -p no:cacheprovider -rfE "${K[@]}" "$@" > "$log" 2>&1
    echo "rc=$?"
    echo "memcheck reports: $(grep -c '^========= Invalid\|^========= .*out of bounds' "$log")"
    grep -E "ERROR SUMMARY|^(FAILED|ERROR)| passed| failed|no tests ran" "$log" | cut -c1-240 | tail -12 ;;
  pack)
    source benchmarks/device_lib.sh
    export_and_check_pack ;;
  *)
    echo "unknown mode $mode (tests, memcheck, pack)"; exit 2 ;;
esac
