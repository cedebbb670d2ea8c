#!/usr/bin/env bash
# What a work of the Hopper prefill kernel costs beyond its tiles: chunks of CHUNK queries (default
# 128) at the end of contexts of 512-8192 positions, the batch sized so that every shape holds
# about the same number of 128-key tiles (132 x 256 at a chunk of 128) in works of 4-64 tiles.
# A line per shape and round; fit time = tiles x a + works x b over the shapes (works_fit.py).
#   scripts/device/prefill-works.sh
#   ENVS="PAGEDATTN_HOPPER_CTAS=0 -" scripts/device/prefill-works.sh
#   BINS="new=build-gpu/kernels_dev/bench_attention_cuda_main base=/tmp/base/..." \
#     scripts/device/prefill-works.sh    # two builds (e.g. the one decode-ab.sh made of BASE_DIR)
# Environment: SHAPES (batch:context pairs), CHUNK, ROUNDS (2), ENVS (settings compared, `-` none),
# BINS (name=binary pairs; default this tree's build), HEAD_DIM (128), KV (bf16), SKIP_BUILD.
# Writes works.log and works.jsonl (one object per result, with its env, bin and round).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/steps.sh
begin_call prefill-works 540
if [[ -z "${SKIP_BUILD:-}" ]]; then
  step build 300 build.log env BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh \
    bench_attention_cuda_main || { tail -30 "$OUT/build.log"; print_summary; exit 1; }
fi
if [[ -f "$BUILD_DIR/deps-env.sh" ]]; then source "$BUILD_DIR/deps-env.sh"; fi
bins=${BINS:-"new=$BUILD_DIR/kernels_dev/bench_attention_cuda_main"}
shapes=${SHAPES:-"264:512 132:1024 66:2048 33:4096 16:8192"}
for r in $(seq "${ROUNDS:-2}"); do
  for e in ${ENVS:--}; do
    for b in $bins; do
      for s in $shapes; do
        env_args=()
        [[ "$e" == - ]] || env_args=("$e")
        step "r$r $e ${b%%=*} $s" 60 works.log env "${env_args[@]}" "${b#*=}" --mode prefill \
          --page-size 16 --iters 12 --batch "${s%%:*}" --context "${s##*:}" \
          --prefill-chunk "${CHUNK:-128}" --num-kv-heads 8 --head-dim "${HEAD_DIM:-128}" \
          --kv-dtype "${KV:-bf16}" --json
        grep '^{' "$OUT/works.log" | tail -1 |
          sed "s/^{/{\"env\":\"$e\",\"bin\":\"${b%%=*}\",\"round\":$r,/" >>"$OUT/works.jsonl"
      done
    done
  done
done
print_summary
