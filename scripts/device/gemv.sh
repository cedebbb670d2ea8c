#!/usr/bin/env bash
# One GPU call for the few-token product of decode steps (src/model/cuda/gemv.h): builds the CLI,
# the GPU tests and the gemv lab; runs the lab (gate, then the sweep against cuBLAS), the GPU
# suite (GPU_FILTER narrows it), and `bench model` on synthetic SmolLM2-135M and Llama-3-8B with
# the products gemv_pick chooses through gemv and, alternately, all through cuBLAS
# (PAGEDATTN_GEMV=0); AB_VAR names another switch to compare the same way (PAGEDATTN_PDL: kernels
# launched as programmatic dependents or plainly). LAB names the lab to run instead of gemv's
# (wgmma_gemm_lab: the few-dozen-token product on Hopper); AB_VALUES the switch's values, in the
# order run (default "1 0"). Logs under $OUT; a summary is last.
#   scripts/device/gemv.sh
#   SKIP_SUITE=1 AB_VAR=PAGEDATTN_PDL scripts/device/gemv.sh
#   LAB=wgmma_gemm_lab AB_VAR=PAGEDATTN_WGMMA_GEMM AB_VALUES="16 0" MODEL_BATCHES=4,8,16 \
#     scripts/device/gemv.sh
# Environment: LAB, LAB_ARGS, SKIP_LAB, SKIP_SUITE, SUITE_SECS (240), SKIP_SMOL, GPU_FILTER,
# MODEL_BATCHES (1,2,4), AB_VAR, AB_VALUES, BUDGET.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out/gemv}
BUILD_DIR=${BUILD_DIR:-build-gpu}
mkdir -p "$OUT"
end=$(($(date +%s) + ${BUDGET:-560}))
source scripts/device/steps.sh
ab=${AB_VAR:-PAGEDATTN_GEMV}
lab=${LAB:-gemv_lab}
record_device
step build 240 build.log env BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh pagedattn \
  test_gpu "$lab" || tail -30 "$OUT/build.log"
if [[ -f "$BUILD_DIR/deps-env.sh" ]]; then source "$BUILD_DIR/deps-env.sh"; fi
bin="$BUILD_DIR/pagedattn"

if [[ -z "${SKIP_LAB:-}" ]]; then
  step lab 240 lab.log "$BUILD_DIR/kernels_dev/$lab" ${LAB_ARGS:-}
  grep -vE "^gate .* ok$" "$OUT/lab.log" | tail -70
fi

[[ -n "${SKIP_SUITE:-}" ]] ||
  step suite "${SUITE_SECS:-240}" suite.log "$BUILD_DIR/tests/test_gpu" \
    ${GPU_FILTER:+--gtest_filter=$GPU_FILTER}
tail -4 "$OUT/suite.log" 2>/dev/null
grep -E "^\[  FAILED|Failure" "$OUT/suite.log" 2>/dev/null | head -20

# Interleaved: the switch's values in turn, twice (sustained work moves the clocks).
# A value with '=' in it is an assignment of its own (VAR=value), run as it is.
for round in 1 2; do
  for g in ${AB_VALUES:-1 0}; do
    set_it="$ab=$g"
    [[ "$g" == *=* ]] && set_it="$g"
    echo "## $set_it" >>"$OUT/model.log"
    [[ -n "${SKIP_SMOL:-}" ]] || step "smol-g$g" 60 model.log env $set_it "$bin" bench model \
      --model synthetic:smollm2-135m --device cuda --batch ${MODEL_BATCHES:-1,2,4} --prompt-len 512 \
      --decode-steps 64 --json
    step "8b-g$g" 60 model.log env $set_it "$bin" bench model \
      --model synthetic:llama3-8b --device cuda --batch ${MODEL_BATCHES:-1,2,4} --prompt-len 512 \
      --decode-steps 32 --json
  done
done
grep -E '^(\{|## )' "$OUT/model.log" | python3 -c '
import json, sys
g = "?"
for line in sys.stdin:
    if line.startswith("## "):
        g = line[3:].strip()
        continue
    r = json.loads(line)
    model, batch, ms = r["model"], r["batch"], r["decode_ms_per_step"]
    pct = r.get("pct_of_floor", 0)
    print(f"{g} {model:22s} batch {batch:3d}  {ms:7.3f} ms/step  {pct:5.1f}% of floor")
'
print_summary
