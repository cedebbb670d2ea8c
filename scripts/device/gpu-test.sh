#!/usr/bin/env bash
# Builds the CUDA backend on a GPU machine, runs the GPU tests (a subset under compute-sanitizer),
# the kernel lab's correctness gates and timing sweeps, the attention benchmark and the torch
# baseline. Logs go to $OUT (default ./out/gpu). Steps: any of build tests sanitize lab bench torch
# (default: all of them).
#   scripts/device/gpu-test.sh                 # everything
#   scripts/device/gpu-test.sh build tests     # just build and test
# At most 8 log files (what the GPU machine sends back).
# Environment: BENCH_ARGS (extra flags for the benchmark, e.g. --quick), BUILD_DIR.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out/gpu}
BUILD_DIR=${BUILD_DIR:-build-gpu}
mkdir -p "$OUT"
steps=${*:-build tests sanitize lab bench torch}
has() { [[ " $steps " == *" $1 "* ]]; }
status=0
note() { echo "== $*" | tee -a "$OUT/device.txt"; }

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  nvcc --version | tail -1
  git log --oneline -1 2>/dev/null || true
} >"$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

if has build; then
  note "build"
  # The GPU machine may lack Debian dev packages that configure needs (not what these targets
  # build): unpack any .deb carried in $DEPS_DIR into a private prefix.
  DEPS_DIR=${DEPS_DIR:-build-cuda-deps}
  if ! pkg-config --exists cpp-httplib 2>/dev/null && ls "$DEPS_DIR"/*.deb >/dev/null 2>&1; then
    for f in "$DEPS_DIR"/*.deb; do dpkg -x "$f" /tmp/pagedattn-deps; done
    export PKG_CONFIG_PATH=/tmp/pagedattn-deps/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  fi
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    >"$OUT/build.log" 2>&1 || { note "configure FAILED"; tail -30 "$OUT/build.log"; exit 1; }
  targets="test_gpu"
  for t in attention_decode_lab attention_prefill_lab bench_attention_cuda_main; do
    grep -q "^$t:" "$BUILD_DIR/Makefile" 2>/dev/null && targets="$targets $t"
    grep -q "build $t:" "$BUILD_DIR/build.ninja" 2>/dev/null && targets="$targets $t"
  done
  cmake --build "$BUILD_DIR" --target $targets -j"$(nproc)" >>"$OUT/build.log" 2>&1 ||
    { note "build FAILED"; grep -E "error" "$OUT/build.log" | head -30; exit 1; }
fi

if has tests; then
  note "tests"
  "$BUILD_DIR/tests/test_gpu" >"$OUT/test_gpu.log" 2>&1 || status=1
  tail -25 "$OUT/test_gpu.log"
fi

if has sanitize; then
  note "compute-sanitizer memcheck (subset)"
  compute-sanitizer --tool memcheck --error-exitcode 3 "$BUILD_DIR/tests/test_gpu" \
    --gtest_filter='CudaAttention.LongContexts:CudaAttention.PoolsBeyond65536Pages:CudaAttention.SplitAndBatchInvariance:CudaWriteKv.*' \
    >"$OUT/memcheck.log" 2>&1 || status=1
  tail -6 "$OUT/memcheck.log"
fi

if has lab; then
  for lab in attention_decode_lab attention_prefill_lab; do
    if [[ -x "$BUILD_DIR/kernels_dev/$lab" ]]; then
      note "$lab"
      "$BUILD_DIR/kernels_dev/$lab" >"$OUT/$lab.log" 2>&1 || status=1
      tail -40 "$OUT/$lab.log"
    fi
  done
fi

if has bench; then
  if [[ -x "$BUILD_DIR/kernels_dev/bench_attention_cuda_main" ]]; then
    note "bench attention --device cuda ${BENCH_ARGS:-}"
    "$BUILD_DIR/kernels_dev/bench_attention_cuda_main" ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1 || status=1
    cat "$OUT/bench.log" | tail -80
  fi
fi

if has torch; then
  note "torch baseline"
  PYTHONUNBUFFERED=1 python3 scripts/device/torch_baseline.py ${TORCH_ARGS:-} >"$OUT/torch.log" 2>&1 || status=1
  tail -60 "$OUT/torch.log"
fi

note "exit status $status"
exit $status
