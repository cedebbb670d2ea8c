#!/usr/bin/env bash
# The Hopper prefill kernel's timeline (kernels_dev/attention_prefill.cu, LAB_PREFILL_TRACE):
# builds the kernel lab against a library with the trace marks compiled in (its own build
# directory, -DPAGEDATTN_PREFILL_TRACE=ON) and prints, for each shape, where a CTA's time goes
# between and inside its works. Output in $OUT/trace.txt.
#   scripts/device/prefill-trace.sh
#   TRACE_SHAPES="4:2048 66:2048:128" scripts/device/prefill-trace.sh
# Environment: TRACE_SHAPES (batch:len[:chunk[:d]] each), TRACE_BUILD_DIR (build-trace).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/steps.sh
begin_call prefill-trace 300
dir=${TRACE_BUILD_DIR:-build-trace}
step build-trace 240 build.log env BUILD_DIR="$dir" CMAKE_FLAGS="-DPAGEDATTN_PREFILL_TRACE=ON" \
  bash scripts/device/build.sh attention_prefill_lab || { tail -30 "$OUT/build.log"; exit 1; }
if [[ -f "$dir/deps-env.sh" ]]; then source "$dir/deps-env.sh"; fi
shapes=${TRACE_SHAPES:-4:2048 64:512 1:8192 66:2048:128}
for s in $shapes; do
  step "trace $s" 60 trace.txt env LAB_PREFILL_TRACE="$s" "$dir/kernels_dev/attention_prefill_lab"
done
grep -A1 "^== trace" "$OUT/trace.txt"
print_summary
