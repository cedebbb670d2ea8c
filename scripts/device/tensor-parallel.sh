#!/usr/bin/env bash
# One call on a machine with 2 or more GPUs: builds the CLI and the GPU tests, runs the tensor-
# parallel tests (a thread per rank against the single-GPU runner) and the peer-memory
# all-reduce's, the CLI's logits over two GPUs against one (synthetic Llama-3-8B, and a small
# quantised GGUF file written here), then `bench model` with --tensor-parallel 2 against one GPU on Llama-3-8B shapes
# (the collectives' time per step reported; once more with PAGEDATTN_PEER_ALL_REDUCE=0, all
# through NCCL), a rank killed in the middle of a run (the group must end with an error, not
# hang), and Llama-3-70B shapes over two GPUs. Logs go to $OUT (default ./out/tp); a summary is
# last.
#   scripts/device/tensor-parallel.sh
#   BUDGET=500 SKIP_70B=1 scripts/device/tensor-parallel.sh
# Environment: BUDGET, SKIP_70B, SKIP_KILL, SKIP_PARITY_8B (the GGUF file's parity only), TP_BATCHES
# (the Llama-3-8B batches, default 1,32,64).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out/tp}
BUILD_DIR=${BUILD_DIR:-build-gpu}
mkdir -p "$OUT"
end=$(($(date +%s) + ${BUDGET:-540}))
source scripts/device/steps.sh
# NOTE: NVLink multicast (NVLS) stays off on shared machines; workers inherit this environment.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  nvidia-smi topo -m
  env | grep -E '^NCCL' || true
  ls /usr/local/cuda/lib*/libnccl* 2>/dev/null || true
} >"$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

step build 240 build.log env BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh pagedattn \
  test_gpu || tail -30 "$OUT/build.log"
if [[ -f "$BUILD_DIR/deps-env.sh" ]]; then source "$BUILD_DIR/deps-env.sh"; fi
bin="$BUILD_DIR/pagedattn"

step tptests 120 tests.log "$BUILD_DIR/tests/test_gpu" --gtest_filter='TensorParallel*:PeerAllReduce*'
tail -4 "$OUT/tests.log"
grep -E "^\[  FAILED|Failure|error" "$OUT/tests.log" | head -20

if [[ -z "${SKIP_PARITY_8B:-}" ]]; then
  step parity 100 parity.log python3 scripts/device/tp_parity.py "$bin" --tp 2
  step parity-nographs 100 parity.log env PAGEDATTN_CUDA_GRAPHS=0 python3 \
    scripts/device/tp_parity.py "$bin" --tp 2
fi
# A quantised GGUF file through the CLI's worker processes (each rank dequantises its slice).
step gguf-make 30 parity.log python3 scripts/device/make_gguf_model.py "$OUT/model.gguf"
vocab=$(tail -1 "$OUT/parity.log")
step parity-gguf 100 parity.log python3 scripts/device/tp_parity.py "$bin" --tp 2 \
  --model "$OUT/model.gguf" --ids "1:$vocab" --tol 1e-2
rm -f "$OUT/model.gguf"
tail -6 "$OUT/parity.log"

for tp in 1 2; do
  step "8b-tp$tp" 90 bench.log "$bin" bench model --model synthetic:llama3-8b --device cuda \
    --batch "${TP_BATCHES:-1,32,64}" --prompt-len 512 --decode-steps 32 --tensor-parallel "$tp" \
    --json
done
# The same split with every all-reduce through NCCL (no peer-memory kernel), for comparison.
step 8b-tp2-nccl 90 bench.log env PAGEDATTN_PEER_ALL_REDUCE=0 "$bin" bench model \
  --model synthetic:llama3-8b --device cuda --batch "${TP_BATCHES:-1,32,64}" --prompt-len 512 \
  --decode-steps 32 --tensor-parallel 2 --json
step 8b-tp2-nographs 90 bench.log "$bin" bench model --model synthetic:llama3-8b --device cuda \
  --batch "${TP_BATCHES:-1,32,64}" --prompt-len 512 --decode-steps 32 --tensor-parallel 2 --json \
  --no-cuda-graphs
grep '^{' "$OUT/bench.log"

# A rank dies mid-run: the leader must stop with an error naming it, within seconds.
kill_test() {
  "$bin" bench model --model synthetic:llama3-8b --device cuda --batch 8 --prompt-len 512 \
    --decode-steps 8000 --tensor-parallel 2 >"$OUT/kill.out" 2>&1 &
  local leader=$! t0
  sleep 20
  grep -q "kv cache" "$OUT/kill.out" || { echo "the run had not started decoding:"; cat "$OUT/kill.out"; }
  pkill -9 -f 'tp-worke[r] --rank 1' && echo "killed rank 1 at $(date +%T)"
  t0=$(date +%s)
  for _ in $(seq 1 60); do kill -0 "$leader" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$leader" 2>/dev/null; then
    echo "HANG: the leader is still running $(($(date +%s) - t0)) s after the kill"
    kill -9 "$leader"
    return 1
  fi
  wait "$leader"
  echo "leader exited with rc=$? $(($(date +%s) - t0)) s after the kill"
  tail -5 "$OUT/kill.out"
}
export -f kill_test
export bin OUT
[[ -n "${SKIP_KILL:-}" ]] || step kill 70 kill.log bash -c kill_test
cat "$OUT/kill.log" 2>/dev/null

# Nothing of a finished run may stay behind (a leftover rank holds its GPU's memory).
pgrep -af 'pagedattn' | grep -v tensor-parallel.sh || echo "no pagedattn process left"
[[ -n "${SKIP_70B:-}" ]] ||
  step 70b 150 bench70.log "$bin" bench model --model synthetic:llama3-70b --device cuda \
    --batch 1,32 --prompt-len 512 --decode-steps 16 --tensor-parallel 2
cat "$OUT/bench70.log" 2>/dev/null | tail -6
print_summary
