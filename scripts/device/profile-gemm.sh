#!/usr/bin/env bash
# Profiles the skinny GEMM lab on a GPU machine: Nsight Compute on one launch of cuBLAS and of each
# lab version per shape (after the warm-up launches). Logs under $OUT.
#   scripts/device/profile-gemm.sh [SHAPE ...]     # SHAPE: T:N:K, e.g. 32:6144:4096
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out/profile}
BUILD_DIR=${BUILD_DIR:-build-gpu}
mkdir -p "$OUT"
shapes=${*:-1:6144:4096 32:6144:4096}
bash scripts/device/gpu-test.sh build >/dev/null 2>&1 || { echo "build failed"; tail -30 "$OUT/build.log"; exit 1; }
source "$BUILD_DIR/deps-env.sh"
lab=$BUILD_DIR/kernels_dev/skinny_gemm_lab
for s in $shapes; do
  echo "== ncu $s"
  # The lab launches each kernel 3 times untimed, then 20 times: cuBLAS, then v1, then v2. One
  # launch each: cuBLAS's 4th (and its split-K reduce, if any), v1's 4th, v2's 4th.
  # NOTE: cuBLAS's kernel names need not contain "gemm" (CUDA 13: nvjet_*): anything but the lab's
  # kernel and the L2 flush's read sweep is cuBLAS.
  for pick in "^(?!skinny|l2_read) 3 2 cublas" "skinny 3 1 v1" "skinny 26 1 v2"; do
    read -r rx skip count name <<<"$pick"
    f="$OUT/ncu_gemm_${s//:/_}_$name.txt"
    ncu --kernel-name regex:"$rx" --launch-skip "$skip" --launch-count "$count" \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section Occupancy --section LaunchStats --section SchedulerStats \
      --print-details all "$lab" --sweep-only --shape "$s" >"$f" 2>&1
    echo "-- $name"
    grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Achieved Occupancy|Warp Cycles Per Issued|Registers Per|Grid Size|Cluster Size|Dynamic Shared|Stall [A-Z]" "$f" | head -40
  done
done
