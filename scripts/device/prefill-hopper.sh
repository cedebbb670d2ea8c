#!/usr/bin/env bash
# One GPU call for the Hopper prefill kernel: build (test_gpu, the prefill lab, the attention
# benchmark), the SASS check (HGMMA and UTMALDG present, no local memory), the Hopper prefill tests
# first, then the whole GPU suite, compute-sanitizer memcheck and racecheck on the prefill tests,
# the lab (gate and sweep), the prefill benchmark and torch's cuDNN and flash backends at the same
# shapes. Every step has a time limit; logs go to $OUT (default ./out/gpu), a summary is printed
# last. Steps: any of build sass hopper sanitize lab suite profile torch bench model (default:
# all, in that order; model: the CLI's whole-model prefill on synthetic Llama-3-8B at 8192 and
# 32768 tokens; MODEL_ENVS and MODEL_ROUNDS compare environment settings, e.g.
# MODEL_ENVS="PAGEDATTN_HOPPER_CTAS=0 -"). At most 8 files come back: sanitizer output goes to
# hopper.log, torch's to bench.log.
#   scripts/device/prefill-hopper.sh
#   scripts/device/prefill-hopper.sh build hopper lab
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out/gpu}
BUILD_DIR=${BUILD_DIR:-build-gpu}
mkdir -p "$OUT"
steps=${*:-build sass hopper sanitize lab suite profile torch bench model}
# NOTE: the whole call has a time limit on the GPU machine: no step runs past BUDGET seconds from
# the start (default 570), so the logs and the summary always come back.
end=$(($(date +%s) + ${BUDGET:-570}))
has() { [[ " $steps " == *" $1 "* ]]; }
source scripts/device/steps.sh
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  nvcc --version | tail -1
} >"$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

if has build; then
  targets=(test_gpu attention_prefill_lab bench_attention_cuda_main)
  if has model; then targets+=(pagedattn); fi
  step build 420 build.log env BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh "${targets[@]}" ||
    { tail -40 "$OUT/build.log"; }
fi
if [[ -f "$BUILD_DIR/deps-env.sh" ]]; then source "$BUILD_DIR/deps-env.sh"; fi
T="$BUILD_DIR/tests/test_gpu"
if has sass; then
  obj=$(find "$BUILD_DIR" -name 'prefill_hopper_bf16.cu.o' | head -1)
  if [[ -n "$obj" ]] && command -v cuobjdump >/dev/null; then
    cuobjdump -sass "$obj" >"$OUT/sass.txt" 2>&1
    echo "sass: HGMMA $(grep -c HGMMA "$OUT/sass.txt") UTMALDG $(grep -c UTMALDG "$OUT/sass.txt")" \
      "LDL/STL $(grep -cE 'LDL|STL' "$OUT/sass.txt")" | tee -a "$OUT/device.txt"
    rm -f "$OUT/sass.txt"
  fi
fi
if has hopper; then
  step hopper 150 hopper.log "$T" --gtest_filter='HopperPrefill.*'
  tail -15 "$OUT/hopper.log"
fi
if has lab; then
  step lab 200 lab.log "$BUILD_DIR/kernels_dev/attention_prefill_lab"
  grep -vE "^gate .* ok$" "$OUT/lab.log" | tail -30
fi
if has suite; then
  # The Hopper tests ran in their own step when it was asked for.
  filter='*'
  if has hopper; then filter='-HopperPrefill.*'; fi
  step suite 420 suite.log "$T" --gtest_filter="$filter"
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests ran" "$OUT/suite.log" | tail -20
fi
if has sanitize; then
  # The Hopper kernel (long chunked contexts, sliding window, whole prompts, fp8 pools) and the
  # shapes it hands to the mma.sync kernel.
  f='HopperPrefill.ChunksAtTheEndOfLongContexts:HopperPrefill.Fp8Pools*:HopperPrefill.OtherShapes*'
  f+=':HopperPrefill.FewCtasRunEveryWork64'
  step memcheck 150 hopper.log compute-sanitizer --tool memcheck --error-exitcode 3 "$T" \
    --gtest_filter="$f"
  step racecheck 200 hopper.log compute-sanitizer --tool racecheck --error-exitcode 3 "$T" \
    --gtest_filter="$f"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Hazard" "$OUT/hopper.log" | head -10
fi
if has profile; then
  # Nsight Compute on one launch of the Hopper kernel (batch 1, length 8192, GQA 32/8, d128,
  # page 16; PROFILE_ARGS adds benchmark flags, e.g. --kv-dtype fp8): the details page and the
  # per-instruction SASS source page (its PROFILE_TOP instructions printed, default 15).
  step profile 150 profile.txt ncu --set full -k regex:prefill_hopper -s 1 -c 1 -o "$OUT/prof" \
    "$BUILD_DIR/kernels_dev/bench_attention_cuda_main" --mode prefill --batch 1 --context 8192 \
    --num-kv-heads 8 --head-dim 128 --page-size 16 --iters 2 ${PROFILE_ARGS:-}
  ncu -i "$OUT/prof.ncu-rep" --page details >>"$OUT/profile.txt" 2>&1
  ncu -i "$OUT/prof.ncu-rep" --page source --csv --print-source sass >"$OUT/source.csv" 2>&1
  rm -f "$OUT/prof.ncu-rep"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Tensor" "$OUT/profile.txt" | head -20
  # The instructions where the warps' stall samples fall most (a barrier's wait loop shows as its
  # branch back).
  python3 - "$OUT/source.csv" "${PROFILE_TOP:-15}" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next(i for i, r in enumerate(rows) if 'Source' in r and 'Address' in r)
h = rows[hdr]
src, addr = h.index('Source'), h.index('Address')
col = next(j for j, c in enumerate(h) if c.startswith('Warp Stall Sampling (All'))
data = []
for r in rows[hdr + 1:]:
    try:
        data.append((float(r[col]), r[addr], r[src]))
    except (ValueError, IndexError):
        pass
total = sum(d[0] for d in data) or 1.0
for v, a, s in sorted(data, reverse=True)[:int(sys.argv[2])]:
    print('%5.1f%%  %s  %s' % (100 * v / total, a, s.strip()[:90]))
PY
fi
if has torch; then
  step torch 120 bench.log env PYTHONUNBUFFERED=1 python3 scripts/device/torch_baseline.py \
    --mode prefill --iters 20
  grep torch_prefill "$OUT/bench.log" | tail -12
fi
if has bench; then
  B="$BUILD_DIR/kernels_dev/bench_attention_cuda_main"
  common=(--mode prefill --page-size 16 --iters 12 ${BENCH_ARGS:-})
  step bench 150 bench.log "$B" "${common[@]}" --batch 1,4 --context 2048,8192,32768 \
    --num-kv-heads 8 --head-dim 128 --kv-dtype bf16,fp8
  step bench_dims 100 bench.log "$B" "${common[@]}" --batch 1,4 --context 8192 \
    --num-kv-heads 8,32 --head-dim 64,256
  step bench_pages 60 bench.log "$B" "${common[@]}" --batch 1 \
    --context 8192 --num-kv-heads 8 --head-dim 128 --page-size 64,128
  step bench_chunk 80 bench.log "$B" "${common[@]}" --batch 1,4 --context 8192,32768 \
    --prefill-chunk 2048 --num-kv-heads 8 --head-dim 128
  grep -E "prefill|copy" "$OUT/bench.log" | tail -40
fi
if has model; then
  # MODEL_ENVS: environment assignments to compare, alternating ("-": none), MODEL_ROUNDS rounds.
  for ((r = 1; r <= ${MODEL_ROUNDS:-1}; ++r)); do
    for e in ${MODEL_ENVS:--}; do
      assign=()
      [[ "$e" == - ]] || assign=("$e")
      for len in 8192 32768; do
        echo "== round $r env $e prompt $len" >>"$OUT/model.log"
        step "model_${len}_$r" 120 model.log env "${assign[@]}" "$BUILD_DIR/pagedattn" bench model \
          --model synthetic:llama3-8b --device cuda --batch 1 --prompt-len "$len" --decode-steps 8
      done
    done
  done
  grep -E "^== round|prefill" "$OUT/model.log" | tail -40
fi
printf '%s\n' "== summary" "${summary[@]}" | tee -a "$OUT/device.txt"
