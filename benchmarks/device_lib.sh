# Shell functions of the device scripts (source after benchmarks/device_env.sh).

# gpu_tests PYTEST_ARGS...: run pytest into $OUT/gpu_tests.log and print its verdict lines.
gpu_tests() {
  echo "== gpu tests"
  timeout "${GPU_TESTS_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider "$@" > "$OUT/gpu_tests.log" 2>&1
  echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)| passed| failed" "$OUT/gpu_tests.log" | cut -c1-200 | tail -8
}

# export_and_check_pack: export the sampling kernel pack to $OUT/packs/ and check it there.
export_and_check_pack() {
  mkdir -p "$OUT/packs"
  echo "== export"; timeout 200 python3 -m flashinfer warmup --vocab 32000 50257 \
    --export-pack "$OUT/packs/triton-$(python3 -c "import triton;print(triton.__version__)")-sm90.tar.xz" | tail -1
  echo "== check"; timeout 120 python3 benchmarks/check_kernel_pack.py "$OUT/packs" > "$OUT/check_kernel_pack.txt" 2>&1
  echo "rc=$?"; tail -2 "$OUT/check_kernel_pack.txt"
}

# first_call_with_pack: the first call in a fresh process, with and without the new pack.
first_call_with_pack() {
  echo "== first call"; FLASHINFER_KERNEL_PACK_DIR="$OUT/packs" timeout 120 python3 benchmarks/sampling.py \
    --first-call --out "$OUT/first_call.json" 2>&1 | grep "first call"
}
