#!/usr/bin/env bash
# Decode at batch 1 on the CPU, idle against N busy background processes (default 2), in
# alternating rounds: the engine must slow down in proportion to its share of the cores, not
# collapse. Prints each round and the ratio of the medians.
#   scripts/oversubscription.sh [--busy N] [--rounds N] [--build DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUSY=2; ROUNDS=3; BUILD=build
while [ $# -gt 0 ]; do
  case "$1" in
    --busy) BUSY=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    *) echo "usage: $0 [--busy N] [--rounds N] [--build DIR]" >&2; exit 2 ;;
  esac
done
BIN="$BUILD/pagedattn"
[ -x "$BIN" ] || { echo "$BIN not built (make build)" >&2; exit 1; }

decode_rate() {
  "$BIN" bench model --device cpu --batch 1 --prompt-len 64 --decode-steps 48 --json 2>/dev/null |
    sed -n 's/.*"decode_tokens_per_s":\([0-9.]*\).*/\1/p' | head -1
}
pids=()
stop_busy() { [ ${#pids[@]} -eq 0 ] || kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; pids=(); }
trap stop_busy EXIT

idle=(); loaded=()
for r in $(seq "$ROUNDS"); do
  idle+=("$(decode_rate)")
  for _ in $(seq "$BUSY"); do ( while :; do :; done ) & pids+=($!); done
  sleep 2
  loaded+=("$(decode_rate)")
  stop_busy; sleep 1
  echo "round $r: idle ${idle[-1]} tok/s, with $BUSY busy processes ${loaded[-1]} tok/s"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mi=$(median "${idle[@]}"); ml=$(median "${loaded[@]}")
awk -v i="$mi" -v l="$ml" -v b="$BUSY" -v n="$(nproc)" 'BEGIN {
  printf "median: idle %.1f tok/s, loaded %.1f tok/s: %.2fx slower (a fair share of %d cores among %d busy threads would be %.2fx)\n",
    i, l, i / l, n, n + b, (n + b) / n }'
