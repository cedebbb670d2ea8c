#!/usr/bin/env bash
# Decode steps padded to a few row counts (LlamaModelCuda::set_decode_padding), one build, on and
# off (PAGEDATTN_PAD_DECODE=1|0) alternating over ROUNDS rounds: the GPU tests, then `bench serve`
# on workloads A and B of docs/BENCHMARKS.md ("Serving on CUDA", rate inf) for each model of
# MODELS, then `bench model` at BATCHES; optionally (LAB_SHAPES) the decode kernel lab's sweep
# under each of LAB_VARIANTS. Output under $OUT: serve.txt and model.txt (JSON lines),
# summary.txt.
#   scripts/device/decode-padding.sh
#   MODELS=synthetic:smollm2-135m WORKLOADS=A ROUNDS=3 scripts/device/decode-padding.sh
# Environment: MODELS (synthetic:smollm2-135m synthetic:llama3-8b), WORKLOADS (A B; the second
# model runs A only unless ALL_WORKLOADS is set), ROUNDS (2), SERVE_REQUESTS (128), BATCHES
# (1,24,40,64; empty: skip), MODEL_BENCH (synthetic:llama3-8b), SAMPLING (greedy; bench model's
# --sampling values, e.g. "greedy mixed"), MODEL_PADS (1 0), GPU_FILTER, SKIP_GPU_TESTS,
# LAB_SHAPES (KV:BATCH:CTX:HKV ...; empty: no lab), LAB_VARIANTS (base), BUDGET (570).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/steps.sh
begin_call decode-padding 570
targets=(pagedattn test_gpu)
[[ -z "${LAB_SHAPES:-}" ]] || targets+=(attention_decode_lab)
step build 300 build.log env BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh "${targets[@]}" ||
  tail -30 "$OUT/build.log"
if [[ -f "$BUILD_DIR/deps-env.sh" ]]; then source "$BUILD_DIR/deps-env.sh"; fi
GPU_FILTER=${GPU_FILTER:-'*LlamaCuda*:StepGraphs*:ScheduleAhead*:Sampl*:*Engine*:*Graph*'}
run_gpu_suite
cli=$BUILD_DIR/pagedattn
serve() {  # model workload pad round
  local args=(--request-rate inf --num-requests "${SERVE_REQUESTS:-128}" --kv-tokens 16384
    --max-num-seqs 64 --max-num-batched-tokens 2048 --json --no-progress --mode paged)
  if [[ $2 == A ]]; then
    args+=(--prompt-len uniform:64:512 --output-len lognormal:128:0.8:512 --seed 1)
  else
    args+=(--prompt-len uniform:16:128 --output-len lognormal:256:0.8:1024 --seed 3)
  fi
  echo "== serve $1 $2 pad=$3 round $4" >>"$OUT/serve.txt"
  step "serve $2 $3" 120 serve.txt env PAGEDATTN_PAD_DECODE="$3" "$cli" bench serve \
    --model "$1" --device cuda "${args[@]}"
}
first=1
for model in ${MODELS:-synthetic:smollm2-135m synthetic:llama3-8b}; do
  workloads=${WORKLOADS:-A B}
  [[ $first == 1 || -n "${ALL_WORKLOADS:-}" ]] || workloads=A
  first=0
  for ((r = 1; r <= ${ROUNDS:-2}; ++r)); do
    for w in $workloads; do
      for pad in 1 0; do serve "$model" "$w" "$pad" "$r"; done
    done
  done
done
if [[ -n "${BATCHES-1,24,40,64}" ]]; then
  for ((r = 1; r <= ${ROUNDS:-2}; ++r)); do
    for samp in ${SAMPLING:-greedy}; do
      for pad in ${MODEL_PADS:-1 0}; do
        echo "== model pad=$pad round $r" >>"$OUT/model.txt"
        step "model $pad" 150 model.txt env PAGEDATTN_PAD_DECODE=$pad "$cli" bench model \
          --model "${MODEL_BENCH:-synthetic:llama3-8b}" --device cuda \
          --batch "${BATCHES-1,24,40,64}" --prompt-len 512 --decode-steps 32 \
          --sampling "$samp" --json
      done
    done
  done
fi
if [[ -n "${LAB_SHAPES:-}" ]]; then
  lab=$BUILD_DIR/kernels_dev/attention_decode_lab
  largs=()
  for s in $LAB_SHAPES; do largs+=(--shape "$s"); done
  for ((r = 1; r <= ${ROUNDS:-2}; ++r)); do
    for v in ${LAB_VARIANTS:-base}; do
      assigns=()
      [[ "$v" == base ]] || IFS=, read -ra assigns <<<"$v"
      echo "== lab round $r variant $v" >>"$OUT/lab.log"
      step "lab $v" 90 lab.log env "${assigns[@]}" "$lab" --sweep-only --versions 4 "${largs[@]}"
    done
  done
fi
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, os, re, sys
out = sys.argv[1]
def lines(name):
    path = os.path.join(out, name)
    tag = None
    if not os.path.exists(path):
        return
    for line in open(path):
        if line.startswith("=="):
            tag = line[3:].strip()
        elif line.startswith("{"):
            try:
                yield tag, json.loads(line)
            except ValueError:
                pass
for tag, d in lines("serve.txt"):
    steps = d.get("steps") or 0
    rep = d.get("graph_replays")
    print("%-45s out tok/s %8.1f  req/s %6.2f  steps %5d  graph captures %s replays %s (%.0f%% of "
          "steps)  idle %.1f%%" % (tag, d["output_tokens_per_s"], d["requests_per_s"], steps,
          d.get("graph_captures"), rep, 100.0 * (rep or 0) / max(steps, 1),
          100.0 * (d.get("device_idle_frac") or 0)))
for tag, d in lines("model.txt"):
    if d.get("bench") == "model":
        print("%-25s b%-3d %-7s %.3f ms/step (%.1f%% of floor) host gap %s" % (tag, d["batch"],
              d.get("sampling", ""), d["decode_ms_per_step"], d.get("pct_of_floor", 0),
              d.get("host_gap_ms_per_step")))
PY
[[ -z "${LAB_SHAPES:-}" ]] || grep -E "^== lab|^(bf16|fp8)|trace of|^gate:" "$OUT/lab.log" |
  tee -a "$OUT/summary.txt"
print_summary | tee -a "$OUT/summary.txt"
