#!/usr/bin/env bash
# Whole-model prefill of the CUDA model by prefill chunk, before and after: `bench model` at each
# prompt length and chunk size under each variant (alternating over ROUNDS), decode steps at a few
# batches as a check, then for this tree a kernel trace of one prefill per chunk size summed by
# kernel name (prefill_kernels.txt) and the host's stacks over a long prefill (host_profile.txt).
#   PROMPTS="8192 32768" CHUNKS="2048 8192" scripts/device/prefill-model.sh
#   BASE_DIR=out/ab-base VARIANTS="main base" ROUNDS=2 scripts/device/prefill-model.sh
# Environment: MODEL (synthetic:llama3-8b), PROMPTS, CHUNKS, VARIANTS (`base`: this tree; `main`:
# BASE_DIR's; else comma-separated environment assignments for this tree), ROUNDS (1),
# DECODE_BATCHES (none by default: e.g. "1 32 64", prompt 512, 32 steps),
# TRACE_PROMPT (8192; none: no trace), HOST_PROFILE_PROMPT (none), HOST_PROFILE_UNDER (more
# functions whose callees the host profile lists), GPU_FILTER (builds test_gpu and runs those
# tests first), BENCH_EXTRA, BUDGET (540).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/steps.sh
begin_call prefill-model 540
step build 300 build.log env BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh pagedattn \
  ${GPU_FILTER:+test_gpu} || { tail -30 "$OUT/build.log"; print_summary; exit 1; }
if [[ -f "$BUILD_DIR/deps-env.sh" ]]; then source "$BUILD_DIR/deps-env.sh"; fi
if [[ -n "${BASE_DIR:-}" ]]; then
  # Rebuilt only when BASE_DIR's files differ from the last build's (a second run in one call).
  from=$(cd "$BASE_DIR" && find . -type f -not -path './build*' -exec md5sum {} + | sort | md5sum)
  if ! [[ -x /tmp/pagedattn-base/build-gpu/pagedattn &&
    "$(cat /tmp/pagedattn-base/.from 2>/dev/null)" == "$from" ]]; then
    rm -rf /tmp/pagedattn-base && cp -r "$BASE_DIR" /tmp/pagedattn-base
    step build-base 300 build.log env BUILD_DIR=/tmp/pagedattn-base/build-gpu \
      DEPS_DIR="$(realpath "${DEPS_DIR:-build-cuda-deps}")" \
      bash /tmp/pagedattn-base/scripts/device/build.sh pagedattn || tail -30 "$OUT/build.log"
    echo "$from" >/tmp/pagedattn-base/.from
  fi
fi
cli() { if [[ "$1" == main ]]; then echo /tmp/pagedattn-base/build-gpu/pagedattn; else
  echo "$BUILD_DIR/pagedattn"; fi; }
[[ -z "${GPU_FILTER:-}" ]] || run_gpu_suite
model=${MODEL:-synthetic:llama3-8b}
for ((r = 1; r <= ${ROUNDS:-1}; ++r)); do
  for v in ${VARIANTS:-base}; do
    assigns=()
    [[ "$v" == base || "$v" == main ]] || IFS=, read -ra assigns <<<"$v"
    for p in ${PROMPTS-8192 32768}; do
      for c in ${CHUNKS:-2048 4096 8192}; do
        ((c <= p)) || continue
        echo "== round $r variant $v prompt $p chunk $c" >>"$OUT/prefill.txt"
        step "$v p$p c$c" 120 prefill.txt env "${assigns[@]}" "$(cli "$v")" bench model \
          --model "$model" --device cuda --batch 1 --prompt-len "$p" --decode-steps 4 \
          --prefill-chunk "$c" ${BENCH_EXTRA:-}
      done
    done
    for b in ${DECODE_BATCHES:-}; do
      echo "== round $r variant $v decode batch $b" >>"$OUT/prefill.txt"
      step "$v b$b" 120 prefill.txt env "${assigns[@]}" "$(cli "$v")" bench model \
        --model "$model" --device cuda --batch "$b" --prompt-len 512 --decode-steps 32 \
        ${BENCH_EXTRA:-}
    done
  done
done
# One line a run: prefill tokens/s, or a decode batch's ms a step.
python3 - "$OUT/prefill.txt" <<'PY' | tee "$OUT/prefill_summary.txt"
import re, sys
key = None
for line in open(sys.argv[1]):
    if line.startswith("== "):
        key = line[3:].strip()
    m = re.search(r"prefill .* tokens in ([\d.]+) s \(([\d.]+) tok/s\).* ([\d.]+) ms/step\)", line)
    if m and key:
        print(f"{key:50s} prefill {m.group(1)} s {float(m.group(2)):9.1f} tok/s  "
              f"decode {m.group(3)} ms/step")
PY
tp=${TRACE_PROMPT:-8192}
cuda_home=$(dirname "$(dirname "$(command -v nvcc)")")
if [[ "$tp" != none ]]; then
  cupti=$(ls "$cuda_home"/extras/CUPTI/lib64/libcupti.so "$cuda_home"/lib64/libcupti.so \
    "$cuda_home"/lib/libcupti.so 2>/dev/null | head -1)
  cupti_inc=$(dirname "$(ls "$cuda_home"/extras/CUPTI/include/cupti.h \
    "$cuda_home"/include/cupti.h 2>/dev/null | head -1)")
  g++ -O2 -shared -fPIC scripts/device/kernel_trace.cpp -I"$cupti_inc" -I"$cuda_home/include" \
    -L"$(dirname "$cupti")" -Wl,-rpath,"$(dirname "$cupti")" -lcupti -o /tmp/libkernel_trace.so \
    >>"$OUT/build.log" 2>&1
  for c in ${CHUNKS:-2048 4096 8192}; do
    ((c < tp)) || continue  # a single chunk leaves no prefill-only window (the warm-up is one)
    rm -f /tmp/ptrace.*.csv
    step "trace c$c" 120 trace.log env CUDA_INJECTION64_PATH=/tmp/libkernel_trace.so \
      KERNEL_TRACE_CSV="/tmp/ptrace.%p.csv" "$BUILD_DIR/pagedattn" bench model --model "$model" \
      --device cuda --batch 1 --prompt-len "$tp" --decode-steps 1 --prefill-chunk "$c"
    for csv in /tmp/ptrace.*.csv; do
      echo "== prompt $tp chunk $c" >>"$OUT/prefill_kernels.txt"
      python3 scripts/device/kernel_sums.py "$csv" $((tp / c)) >>"$OUT/prefill_kernels.txt" 2>&1
    done
  done
fi
hp=${HOST_PROFILE_PROMPT:-none}
if [[ "$hp" != none ]] && g++ -O2 -shared -fPIC scripts/device/host_sampler.cpp \
  -o /tmp/libhost_sampler.so >>"$OUT/build.log" 2>&1; then
  rm -f /tmp/host_samples.*.txt
  c=${CHUNKS%% *}
  step "host profile" 120 host_profile.txt env LD_PRELOAD=/tmp/libhost_sampler.so \
    HOST_SAMPLE_OUT=/tmp/host_samples.%p.txt "$BUILD_DIR/pagedattn" bench model --model "$model" \
    --device cuda --batch 1 --prompt-len "$hp" --decode-steps 1 --prefill-chunk "${c:-2048}"
  for f in /tmp/host_samples.*.txt; do
    python3 scripts/device/host_profile.py "$f" 40 Engine::step ${HOST_PROFILE_UNDER:-} \
      >>"$OUT/host_profile.txt" 2>&1
  done
fi
print_summary | tee -a "$OUT/prefill.txt"
