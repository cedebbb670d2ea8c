#!/usr/bin/env bash
# Nsight Compute on one launch of the Hopper prefill kernel per KV dtype (batch 1, length 8192,
# GQA 32/8, d128, page 16): the details page and the raw metrics of shared memory, the tensor
# pipe and the issue slots, side by side, to see what bounds fp8 pools against bf16. Then
# compute-sanitizer racecheck on RACE_FILTER (GPU tests) if set. SOURCE=1 also writes each
# kernel's SASS with its warp stall samples per instruction (source_<kv>.csv.gz).
#   KVS=bf16 SOURCE=1 scripts/device/prefill-profile-kv.sh
#   RACE_FILTER='HopperPrefill.FewCtasRunEveryWorkFp8x128' scripts/device/prefill-profile-kv.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/steps.sh
begin_call prefill-profile-kv 570
step build 300 build.log env BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh \
  bench_attention_cuda_main ${RACE_FILTER:+test_gpu} ||
  { tail -30 "$OUT/build.log"; print_summary; exit 1; }
if [[ -f "$BUILD_DIR/deps-env.sh" ]]; then source "$BUILD_DIR/deps-env.sh"; fi
B="$BUILD_DIR/kernels_dev/bench_attention_cuda_main"
for kv in ${KVS:-bf16 fp8}; do
  step "ncu $kv" 120 "ncu_$kv.log" ncu --set full -k regex:prefill_hopper -s 1 -c 1 \
    -o "$OUT/p_$kv" "$B" --mode prefill --batch 1 --context 8192 --num-kv-heads 8 \
    --head-dim 128 --page-size 16 --iters 2 --kv-dtype "$kv"
  ncu -i "$OUT/p_$kv.ncu-rep" --page details >"$OUT/details_$kv.txt" 2>&1
  ncu -i "$OUT/p_$kv.ncu-rep" --page raw --csv >"$OUT/raw_$kv.csv" 2>&1
  if [[ -n "${SOURCE:-}" ]]; then
    ncu -i "$OUT/p_$kv.ncu-rep" --page source --csv --print-source sass 2>&1 |
      gzip >"$OUT/source_$kv.csv.gz"
  fi
  rm -f "$OUT/p_$kv.ncu-rep"
done
python3 - "$OUT" ${KVS:-bf16 fp8} <<'PY'
import csv, sys
out, kvs = sys.argv[1], sys.argv[2:]
keys = ("gpu__time_duration.sum", "shared", "l1tex__data_pipe_lsu", "l1tex__data_bank",
        "pipe_tensor", "issue_active", "inst_executed.sum", "dram__throughput", "lts__t_sectors.sum",
        "smsp__average_warp", "warps_issue_stalled")
cols = {}
for kv in kvs:
    rows = list(csv.reader(open("%s/raw_%s.csv" % (out, kv))))
    hdr = next(i for i, r in enumerate(rows) if "ID" in r or "Kernel Name" in r)
    names, units, vals = rows[hdr], rows[hdr + 1], rows[-1]
    for n, u, v in zip(names, units, vals):
        if any(k in n for k in keys):
            cols.setdefault(n, {})[kv] = "%s %s" % (v, u)
for n in sorted(cols):
    print("%-90s %s" % (n[:90], " | ".join(cols[n].get(kv, "-") for kv in kvs)))
PY
if [[ -n "${RACE_FILTER:-}" ]]; then
  for f in ${RACE_FILTER//:/ }; do
    step "race $f" 200 race.log compute-sanitizer --tool racecheck --error-exitcode 3 \
      "$BUILD_DIR/tests/test_gpu" --gtest_filter="$f"
  done
  grep -E "RACECHECK SUMMARY|Hazard|PASSED|FAILED" "$OUT/race.log" | head -10
fi
print_summary
