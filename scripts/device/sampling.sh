#!/usr/bin/env bash
# One GPU call for sampling on the device: builds the CLI and the GPU tests, runs the sampler's
# tests (against the host twin and the chi-square test) and the rest of the GPU suite, then
# `bench model` on a synthetic Llama-3-8B at batch 1, 32 and 64: greedy steps against steps of the
# non-greedy mix (temperature 0.8, top-p 0.95, top-k 50, repetition penalty 1.1, logprobs 5)
# sampled on the device, and the same mix picked on the host (logits downloaded) for comparison;
# then `bench serve` (workload A at rate inf) with greedy and with mixed requests.
# Each bench prints its step next to the memory floor measured in the same run.
#   scripts/device/sampling.sh
#   GPU_FILTER='SamplingCuda*' SKIP_MODEL=1 scripts/device/sampling.sh
# Also runs the sampler's kernel lab (kernels_dev/sampler.cu) after its tests, unless SKIP_LAB.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out/sampling}
BUILD_DIR=${BUILD_DIR:-build-gpu}
MODEL=${MODEL:-synthetic:llama3-8b}
mkdir -p "$OUT"
end=$(($(date +%s) + ${BUDGET:-560}))
source scripts/device/steps.sh
record_device

build_cli_and_gpu_tests
step sampler 120 test_sampler.log "$BUILD_DIR/tests/test_gpu" --gtest_filter='SamplingCuda*'
tail -4 "$OUT/test_sampler.log" 2>/dev/null
grep -E "^\[  FAILED|Failure|error" -A6 "$OUT/test_sampler.log" 2>/dev/null | head -40
# The kernel lab: the sampler's gate against the host twin, then its timing by cluster size.
if [[ -z "${SKIP_LAB:-}" ]]; then
  step build-lab 120 build.log env BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh \
    sampler_lab || tail -30 "$OUT/build.log"
  step lab 120 sampler_lab.log "$BUILD_DIR/kernels_dev/sampler_lab" --json
  grep -v '^{' "$OUT/sampler_lab.log" 2>/dev/null | tail -40
fi
run_gpu_suite
[[ -n "${SKIP_MODEL:-}" ]] && { print_summary; exit 0; }
B="$BUILD_DIR/pagedattn"
# Greedy and mixed alternately, REPEAT times (the table below takes the medians).
for rep in $(seq "${REPEAT:-3}"); do
  for s in greedy mixed; do
    step "bench-$s" 100 bench_model.log "$B" bench model --model "$MODEL" --device cuda \
      --batch 1,32,64 --prompt-len 512 --decode-steps 64 --sampling "$s" --json
  done
done
step bench-host 100 bench_model.log "$B" bench model --model "$MODEL" --device cuda \
  --batch 32 --prompt-len 512 --decode-steps 32 --sampling mixed --host-argmax --json
grep -h '^{' "$OUT/bench_model.log" >"$OUT/bench_model.jsonl" 2>/dev/null
python3 - "$OUT/bench_model.jsonl" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs.setdefault((r["sampling"], r["host_argmax"], r["batch"]), []).append(r)
greedy = {}
for (s, host, b), rs in sorted(runs.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])):
    ms = statistics.median(r["decode_ms_per_step"] for r in rs)
    floor = statistics.median(r["floor_ms_per_step"] for r in rs)
    if s == "greedy" and not host:
        greedy[b] = ms
    extra = ""
    if b in greedy and s != "greedy":
        extra = f", {100 * (ms / greedy[b] - 1):+.1f}% vs greedy"
    print(f"{s:7s} host={str(host):5s} batch {b:3d}: {ms:.3f} ms/step (median of {len(rs)}), "
          f"{100 * floor / ms:.1f}% of floor{extra}")
PY
# Serving: workload A of docs/BENCHMARKS.md ("Serving on CUDA") at rate inf, paged, greedy
# requests against the same requests sampled with the mix.
for s in greedy mixed; do
  step "serve-$s" 120 serve.log "$B" bench serve --model "$MODEL" --device cuda --mode paged \
    --request-rate inf --num-requests 128 --prompt-len uniform:64:512 \
    --output-len lognormal:128:0.8:512 --kv-tokens 16384 --max-num-seqs 64 \
    --max-num-batched-tokens 2048 --seed 1 --sampling "$s" --json --no-progress
done
grep -h '^{' "$OUT/serve.log" >"$OUT/serve.jsonl" 2>/dev/null
python3 - "$OUT/serve.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"serve {r['sampling']:7s}: {r['requests_per_s']:.2f} req/s, "
          f"{r['output_tokens_per_s']:.0f} out tok/s (steady {r['steady_output_tokens_per_s']:.0f}), "
          f"TPOT p50 {1e3 * r['tpot_s']['p50']:.1f} ms, preemptions {r['preemptions']}, "
          f"device idle {100 * (r['device_idle_frac'] or 0):.1f}% of the run")
PY
# The sampler kernel alone (one launch of a timed step), and the greedy argmax for comparison.
for b in 1 32 64; do
  step "ncu-$b" 60 ncu.log ncu --kernel-name regex:'sample_rows|argmax_rows' --launch-skip 15 \
    --launch-count 1 --metrics gpu__time_duration.sum "$B" bench model --model "$MODEL" \
    --device cuda --batch "$b" --prompt-len 512 --decode-steps 16 --sampling mixed
  step "ncu-g$b" 60 ncu.log ncu --kernel-name regex:'argmax_rows' --launch-skip 15 \
    --launch-count 1 --metrics gpu__time_duration.sum "$B" bench model --model "$MODEL" \
    --device cuda --batch "$b" --prompt-len 512 --decode-steps 16 --sampling greedy
done
grep -E "sample_rows|argmax_rows|gpu__time_duration" "$OUT/ncu.log" | head -20
print_summary
