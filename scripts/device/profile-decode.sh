#!/usr/bin/env bash
# Profiles the decode kernel lab on a GPU machine: the timing sweep (under each L2 flush of
# FLUSHES, default "clean"; see kernels_dev/lab_common.h), then Nsight Compute on one launch of
# the tensor-core kernel per shape. Logs under $OUT.
#   scripts/device/profile-decode.sh [SHAPE ...]     # SHAPE: KV:BATCH:CTX:HKV, e.g. bf16:8:8192:8
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out/profile}
BUILD_DIR=${BUILD_DIR:-build-gpu}
mkdir -p "$OUT"
shapes=${*:-bf16:1:8192:8 bf16:8:8192:8 fp8_e4m3:64:8192:8}
bash scripts/device/gpu-test.sh build >/dev/null 2>&1 || { echo "build failed"; tail -30 "$OUT/build.log"; exit 1; }
lab=$BUILD_DIR/kernels_dev/attention_decode_lab
for f in ${FLUSHES:-clean}; do
  echo "== sweep, $f flush"
  LAB_FLUSH=$f "$lab" --sweep-only --versions 34 | tee "$OUT/sweep_$f.log"
done
for s in $shapes; do
  echo "== ncu $s"
  ncu --kernel-name regex:decode --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section LaunchStats --section SchedulerStats --section SourceCounters \
    --section ComputeWorkloadAnalysis --section InstructionStats --print-details all \
    "$lab" --sweep-only --versions 4 --shape "$s" >"$OUT/ncu_${s//:/_}.txt" 2>&1
  grep -E "Duration|DRAM Throughput|SM Active Cycles|Elapsed Cycles|Achieved Occupancy|Warp Cycles Per Issued|Registers Per|One or More|Executed Ipc|Issue Slots Busy|Stall|Pipe" \
    "$OUT/ncu_${s//:/_}.txt" | grep -v "^ *$" | head -60
done
