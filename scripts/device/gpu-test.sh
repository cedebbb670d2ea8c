#!/usr/bin/env bash
# Builds the CUDA backend on a GPU machine (scripts/device/build.sh), runs the GPU tests (a subset
# under compute-sanitizer), the kernel lab's correctness gates and timing sweeps, the attention
# benchmark and the torch baseline. Logs go to $OUT (default ./out/gpu). Steps: any of build tests
# sanitize lab bench torch (default: all of them), and the opt-in gemm (the skinny GEMM lab alone),
# model (bench model on synthetic Llama-3-8B and SmolLM2-135M) and serve (bench serve on synthetic
# Llama-3-8B).
#   scripts/device/gpu-test.sh                 # everything but model and serve
#   scripts/device/gpu-test.sh build tests     # just build and test
#   scripts/device/gpu-test.sh build model serve
# At most 8 log files (what the GPU machine sends back): the default steps write 8.
# Environment: BENCH_ARGS (extra flags for the attention benchmark, e.g. --quick), MODEL_ARGS
# (extra flags for bench model), SERVE_ARGS (bench serve's workload flags), BUILD_DIR, DEPS_DIR.
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
  # Missing Debian dev packages are unpacked from the .deb files in $DEPS_DIR (build.sh).
  # NOTE: should the CLI fail to build, the tests and the kernel lab still get built and run.
  if ! BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh >"$OUT/build.log" 2>&1; then
    note "full build FAILED (see build.log); building test_gpu and the kernel lab only"
    grep -E "error" "$OUT/build.log" | head -20
    BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh test_gpu attention_decode_lab \
      attention_prefill_lab skinny_gemm_lab skinny_gemm_check bench_attention_cuda_main \
      >>"$OUT/build.log" 2>&1 ||
      { note "build FAILED"; tail -30 "$OUT/build.log"; exit 1; }
    status=1
  fi
  grep "build.sh:" "$OUT/build.log" || true
fi
# The unpacked dependencies' library path, for running what was built.
if [[ -f "$BUILD_DIR/deps-env.sh" ]]; then source "$BUILD_DIR/deps-env.sh"; fi

if has tests; then
  note "tests"
  "$BUILD_DIR/tests/test_gpu" >"$OUT/test_gpu.log" 2>&1 || status=1
  tail -25 "$OUT/test_gpu.log"
  # The kernel lab's skinny GEMM check (kernels_dev/skinny_gemm_check.cpp).
  if [[ -x "$BUILD_DIR/kernels_dev/skinny_gemm_check" ]]; then
    "$BUILD_DIR/kernels_dev/skinny_gemm_check" >"$OUT/skinny_gemm_check.log" 2>&1 || status=1
    tail -4 "$OUT/skinny_gemm_check.log"
  fi
fi

if has sanitize; then
  note "compute-sanitizer memcheck (subset)"
  compute-sanitizer --tool memcheck --error-exitcode 3 "$BUILD_DIR/tests/test_gpu" \
    --gtest_filter='CudaAttention.LongContexts:CudaAttention.PoolsBeyond65536Pages:CudaAttention.SplitAndBatchInvariance:CudaWriteKv.*:HopperPrefill.ChunksAtTheEndOfLongContexts' \
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

if has gemm && [[ -x "$BUILD_DIR/kernels_dev/skinny_gemm_lab" ]]; then
  note "skinny_gemm_lab"
  "$BUILD_DIR/kernels_dev/skinny_gemm_lab" >"$OUT/skinny_gemm_lab.log" 2>&1 || status=1
  tail -40 "$OUT/skinny_gemm_lab.log"
fi

if has bench; then
  if [[ -x "$BUILD_DIR/kernels_dev/bench_attention_cuda_main" ]]; then
    note "bench attention --device cuda ${BENCH_ARGS:-}"
    "$BUILD_DIR/kernels_dev/bench_attention_cuda_main" ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1 || status=1
    cat "$OUT/bench.log" | tail -80
  fi
fi

# Opt-in steps (not in the default list): the whole model on a synthetic Llama-3-8B and
# SmolLM2-135M, and the serving benchmark on the GPU.
if has model; then
  note "bench model (synthetic, cuda)"
  {
    "$BUILD_DIR/pagedattn" bench model --model synthetic:llama3-8b --device cuda --batch 1,32 \
      --prompt-len 512 --decode-steps 32 ${MODEL_ARGS:-} || status=1
    "$BUILD_DIR/pagedattn" bench model --model synthetic:smollm2-135m --device cuda --batch 1,8,32 \
      --prompt-len 512 --decode-steps 32 ${MODEL_ARGS:-} || status=1
  } >"$OUT/bench_model.log" 2>&1
  cat "$OUT/bench_model.log"
fi

if has serve; then
  note "bench serve (synthetic:llama3-8b, cuda) ${SERVE_ARGS:-}"
  "$BUILD_DIR/pagedattn" bench serve --model synthetic:llama3-8b --device cuda \
    ${SERVE_ARGS:---mode paged,static --request-rate inf --num-requests 64 --prompt-len uniform:64:512 --output-len lognormal:128:0.8:512 --kv-tokens 16384 --max-num-seqs 64 --max-num-batched-tokens 2048 --seed 1} \
    >"$OUT/bench_serve.log" 2>&1 || status=1
  tail -20 "$OUT/bench_serve.log"
fi

if has torch; then
  note "torch baseline"
  PYTHONUNBUFFERED=1 python3 scripts/device/torch_baseline.py ${TORCH_ARGS:-} >"$OUT/torch.log" 2>&1 || status=1
  tail -60 "$OUT/torch.log"
fi

note "exit status $status"
exit $status
