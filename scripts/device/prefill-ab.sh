#!/usr/bin/env bash
# One GPU call that compares settings of one build on the prefill benchmark and the whole model:
# builds the attention benchmark and the CLI, then runs `bench attention --mode prefill` and `bench
# model` (synthetic Llama-3-8B, batch 1) under each of ENVS in turn (environment assignments,
# comma-separated within one setting; "-" for none), ROUNDS rounds, and prints each shape's
# median per setting and its ratio to the first setting's. Logs under $OUT.
#   ENVS="PAGEDATTN_HOPPER_CTAS=0 -" ROUNDS=3 scripts/device/prefill-ab.sh
# Environment: ENVS ("-"), ROUNDS (2), BENCH_ARGS (the prefill grid: "--batch 1,4 --context
# 2048,8192,32768 --num-kv-heads 8 --head-dim 128"), CHUNK_ARGS (a second grid of chunked rows;
# "none" to skip), PROMPTS ("8192 32768"; "none" to skip the model), GPU_FILTER (builds test_gpu
# and runs those tests first), MEMCHECK_FILTER and RACE_FILTER (compute-sanitizer memcheck,
# racecheck on those GPU tests), BUDGET (570).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/steps.sh
begin_call prefill-ab 570
want_tests=${GPU_FILTER:-}${RACE_FILTER:-}${MEMCHECK_FILTER:-}
step build 300 build.log env BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh \
  bench_attention_cuda_main pagedattn ${want_tests:+test_gpu} ||
  { tail -30 "$OUT/build.log"; print_summary; exit 1; }
if [[ -f "$BUILD_DIR/deps-env.sh" ]]; then source "$BUILD_DIR/deps-env.sh"; fi
[[ -z "${GPU_FILTER:-}" ]] || run_gpu_suite
if [[ -n "${MEMCHECK_FILTER:-}" ]]; then
  step memcheck 150 race.log compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$BUILD_DIR/tests/test_gpu" --gtest_filter="$MEMCHECK_FILTER"
  grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/race.log" | head -10
fi
if [[ -n "${RACE_FILTER:-}" ]]; then
  step racecheck 200 race.log compute-sanitizer --tool racecheck --error-exitcode 3 \
    "$BUILD_DIR/tests/test_gpu" --gtest_filter="$RACE_FILTER"
  grep -E "RACECHECK SUMMARY|Hazard|PASSED|FAILED" "$OUT/race.log" | head -10
fi
B="$BUILD_DIR/kernels_dev/bench_attention_cuda_main"
grid=(--mode prefill --page-size 16 --iters 12 ${BENCH_ARGS:---batch 1,4 --context \
  2048,8192,32768 --num-kv-heads 8 --head-dim 128})
chunk=(--mode prefill --page-size 16 --iters 12 ${CHUNK_ARGS:---batch 1 --context 8192,32768 \
  --prefill-chunk 2048 --num-kv-heads 8 --head-dim 128})
prompts=${PROMPTS:-8192 32768}
run_with() {  # run_with SETTING STEP SECONDS LOG command...
  local setting=$1 assign=()
  shift
  [[ "$setting" == - ]] || IFS=, read -ra assign <<<"$setting"
  local name=$1 secs=$2 log=$3
  shift 3
  step "$name" "$secs" "$log" env "${assign[@]}" "$@"
}
for ((r = 1; r <= ${ROUNDS:-2}; ++r)); do
  for e in ${ENVS:--}; do
    echo "== round $r env $e" | tee -a "$OUT/bench.log" >>"$OUT/model.log"
    run_with "$e" "bench $r" 150 bench.log "$B" "${grid[@]}"
    [[ "${CHUNK_ARGS:-}" == none ]] || run_with "$e" "chunk $r" 100 bench.log "$B" "${chunk[@]}"
    if [[ "$prompts" != none ]]; then
      for len in $prompts; do
        run_with "$e" "model $r" 120 model.log "$BUILD_DIR/pagedattn" bench model \
          --model synthetic:llama3-8b --device cuda --batch 1 --prompt-len "$len" \
          --decode-steps 4 --json
      done
    fi
  done
done
python3 - "$OUT" "$PWD" <<'PY'
import json, os, sys
sys.path.insert(0, os.path.join(sys.argv[2], "scripts", "device"))
from settings_table import medians, print_table  # noqa: E402
out = sys.argv[1]
def bench(line):
    if not line.startswith("kind=prefill"):
        return None
    d = dict(x.split("=", 1) for x in line.split() if "=" in x)
    key = "b%s len%s q%s d%s hkv%s %s" % (d["batch"], d["len"], d.get("q_per_seq", "-"), d["d"],
                                         d["hkv"], d["kv"])
    return key, float(d["TFLOPs"])
def model(line):
    if not line.startswith("{"):
        return None
    d = json.loads(line)
    return "model prompt %s" % d.get("prompt_len"), float(d["prefill_tokens_per_s"])
for title, res in (("prefill TFLOP/s", medians(out + "/bench.log", bench)),
                   ("model prefill tokens/s", medians(out + "/model.log", model))):
    print_table(title, res, "%.1f")
PY
print_summary
