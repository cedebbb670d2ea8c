#!/usr/bin/env bash
# One GPU call: this tree's decode step against another tree's (BASE_DIR, e.g. `git archive main |
# tar -x -C out/ab-base`), and against this tree run under VARIANT_ENV (e.g.
# PAGEDATTN_FOLD_NORM=0: a switch's other side), rounds alternating; the GPU tests named by
# GPU_FILTER first. `bench model --prompt-len 512 --decode-steps 32` on synthetic:llama3-8b at
# BATCHES and synthetic:smollm2-135m at SMOL_BATCHES. Output under $OUT (default out/model-ab):
# bench.log (JSON lines, each preceded by its variant), summary.txt, test_gpu.log, build.log.
#   BASE_DIR=out/ab-base VARIANT_ENV=PAGEDATTN_FOLD_NORM=0 GPU_FILTER='WgmmaGemm*:LlamaCuda*' \
#     scripts/device/model-ab.sh
# Environment: BASE_DIR, VARIANT_ENV, ROUNDS (2), ORDER (the runs of a round: "base new variant"),
# BATCHES (1,32,64), SMOL_BATCHES (1; empty: none), GPU_FILTER (empty: no tests), BUDGET (560).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/steps.sh
begin_call model-ab 560
build_cli_and_gpu_tests
bin=$BUILD_DIR/pagedattn
[[ -z "${GPU_FILTER:-}" ]] || run_gpu_suite
base=
if [[ -n "${BASE_DIR:-}" ]]; then
  base_tree=/tmp/pagedattn-base
  rm -rf "$base_tree" && cp -r "$BASE_DIR" "$base_tree"
  step build-base 300 build.log env BUILD_DIR="$base_tree/build-gpu" \
    DEPS_DIR="$(realpath "${DEPS_DIR:-build-cuda-deps}")" \
    bash "$base_tree/scripts/device/build.sh" pagedattn || tail -30 "$OUT/build.log"
  [[ -x "$base_tree/build-gpu/pagedattn" ]] && base=$base_tree/build-gpu/pagedattn
fi
run() {  # run VARIANT BINARY [ENV=VALUE]
  local name=$1 binary=$2
  shift 2
  echo "## $name" >>"$OUT/bench.log"
  step "$name-8b" 120 bench.log env "$@" "$binary" bench model --model synthetic:llama3-8b \
    --device cuda --batch "${BATCHES:-1,32,64}" --prompt-len 512 --decode-steps 32 --json
  if [[ -n "${SMOL_BATCHES-1}" ]]; then
    echo "## $name" >>"$OUT/bench.log"
    step "$name-smol" 60 bench.log env "$@" "$binary" bench model \
      --model synthetic:smollm2-135m --device cuda --batch "${SMOL_BATCHES-1}" --prompt-len 512 \
      --decode-steps 64 --json
  fi
}
for round in $(seq 1 "${ROUNDS:-2}"); do
  for who in ${ORDER:-base new variant}; do
    case $who in
      base) [[ -n "$base" ]] && run base "$base" ;;
      new) run new "$bin" ;;
      variant) [[ -n "${VARIANT_ENV:-}" ]] && run "${VARIANT_ENV}" "$bin" "$VARIANT_ENV" ;;
    esac
  done
done
python3 - "$OUT/bench.log" <<'PY' | tee "$OUT/summary.txt"
import json, sys
name = ""
rows = {}
for line in open(sys.argv[1]):
    if line.startswith("##"):
        name = line[3:].strip()
    elif line.startswith("{"):
        j = json.loads(line)
        key = (j["model"], j["batch"])
        rows.setdefault(key, {}).setdefault(name, []).append(
            "%.3f (%s%%)" % (j["decode_ms_per_step"], j.get("pct_of_floor", "-")))
for (model, batch), by in rows.items():
    print(f"{model} batch {batch}:")
    for name, vals in by.items():
        print(f"  {name:28s} {' / '.join(vals)}")
PY
print_summary
