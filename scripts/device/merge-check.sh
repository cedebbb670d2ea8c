#!/usr/bin/env bash
# One GPU call that checks a whole tree after branches are merged: builds the CLI, the GPU tests
# and the Python extension (scripts/device/build.sh), runs the GPU suite, the Python package's
# tests (its CUDA and torch tests included; the default-model tests skip where the model file is
# absent) and the model prefill benchmark at long prompts. Every step has a time limit so the logs
# always come back; they go to $OUT (default ./out/merge), a summary is printed last.
#   scripts/device/merge-check.sh
#   BUDGET=300 scripts/device/merge-check.sh      # seconds for the whole call (default 420)
#   SKIP_PYTHON=1 scripts/device/merge-check.sh   # without the Python package's tests
#   SKIP_GPU_TESTS=1 scripts/device/merge-check.sh  # without the GPU test suite
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out/merge}
BUILD_DIR=${BUILD_DIR:-build-gpu}
mkdir -p "$OUT"
end=$(($(date +%s) + ${BUDGET:-420}))
source scripts/device/steps.sh
record_device

step build 240 build.log env BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh pagedattn \
  test_gpu || tail -30 "$OUT/build.log"
# NOTE: a separate step: without nanobind on the machine the extension's targets do not exist.
[[ -n "${SKIP_PYTHON:-}" ]] ||
  step pybuild 90 build.log env BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh _C _C_stub \
  pagedattn_python_files || tail -10 "$OUT/build.log"
if [[ -f "$BUILD_DIR/deps-env.sh" ]]; then source "$BUILD_DIR/deps-env.sh"; fi
[[ -n "${SKIP_GPU_TESTS:-}" ]] ||
  step gpu 200 test_gpu.log "$BUILD_DIR/tests/test_gpu"
tail -4 "$OUT/test_gpu.log"
grep -E "^\[  FAILED" "$OUT/test_gpu.log" | head -20
[[ -n "${SKIP_PYTHON:-}" ]] ||
  step python 90 python.log env PYTHONPATH="$BUILD_DIR/python" PAGEDATTN_BUILD_DIR="$BUILD_DIR" \
  python3 -m pytest -q -rs -p no:cacheprovider python/tests
tail -15 "$OUT/python.log"
for len in 8192 32768; do
  step "model$len" 60 model.log "$BUILD_DIR/pagedattn" bench model --model synthetic:llama3-8b \
    --device cuda --batch 1 --prompt-len "$len" --decode-steps 8
done
# Decode steps against their memory floor (the numbers docs/BENCHMARKS.md tracks).
step decode 60 model.log "$BUILD_DIR/pagedattn" bench model --model synthetic:llama3-8b \
  --device cuda --batch 1,32 --prompt-len 512 --decode-steps 32
grep -iE "prefill|tok/s|batch|floor" "$OUT/model.log" | head -16
print_summary
