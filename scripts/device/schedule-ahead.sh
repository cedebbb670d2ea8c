#!/usr/bin/env bash
# Scheduling ahead (EngineConfig::schedule_ahead) on the GPU: the GPU tests, then `bench model`
# with it (the CUDA default) and with --no-schedule-ahead, alternating over ROUNDS rounds, and
# `bench serve` on workload A (docs/BENCHMARKS.md, "Serving on CUDA") both ways. Output under
# $OUT (schedule_ahead.txt: the JSON lines; summary.txt).
#   scripts/device/schedule-ahead.sh
#   ROUNDS=3 BATCHES=1,32,64 SKIP_SERVE=1 scripts/device/schedule-ahead.sh
# Environment: MODEL (synthetic:llama3-8b), BATCHES (1,32,64), PROMPT_LEN (512), DECODE_STEPS
# (32), ROUNDS (2), SAMPLING (greedy), GPU_FILTER (the tests run first), SKIP_GPU_TESTS,
# SKIP_SERVE, SERVE_REQUESTS (128), BUDGET (540).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/steps.sh
begin_call schedule-ahead 540
build_cli_and_gpu_tests
GPU_FILTER=${GPU_FILTER:-'ScheduleAhead*:*Chained*:LlamaCuda*:*Embedding*:StepGraphs*:Sampl*'}
run_gpu_suite
cli=$BUILD_DIR/pagedattn
model=${MODEL:-synthetic:llama3-8b}
for ((r = 1; r <= ${ROUNDS:-2}; ++r)); do
  for v in ahead no-ahead; do
    flag=()
    [[ $v == no-ahead ]] && flag=(--no-schedule-ahead)
    echo "== round $r $v" >>"$OUT/schedule_ahead.txt"
    step "model r$r $v" 150 schedule_ahead.txt "$cli" bench model --model "$model" --device cuda \
      --batch "${BATCHES:-1,32,64}" --prompt-len "${PROMPT_LEN:-512}" \
      --decode-steps "${DECODE_STEPS:-32}" --sampling "${SAMPLING:-greedy}" --json "${flag[@]}"
  done
done
if [[ -z "${SKIP_SERVE:-}" ]]; then
  for v in ahead no-ahead; do
    echo "== serve $v" >>"$OUT/schedule_ahead.txt"
    # NOTE: bench serve takes the engine's default (scheduling ahead on CUDA); without it through
    # the CUDA runner's switch.
    step "serve $v" 150 schedule_ahead.txt env PAGEDATTN_SCHEDULE_AHEAD=$([[ $v == ahead ]] &&
      echo 1 || echo 0) "$cli" bench serve --model "$model" --device cuda --mode paged \
      --request-rate inf --num-requests "${SERVE_REQUESTS:-128}" --prompt-len uniform:64:512 \
      --output-len lognormal:128:0.8:512 --kv-tokens 16384 --max-num-seqs 64 \
      --max-num-batched-tokens 2048 --seed 1 --sampling "${SAMPLING:-greedy}" --json --no-progress
  done
fi
grep -h '"bench"' "$OUT/schedule_ahead.txt" | python3 -c '
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    if d.get("bench") == "model":
        print("model b%-3d ahead=%-5s %.3f ms/step (%.1f%% of floor) device %.3f host gap %.3f" % (
            d["batch"], d.get("schedule_ahead"), d["decode_ms_per_step"], d.get("pct_of_floor", 0),
            d.get("device_ms_per_step", -1), d.get("host_gap_ms_per_step", -1)))
    else:
        print("serve %s: %s" % (d.get("mode"), {k: d[k] for k in d if k in (
            "output_tokens_per_s", "requests_per_s", "device_idle_frac",
            "device_idle_ms_per_step")}))
' | tee "$OUT/summary.txt"
print_summary | tee -a "$OUT/summary.txt"
