#!/usr/bin/env bash
# One call on a machine with 2 GPUs: the tensor-parallel decode step of this tree against another
# tree's (BASE_DIR, e.g. `git archive main | tar -x -C out/ab-base`), rounds alternating, with the
# one-GPU step of this tree as the ratio's denominator; before them the peer all-reduce and
# tensor-parallel tests and the logits over two GPUs against one. Builds are incremental, so a
# second call on the same machine goes straight to what the first had no time for.
# Output under $OUT (default out/tp-reduce-ab): bench.log (JSON lines, each preceded by its
# variant), tests.log, parity.log, build.log.
#   BASE_DIR=out/ab-base scripts/device/tp-reduce-ab.sh
#   SKIP_TESTS=1 BASE_DIR=out/ab-base ROUNDS=3 scripts/device/tp-reduce-ab.sh
#   AB_VAR=PAGEDATTN_PEER_EPILOGUE scripts/device/tp-reduce-ab.sh   (this tree with VAR=0 as "off")
#   AB_ENVS="PAGEDATTN_O_BESIDE_ATTENTION=0 PAGEDATTN_PEER_ALL_REDUCE=0,PAGEDATTN_FUSE=0" \
#     scripts/device/tp-reduce-ab.sh   (this tree under each setting too, on two GPUs and one;
#     commas join the variables of one setting)
#   AB_ENVS_TP="..." / AB_ENVS_ONE="..."   (as AB_ENVS, on two GPUs only / on one GPU only)
# Environment: BASE_DIR, BASE_ONE_GPU (1: BASE_DIR's tree on one GPU too), AB_VAR, AB_ENVS,
# AB_ENVS_TP, AB_ENVS_ONE,
# ROUNDS (2), BATCHES (1,32,64), PROMPT_LEN (512), KV_DTYPE (auto: bf16; fp8), SKIP_TESTS,
# TEST_FILTER, TEST_SECS (150), HF_PARITY (1: hf_parity.py --device cuda after the tests, into
# hf_parity.log), BUDGET (560).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/steps.sh
begin_call tp-reduce-ab 560
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}  # NVLink multicast stays off on shared machines
build_cli_and_gpu_tests
bin=$BUILD_DIR/pagedattn
if [[ -z "${SKIP_TESTS:-}" ]]; then
  step tests "${TEST_SECS:-150}" tests.log "$BUILD_DIR/tests/test_gpu" \
    --gtest_filter="${TEST_FILTER:-PeerAllReduce*:TensorParallel*:LlamaCudaSynthetic.*Argmax*}"
  tail -3 "$OUT/tests.log"
  grep -E "^\[  FAILED|Failure" "$OUT/tests.log" | head -10
  step parity 120 parity.log python3 scripts/device/tp_parity.py "$bin" --tp 2
  tail -3 "$OUT/parity.log"
  if [[ -n "${HF_PARITY:-}" ]]; then
    step hf-parity 150 hf_parity.log python3 scripts/device/hf_parity.py --device cuda \
      --pagedattn "$bin" --workdir "$OUT/hf_parity_models"
    tail -8 "$OUT/hf_parity.log"
    rm -rf "$OUT/hf_parity_models"
  fi
fi
base=
if [[ -n "${BASE_DIR:-}" ]]; then
  base_tree=/tmp/pagedattn-base
  # Rebuilt only when BASE_DIR's files differ from those of the last build on this machine.
  from=$(cd "$BASE_DIR" && find . -type f -not -path './build*' -exec md5sum {} + | sort | md5sum)
  if ! [[ -x "$base_tree/build-gpu/pagedattn" && "$(cat "$base_tree/.from" 2>/dev/null)" == \
    "$from" ]]; then
    rm -rf "$base_tree" && cp -r "$BASE_DIR" "$base_tree"
    step build-base 300 build.log env BUILD_DIR="$base_tree/build-gpu" \
      DEPS_DIR="$(realpath "${DEPS_DIR:-build-cuda-deps}")" \
      bash "$base_tree/scripts/device/build.sh" pagedattn || tail -30 "$OUT/build.log"
    echo "$from" >"$base_tree/.from"
  fi
  [[ -x "$base_tree/build-gpu/pagedattn" ]] && base=$base_tree/build-gpu/pagedattn
fi
run() {  # run VARIANT BINARY TP [VAR=VALUE ...]
  echo "## $1 tp$3" >>"$OUT/bench.log"
  step "$1-tp$3" 100 bench.log env ${4:-} "$2" bench model --model synthetic:llama3-8b --device cuda \
    --batch "${BATCHES:-1,32,64}" --prompt-len "${PROMPT_LEN:-512}" --decode-steps 32 \
    --tensor-parallel "$3" --kv-cache-dtype "${KV_DTYPE:-auto}" --json
}
for round in $(seq 1 "${ROUNDS:-2}"); do
  run new "$bin" 2
  [[ -n "$base" ]] && run base "$base" 2
  [[ -n "${AB_VAR:-}" ]] && run off "$bin" 2 "$AB_VAR=0"
  for e in ${AB_ENVS:-} ${AB_ENVS_TP:-}; do run "$e" "$bin" 2 "${e//,/ }"; done
  run new "$bin" 1
  [[ -n "$base" && -n "${BASE_ONE_GPU:-}" ]] && run base "$base" 1
  for e in ${AB_ENVS:-} ${AB_ENVS_ONE:-}; do run "$e" "$bin" 1 "${e//,/ }"; done
done
python3 - "$OUT/bench.log" <<'PY' | tee "$OUT/summary.txt"
import json, sys
name = ""
for line in open(sys.argv[1]):
    if line.startswith("##"):
        name = line[3:].strip()
    elif line.startswith("{"):
        j = json.loads(line)
        print(f"{name:40s} batch {j['batch']:3d}: {j['decode_ms_per_step']:.3f} ms a step, "
              f"collectives alone {j.get('collective_ms_per_step', '-')}")
PY
print_summary
