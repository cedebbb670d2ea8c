# Sourced by the GPU call scripts: `step NAME SECONDS LOG command...` runs a command with its output
# appended to $OUT/LOG, never past the call's deadline $end (seconds since the epoch), and records
# a line of the summary (`print_summary`). A step with under 5 s left is skipped.
summary=()
step() {
  local name=$1 secs=$2 log=$3 t0 rc
  shift 3
  t0=$(date +%s)
  if ((t0 + secs > end)); then secs=$((end - t0)); fi
  if ((secs < 5)); then
    summary+=("$(printf '%-10s skipped (no time left)' "$name")")
    return 1
  fi
  timeout "$secs" "$@" >>"$OUT/$log" 2>&1
  rc=$?
  summary+=("$(printf '%-10s rc=%-4s %4ss' "$name" "$rc" "$(($(date +%s) - t0))")")
  return $rc
}
print_summary() { echo "== summary"; printf '%s\n' "${summary[@]}"; }
# A call's start, after `cd` to the repository and sourcing this file: OUT (default out/NAME),
# BUILD_DIR, the deadline `end` BUDGET seconds on (default SECONDS), and record_device.
#   begin_call decode-ab 500
begin_call() {
  OUT=${OUT:-$PWD/out/$1}
  BUILD_DIR=${BUILD_DIR:-build-gpu}
  mkdir -p "$OUT"
  end=$(($(date +%s) + ${BUDGET:-$2}))
  record_device
}
# The machine, the driver and the compiler, into $OUT/device.txt and on stdout.
record_device() {
  {
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    nvcc --version | tail -1
  } >"$OUT/device.txt" 2>&1
  cat "$OUT/device.txt"
}
# Builds the CLI and the GPU tests into $BUILD_DIR (the build log's tail on failure) and takes
# the environment of its dependencies.
build_cli_and_gpu_tests() {
  step build 240 build.log env BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh pagedattn \
    test_gpu || tail -30 "$OUT/build.log"
  if [[ -f "$BUILD_DIR/deps-env.sh" ]]; then source "$BUILD_DIR/deps-env.sh"; fi
}
# The GPU suite (GPU_FILTER narrows it) unless SKIP_GPU_TESTS is set; its tail and failures.
run_gpu_suite() {
  [[ -n "${SKIP_GPU_TESTS:-}" ]] ||
    step gpu 200 test_gpu.log "$BUILD_DIR/tests/test_gpu" ${GPU_FILTER:+--gtest_filter=$GPU_FILTER}
  tail -4 "$OUT/test_gpu.log" 2>/dev/null
  grep -E "^\[  FAILED" "$OUT/test_gpu.log" 2>/dev/null | head -20
}
