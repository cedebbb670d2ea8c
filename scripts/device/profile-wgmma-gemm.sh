#!/usr/bin/env bash
# Profiles the few-dozen-token product on Hopper (kernels_dev/wgmma_gemm.cu): Nsight Compute on
# one launch of cuBLAS and of each wgmma_gemm version per shape, after their warm-up launches.
# Logs under $OUT.
#   scripts/device/profile-wgmma-gemm.sh [SHAPE ...]     # SHAPE: T:N:K, e.g. 32:4096:4096
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out/profile}
BUILD_DIR=${BUILD_DIR:-build-gpu}
mkdir -p "$OUT"
shapes=${*:-32:4096:4096}
if [[ ! -x "$BUILD_DIR/kernels_dev/wgmma_gemm_lab" ]]; then
  BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh wgmma_gemm_lab >"$OUT/build.log" 2>&1 ||
    { echo "build failed"; tail -30 "$OUT/build.log"; exit 1; }
fi
if [[ -f "$BUILD_DIR/deps-env.sh" ]]; then source "$BUILD_DIR/deps-env.sh"; fi
lab=$BUILD_DIR/kernels_dev/wgmma_gemm_lab
for s in $shapes; do
  echo "== ncu $s"
  # With --shape the lab times, in its first round, cuBLAS, then versions 1 to 6 (3 untimed
  # launches and 10 timed ones each): cuBLAS's 4th launch (and its split-K reduce, if any), then
  # the 4th launch of versions 1, 5 and 6.
  for pick in "^(?!wgmma|l2_read) 3 2 cublas" "wgmma_gemm_kernel 3 1 v1" \
    "wgmma_gemm_kernel 55 1 v5" "wgmma_gemm_kernel 68 1 v6"; do
    read -r rx skip count name <<<"$pick"
    f="$OUT/ncu_${s//:/_}_$name.txt"
    ncu --kernel-name regex:"$rx" --launch-skip "$skip" --launch-count "$count" \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section Occupancy --section LaunchStats --section SchedulerStats \
      --print-details all "$lab" --shape "$s" >"$f" 2>&1
    echo "-- $name"
    grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|L2 Cache Throughput|Achieved Occupancy|Warp Cycles Per Issued|Grid Size|Cluster Size|Stall (Long|Barrier|Wait|Sleep)" "$f" | head -24
  done
done
