#!/usr/bin/env bash
# One GPU call for small-batch decode (issue 11's last table): builds the decode kernel lab, runs
# its correctness gate, then times the small-batch shapes under each variant of VARIANTS (a
# variant is `base` or comma-separated assignments of environment variables, e.g.
# LAB_DECODE_TARGET=4,LAB_DECODE_CHUNKS=2), alternating variants over ROUNDS rounds, and last
# profiles one launch per shape of PROFILE_SHAPES with Nsight Compute (durations without the
# launch). Logs under $OUT; a summary is last.
#   scripts/device/decode-small.sh
#   VARIANTS="base PAGEDATTN_DECODE_X=1" ROUNDS=3 scripts/device/decode-small.sh
# Environment: SHAPES (KV:BATCH:CTX:HKV[:D] ...), VARIANTS, ROUNDS (2), PROFILE_SHAPES (none: skip),
# SKIP_GATE, VERSIONS (the lab's versions to time, default 4: the tensor-core kernel), GPU_FILTER
# (also builds test_gpu and runs those tests first), BUDGET (540). The gate runs every version of
# VERSIONS under every variant.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/steps.sh
begin_call decode-small 540
step build 240 build.log env BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh \
  attention_decode_lab ${GPU_FILTER:+test_gpu} ||
  { tail -30 "$OUT/build.log"; print_summary; exit 1; }
if [[ -f "$BUILD_DIR/deps-env.sh" ]]; then source "$BUILD_DIR/deps-env.sh"; fi
[[ -z "${GPU_FILTER:-}" ]] || run_gpu_suite
lab=$BUILD_DIR/kernels_dev/attention_decode_lab
shapes=${SHAPES:-bf16:1:512:8 bf16:1:2048:8 bf16:1:8192:8 bf16:1:32768:8 bf16:1:512:32 \
bf16:8:8192:8 bf16:8:32768:8 bf16:64:8192:8 fp8_e4m3:1:8192:8}
args=()
for s in $shapes; do args+=(--shape "$s"); done
# The gate: every version the sweep times, under each variant's environment.
if [[ -z "${SKIP_GATE:-}" ]]; then
  for v in ${VARIANTS:-base}; do
    assigns=()
    [[ "$v" == base ]] || IFS=, read -ra assigns <<<"$v"
    echo "== gate variant $v" >>"$OUT/gate.log"
    step "gate $v" 120 gate.log env "${assigns[@]}" "$lab" --versions "${VERSIONS:-4}" \
      --shape bf16:1:8192:8
  done
  grep -cE " ok$" "$OUT/gate.log"
  grep -E "FAIL" "$OUT/gate.log"
fi
for ((r = 1; r <= ${ROUNDS:-2}; ++r)); do
  for v in ${VARIANTS:-base}; do
    assigns=()
    [[ "$v" == base ]] || IFS=, read -ra assigns <<<"$v"
    echo "== round $r variant $v" >>"$OUT/sweep.log"
    step "sweep $v" 120 sweep.log env "${assigns[@]}" "$lab" --sweep-only \
      --versions "${VERSIONS:-4}" "${args[@]}"
  done
done
# One table per variant: the v4 column of each shape, every round side by side.
python3 - "$OUT/sweep.log" <<'PY'
import re, sys, collections
rows = collections.OrderedDict()
var = None
for line in open(sys.argv[1]):
    m = re.match(r"== round (\d+) variant (\S+)", line)
    if m:
        var = m.group(2)
        continue
    f = line.split()
    if len(f) == 13 and f[1].isdigit():
        for v, col in ((3, 7), (4, 8)):
            if f[col] != "0.0":
                rows.setdefault((f[0], f[1], f[2], f[3], f[4], "v%d" % v), collections.OrderedDict()).setdefault(var, []).append(f[col])
    m = re.match(r"empty kernel under the same timing: (\S+)", line)
    if m:
        rows.setdefault(("empty", "-", "-", "-", "-", "-"), collections.OrderedDict()).setdefault(var, []).append(m.group(1))
for k, vs in rows.items():
    print("%-9s b%-3s ctx%-6s hkv%-3s d%-3s %-2s " % k + "  ".join("%s: %s" % (v, "/".join(t)) for v, t in vs.items()))
PY
for s in ${PROFILE_SHAPES:-}; do
  step "ncu $s" 120 "ncu_${s//:/_}.txt" ncu --kernel-name regex:decode --launch-skip 3 \
    --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
    --section SourceCounters --print-details all "$lab" --sweep-only --versions 4 --shape "$s"
  grep -E "Duration|DRAM Throughput|Memory Throughput|SM Active Cycles|Elapsed Cycles|Achieved Occupancy|Warp Cycles Per Issued|Registers Per|Issue Slots Busy|Stall" \
    "$OUT/ncu_${s//:/_}.txt" | head -30
done
print_summary
