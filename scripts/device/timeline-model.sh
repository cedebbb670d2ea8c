#!/usr/bin/env bash
# Where a decode step of the CUDA model spends its time as it really runs (CUDA graphs,
# programmatic dependent launches overlapping): `bench model` under each variant, then a kernel
# trace of it (CUPTI, through scripts/device/kernel_trace.cpp) and, over its last decode steps, a
# table by kernel name of each kernel's time past the kernels before it
# (scripts/device/timeline_table.py). Also times the decode attention kernels at the step's
# shapes in the kernel lab.
# Output under $OUT.
#   scripts/device/timeline-model.sh                  # llama3-8b, batches 32 and 64
#   MODEL=synthetic:llama3-8b BATCHES="1 32" scripts/device/timeline-model.sh
#   BASE_DIR=out/ab-base VARIANTS="main base" ROUNDS=3 scripts/device/timeline-model.sh
# Environment: MODEL, BATCHES, PROMPT_LEN (512), DECODE_STEPS (16), VARIANTS (`base`: this tree;
# `main`: BASE_DIR's; else comma-separated environment assignments for this tree), ROUNDS (1),
# BENCH_EXTRA (more bench model arguments for every variant, e.g. --sampling mixed),
# SKIP_TRACE, HOST_PROFILE_BATCH, HOST_PROFILE_ARGS (more bench model arguments),
# HOST_PROFILE_UNDER, LAB_VARIANTS (`none`: no lab),
# LAB_VERSIONS (34), GPU_FILTER (builds test_gpu and runs those tests), BUDGET (540), TRACE_SEQ
# (the trace table also lists the step's first TRACE_SEQ kernels in launch order), KERNEL_TRACE_API
# (1: the traces also hold the host's CUDA calls and copies, and the table what ran between the
# last two steps; scripts/device/kernel_trace.cpp says what that costs the trace).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/steps.sh
begin_call timeline 540
step build 300 build.log env BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh pagedattn \
  attention_decode_lab ${GPU_FILTER:+test_gpu} ||
  { tail -30 "$OUT/build.log"; print_summary; exit 1; }
if [[ -f "$BUILD_DIR/deps-env.sh" ]]; then source "$BUILD_DIR/deps-env.sh"; fi
# BASE_DIR: another tree (e.g. `git archive main | tar -x -C out/ab-base`) whose CLI the variant
# named `main` runs, for a before/after in one call.
if [[ -n "${BASE_DIR:-}" ]]; then
  base_tree=/tmp/pagedattn-base
  # Rebuilt only when BASE_DIR's files differ from the last build's (a second run of this
  # script in the same call reuses it).
  from=$(cd "$BASE_DIR" && find . -type f -not -path './build*' -exec md5sum {} + | sort | md5sum)
  built=$(cat "$base_tree/.from" 2>/dev/null)
  if ! [[ -x "$base_tree/build-gpu/pagedattn" && "$built" == "$from" ]]; then
    rm -rf "$base_tree" && cp -r "$BASE_DIR" "$base_tree"
    deps=$(realpath "${DEPS_DIR:-build-cuda-deps}")
    step build-base 300 build.log env BUILD_DIR="$base_tree/build-gpu" DEPS_DIR="$deps" \
      bash "$base_tree/scripts/device/build.sh" pagedattn || tail -30 "$OUT/build.log"
    echo "$from" >"$base_tree/.from"
  fi
fi
cli() { if [[ "$1" == main ]]; then echo /tmp/pagedattn-base/build-gpu/pagedattn; else
  echo "$BUILD_DIR/pagedattn"; fi; }
[[ -z "${GPU_FILTER:-}" ]] || run_gpu_suite
model=${MODEL:-synthetic:llama3-8b}
prompt=${PROMPT_LEN:-512}
# The kernel tracer (a CUPTI injection library), built here against the toolkit's CUPTI.
cuda_home=$(dirname "$(dirname "$(command -v nvcc)")")
cupti=$(ls "$cuda_home"/extras/CUPTI/lib64/libcupti.so "$cuda_home"/lib64/libcupti.so \
  "$cuda_home"/lib/libcupti.so 2>/dev/null | head -1)
cupti_inc=$(dirname "$(ls "$cuda_home"/extras/CUPTI/include/cupti.h "$cuda_home"/include/cupti.h \
  2>/dev/null | head -1)")
tracer=/tmp/libkernel_trace.so
g++ -O2 -shared -fPIC scripts/device/kernel_trace.cpp -I"$cupti_inc" -I"$cuda_home/include" \
  -L"$(dirname "$cupti")" -Wl,-rpath,"$(dirname "$cupti")" -lcupti -o "$tracer" \
  >>"$OUT/build.log" 2>&1 || tracer=
echo "cupti: ${cupti:-none}; tracer: ${tracer:-not built}" | tee -a "$OUT/timeline.txt"
# VARIANTS: `base` or comma-separated environment assignments; each runs bench model per batch,
# alternating over ROUNDS rounds, then once traced.
for ((r = 1; r <= ${ROUNDS:-1}; ++r)); do
  for v in ${VARIANTS:-base}; do
    assigns=()
    [[ "$v" == base || "$v" == main ]] || IFS=, read -ra assigns <<<"$v"
    for b in ${BATCHES:-32 64}; do
      echo "== round $r variant $v batch $b" >>"$OUT/timeline.txt"
      step "model $v b$b" 120 timeline.txt env "${assigns[@]}" "$(cli "$v")" bench model \
        --model "$model" --device cuda --batch "$b" --prompt-len "$prompt" \
        --decode-steps ${DECODE_STEPS:-16} ${BENCH_EXTRA:-}
    done
  done
done
for v in ${VARIANTS:-base}; do
  assigns=()
  [[ "$v" == base || "$v" == main ]] || IFS=, read -ra assigns <<<"$v"
  for b in ${BATCHES:-32 64}; do
    [[ -n "$tracer" && -z "${SKIP_TRACE:-}" ]] || continue
    rm -f /tmp/trace_b$b.*.csv
    step "trace $v b$b" 120 trace.log env "${assigns[@]}" CUDA_INJECTION64_PATH="$tracer" \
      KERNEL_TRACE_CSV="/tmp/trace_b$b.%p.csv" "$(cli "$v")" bench model --model "$model" \
      --device cuda --batch "$b" --prompt-len "$prompt" --decode-steps ${DECODE_STEPS:-16} \
      ${BENCH_EXTRA:-}
    # One file per process (a tensor-parallel run's workers write their own).
    for csv in /tmp/trace_b$b.*.csv; do
      [[ -f "$csv" ]] || continue
      echo "== variant $v batch $b (traced, $(basename "$csv"))" >>"$OUT/trace_tables.txt"
      python3 scripts/device/timeline_table.py "$csv" 8 ${TRACE_SEQ:-0} \
        >>"$OUT/trace_tables.txt" 2>&1
      [[ "$v" != base ]] || gzip -c "$csv" >"$OUT/$(basename "$csv").gz"
    done
  done
done
# ms a step (and % of the floor) per variant and batch, the rounds side by side.
python3 - "$OUT/timeline.txt" <<'PY' | tee "$OUT/summary.txt"
import collections, re, sys
res, key = collections.defaultdict(list), None
for line in open(sys.argv[1]):
    m = re.match(r"== round \d+ variant (\S+) batch (\d+)", line)
    if m:
        key = (m.group(1), int(m.group(2)))
    m = re.search(r"([\d.]+) ms/step\).*: ([\d.]+)% of floor", line)
    if m and key:
        res[key].append(f"{m.group(1)} ({m.group(2)}%)")
for (v, b), vals in sorted(res.items(), key=lambda x: (x[0][1], x[0][0])):
    print(f"b{b:<3} {v:40s} " + "  ".join(vals))
PY
# HOST_PROFILE_BATCH: the main thread's time over 400 decode steps at that batch, sampled
# on a wall-clock timer (scripts/device/host_sampler.cpp) and counted by function
# (host_profile.txt).
rm -f /tmp/host_samples.*.txt
if [[ -n "${HOST_PROFILE_BATCH:-}" ]] &&
  g++ -O2 -shared -fPIC scripts/device/host_sampler.cpp -o /tmp/libhost_sampler.so \
    >>"$OUT/build.log" 2>&1; then
  step "host profile" 120 host_profile.txt env LD_PRELOAD=/tmp/libhost_sampler.so \
    HOST_SAMPLE_OUT=/tmp/host_samples.%p.txt "$BUILD_DIR/pagedattn" bench model --model "$model" \
    --device cuda --batch "$HOST_PROFILE_BATCH" --prompt-len "$prompt" --decode-steps 400 \
    ${HOST_PROFILE_ARGS:-}
  for f in /tmp/host_samples.*.txt; do  # one file per process (workers write their own)
    echo "== $(basename "$f")" >>"$OUT/host_profile.txt"
    python3 scripts/device/host_profile.py "$f" 45 ${HOST_PROFILE_UNDER:-} \
      >>"$OUT/host_profile.txt" 2>&1
  done
fi
for b in ${BATCHES:-32 64}; do shapes+=(--shape "bf16:$b:$((prompt + 8)):8"); done
for v in ${LAB_VARIANTS:-base}; do
  [[ "$v" != none ]] || continue
  assigns=()
  [[ "$v" == base ]] || IFS=, read -ra assigns <<<"$v"
  echo "== lab variant $v" >>"$OUT/lab.txt"
  step "lab $v" 120 lab.txt env "${assigns[@]}" "$BUILD_DIR/kernels_dev/attention_decode_lab" \
    --sweep-only --versions ${LAB_VERSIONS:-34} "${shapes[@]}"
done
print_summary | tee -a "$OUT/timeline.txt"
