#!/usr/bin/env bash
# fp8 K/V with tensor parallelism, one call on a machine with 2 GPUs: the tensor-parallel and fp8
# GPU tests, the CLI's logits over two GPUs against one with fp8 caches on both (each run
# calibrating its own scales: rank 0's engine and the worker processes' frames), then `bench
# model` on one and two GPUs with bf16 and fp8 caches, rounds alternating.
# Output under $OUT (default out/tp-fp8): tests.log, parity.log, bench.log (JSON lines, each
# preceded by its variant), build.log.
#   scripts/device/tp-fp8.sh
# Environment: ROUNDS (2), BATCHES (1,32,64), PROMPT_LEN (512), TEST_FILTER, BUDGET (560).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/steps.sh
begin_call tp-fp8 560
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}  # NVLink multicast stays off on shared machines
build_cli_and_gpu_tests
bin=$BUILD_DIR/pagedattn
step tests 200 tests.log "$BUILD_DIR/tests/test_gpu" \
  --gtest_filter="${TEST_FILTER:-TensorParallel*:PeerAllReduce*:*Fp8Kv*}"
tail -3 "$OUT/tests.log"
grep -E "^\[  FAILED|Failure|fp8 K/V" "$OUT/tests.log" | head -20
for kv in fp8 bf16; do
  # (fp8: each run's own scales move its roundings, hence the wider tolerance; the line also
  # gives what fp8 moves on one GPU.)
  step "parity-$kv" 150 parity.log python3 scripts/device/tp_parity.py "$bin" --tp 2 \
    --kv-cache-dtype "$kv" $([[ $kv == fp8 ]] && echo "--tol 0.1")
done
tail -2 "$OUT/parity.log"
run() {  # run KV TP
  echo "## $1 tp$2" >>"$OUT/bench.log"
  step "$1-tp$2" 120 bench.log "$bin" bench model --model synthetic:llama3-8b --device cuda \
    --batch "${BATCHES:-1,32,64}" --prompt-len "${PROMPT_LEN:-512}" --decode-steps 32 \
    --tensor-parallel "$2" --kv-cache-dtype "$1" --json
}
for round in $(seq 1 "${ROUNDS:-2}"); do
  for kv in fp8 bf16; do
    run "$kv" 2
    run "$kv" 1
  done
done
python3 - "$OUT/bench.log" <<'PY'
import json, sys
variant = None
for line in open(sys.argv[1]):
    if line.startswith("## "):
        variant = line[3:].strip()
    elif line.startswith("{"):
        r = json.loads(line)
        print(f"{variant:10s} batch {r.get('batch')}: {r.get('decode_ms_per_step')} ms a step")
PY
print_summary
