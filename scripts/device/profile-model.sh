#!/usr/bin/env bash
# Where a decode step of the CUDA model spends its GPU time: Nsight Compute's duration of every
# kernel of one decode step of `pagedattn bench model` (synthetic model, one batch size), summed by
# kernel name. Compare the total with the step time bench model prints: the rest is host time and
# launch gaps. Needs a build from scripts/device/build.sh. Output under $OUT.
#   scripts/device/profile-model.sh [MODEL] [BATCH] [PROMPT_LEN]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out/profile}
BUILD_DIR=${BUILD_DIR:-build-gpu}
mkdir -p "$OUT"
model=${1:-synthetic:llama3-8b}
batch=${2:-32}
prompt=${3:-512}
if [[ -f "$BUILD_DIR/deps-env.sh" ]]; then source "$BUILD_DIR/deps-env.sh"; fi
bench=("$BUILD_DIR/pagedattn" bench model --model "$model" --device cuda --batch "$batch"
       --prompt-len "$prompt" --decode-steps 2)
"${bench[@]}" | tee "$OUT/model_step.txt"
# Every kernel of the run with its duration; the last decode step is the tail of the list.
ncu --metrics gpu__time_duration.sum --csv --print-units base "${bench[@]}" \
  >"$OUT/model_kernels.csv" 2>"$OUT/model_ncu.err"
python3 - "$OUT/model_kernels.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]
ki, ni, vi = head.index("ID"), head.index("Kernel Name"), head.index("Metric Value")
# Nsight Compute may print values with thousands separators ("1,234.5"): strip them first.
num = lambda v: v.replace(",", "")
kern = [(int(r[ki]), r[ni], float(num(r[vi]))) for r in rows[1:]
        if num(r[vi]).replace('.', '', 1).isdigit()]
kern.sort()
# One decode step: from the last embedding gather to the end.
starts = [i for i, k in enumerate(kern) if "embed" in k[1]]
step = kern[starts[-1]:] if starts else kern
tot = collections.defaultdict(float); cnt = collections.Counter()
for _, name, ns in step:
    short = name.split("(")[0][:70]
    tot[short] += ns; cnt[short] += 1
all_ns = sum(tot.values())
print(f"one decode step: {len(step)} kernels, {all_ns / 1e6:.3f} ms of kernel time")
for name, ns in sorted(tot.items(), key=lambda x: -x[1]):
    print(f"{ns / 1e6:9.3f} ms {100 * ns / all_ns:5.1f}% {cnt[name]:5d}x  {name}")
PY
