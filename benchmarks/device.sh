#!/usr/bin/env bash
# The device entry script: `bash benchmarks/device.sh MODE [ARGS...]`, from the repo root on the
# GPU machine (the device tool's working copy). Carry `.whl` (../shared/device/fetch-wheels.sh
# --fa3) for the vendor backends, `.anchor` (--anchor) for upstream; results land in $OUT.
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
#   bench FAMILY [ARG...]     a family's runner (benchmarks/FAMILY.py: attention, mla, gemm, moe,
#                      sampling, norm, rope, activation), its JSON lines, plot and summary in
#                      $OUT; ARGs go to the runner (--shapes quick, --only NAME, --backends ...).
#                      TIMEOUT (default 540 s) bounds it; the runner starts no case after
#                      TIMEOUT - 60 s, so a long grid ends with its summary instead of a kill
#   upstream FAMILY [ARG...]  side by side with upstream FlashInfer 0.7.2 (carry .anchor, and
#                      .anchor/aot/*.so: the modules upstream cannot JIT-build within a call,
#                      benchmarks/build_upstream_*.sh): ours, then upstream in a process of its
#                      own (/tmp/anchor first on PYTHONPATH), the same ARGs, then both in one
#                      table and plot. TIMEOUT (default 270 s) bounds each of the two runs.
#                      attention, mla, compositions, moe (both with torch's top-k routing), sampling
#   comm [ARG...]     benchmarks/comm.py under torchrun on every GPU (ours, then upstream's
#                      trtllm kernel when .anchor is carried), JSON lines in $OUT
#   script NAME [ARG...]      any other script, benchmarks/NAME.py (tune_sampling, tune_moe,
#                      tune_bmm_fp8, profile_moe, plan_timeline, ...), bounded by TIMEOUT
#   fa2                FlashAttention-2 built into build/fa2 (carry .whl_fa2src, and
#                      .whl_fa2pack to link kernel objects compiled without a GPU; else every
#                      kernel is compiled here, about 8 minutes): a later call on the same warm
#                      machine finds it on PYTHONPATH
#                      (e.g. `tests tests/attention/test_flash_attn.py`)
set -u
export PYTHONUNBUFFERED=1
# carried wheels: .whl/ (cuDNN frontend, CUTLASS python and its deps), .whl_*/ (e.g. .whl_fa3/)
WHEELS=$(ls .whl/*.whl .whl_*/*.whl 2>/dev/null)
if [ -n "$WHEELS" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site $WHEELS
fi
export PYTHONPATH=/tmp/site:$PWD
if [ -d build/fa2 ] && [ -d .whl_fa2src/src ]; then
  export PYTHONPATH=$PWD/.whl_fa2src/src:$PWD/build/fa2:$PYTHONPATH
fi
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$PWD

stem() { local s; s=$(basename "$1" .py); [ $# -gt 1 ] && s="${s}_and_$(($# - 1))_more"; echo "$s"; }
k_args() {
  if [ -n "${PYTEST_K:-}" ]; then echo "-k"; echo "$PYTEST_K"; fi
  if [ -n "${MARK-gpu}" ]; then echo "-m"; echo "${MARK-gpu}"; fi
}
bounded() { timeout -s INT -k 30 "${TIMEOUT:-540}" "$@"; }
budget() { echo "--budget-s $(( ${TIMEOUT:-$1} - 60 ))"; }

# upstream FlashInfer 0.7.2 (.anchor: fetch-wheels.sh --anchor) into /tmp/anchor, with the
# ahead-of-time modules of .anchor/aot/ where upstream looks for them (it then loads them
# instead of compiling)
install_anchor() {
  [ -d .anchor ] || { echo "no .anchor here: make it with ../shared/device/fetch-wheels.sh --anchor and carry it"; exit 2; }
  mkdir -p /tmp/anchor
  python3 -m pip install -q --no-index --no-deps --target /tmp/anchor .anchor/*.whl
  tar -C /tmp/anchor -xJf .anchor/flashinfer-0.7.2-pruned.tar.xz
  for so in .anchor/aot/*.so; do
    [ -e "$so" ] || continue
    m=$(basename "$so" .so); mkdir -p "/tmp/anchor/flashinfer/data/aot/$m" && cp "$so" "/tmp/anchor/flashinfer/data/aot/$m/"
  done
}

mode=${1:?mode: tests, memcheck, pack, bench, upstream, script or fa2}; shift
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
    mkdir -p "$OUT/packs"
    echo "== export"; timeout 420 python3 -m flashinfer warmup --vocab 32000 50257 \
      --export-pack "$OUT/packs/triton-$(python3 -c "import triton;print(triton.__version__)")-sm90.tar.xz" | tail -1
    echo "== check"; timeout 300 python3 benchmarks/check_kernel_pack.py "$OUT/packs" > "$OUT/check_kernel_pack.txt" 2>&1
    echo "rc=$?"; tail -2 "$OUT/check_kernel_pack.txt" ;;
  bench)
    family=${1:?bench FAMILY [ARGS...]}; shift
    echo "== bench $family $*"
    # shellcheck disable=SC2046
    bounded python3 "benchmarks/$family.py" --out "$OUT" $(budget 540) "$@"
    echo "rc=$?" ;;
  upstream)
    family=${1:?upstream FAMILY [ARGS...]}; shift
    both=(); up_env=(PYTHONPATH=/tmp/anchor:/tmp/site); up_args=()
    case "$family" in
      moe)  # no JIT build of upstream's routing op; its DeepGEMM expert GEMMs compile with nvcc;
            # FLASHINFER_DISABLE_JIT=1: upstream fails at once instead of starting its 248-source
            # build should it not find the AOT module (the DeepGEMM compile is unaffected)
        export CUDA_HOME=/usr/local/cuda PATH=$PATH:/usr/local/cuda/bin
        both=(--plain-routing); up_env+=(FLASHINFER_DISABLE_JIT=1) ;;
      mla|compositions)  # upstream JIT-builds these modules with nvcc (20-30 s each)
        export CUDA_HOME=/usr/local/cuda PATH=$PATH:/usr/local/cuda/bin ;;
      sampling)  # the AOT modules load at once; a JIT build would not finish within the call
        up_args=(--first-timeout 20) ;;
    esac
    install_anchor
    export TIMEOUT=${TIMEOUT:-270}
    echo "== ours: $family $*"
    # shellcheck disable=SC2046
    bounded python3 "benchmarks/$family.py" --out "$OUT" $(budget 270) "${both[@]}" "$@" \
      | grep -v "^\["
    echo "== upstream 0.7.2: $family $*"
    # shellcheck disable=SC2046
    (cd /tmp && bounded env "${up_env[@]}" python3 "$R/benchmarks/$family.py" --impl upstream \
      --out "$OUT" $(budget 270) "${both[@]}" "${up_args[@]}" "$@" | grep -v "^\[")
    ours=$(ls "$OUT/$family"_*.jsonl | grep -v "_upstream_" | tail -1)
    up=$(ls "$OUT/$family"_upstream_*.jsonl | tail -1)
    echo "== side by side: $(basename "$ours") $(basename "$up")"
    python3 "benchmarks/$family.py" --plot "$ours" "$up" ;;
  comm)
    # torchrun over every GPU of the machine: ours, then (with .anchor carried) upstream's trtllm
    # kernel, which it JIT-builds with nvcc on first use
    n=$(python3 -c "import torch; print(torch.cuda.device_count())")
    export CUDA_HOME=/usr/local/cuda PATH=$PATH:/usr/local/cuda/bin
    echo "== comm on $n GPUs: ours"
    bounded python3 -m torch.distributed.run --nproc-per-node "$n" benchmarks/comm.py --out "$OUT" "$@"
    if [ -d .anchor ]; then
      install_anchor
      echo "== comm on $n GPUs: upstream 0.7.2"
      (cd /tmp && bounded env PYTHONPATH=/tmp/anchor:/tmp/site python3 -m torch.distributed.run \
        --nproc-per-node "$n" "$R/benchmarks/comm.py" --impl upstream --out "$OUT" "$@")
    fi
    echo "rc=$?" ;;
  script)
    name=${1:?script NAME [ARGS...]}; shift
    echo "== $name $*"
    bounded python3 "benchmarks/$name.py" "$@"
    echo "rc=$?" ;;
  fa2)
    if [ -f .whl_fa2pack/fa2_objects.tar.xz ]; then  # link kernel objects compiled without a GPU
      mkdir -p build/fa2_objects && tar -xJf .whl_fa2pack/fa2_objects.tar.xz -C build/fa2_objects
      timeout 300 python3 benchmarks/build_fa2.py --src .whl_fa2src/src --build build/fa2 \
        --objects build/fa2_objects 2>&1 | tail -5
    else  # every kernel compiled here; a second call within 30 s resumes the ninja build
      timeout 560 python3 benchmarks/build_fa2.py --src .whl_fa2src/src --build build/fa2 \
        --jobs 16 2>&1 | tail -5
    fi
    PYTHONPATH="$PWD/.whl_fa2src/src:$PWD/build/fa2:$PYTHONPATH" python3 -c \
      "import flash_attn, flash_attn_2_cuda; print('flash_attn', flash_attn.__version__)" ;;
  *)
    echo "unknown mode $mode (tests, memcheck, pack, bench, upstream, script, fa2)"; exit 2 ;;
esac
