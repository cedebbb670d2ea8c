#!/usr/bin/env bash
# Side-by-side CPU benchmark of pagedattn and llama.cpp on the same GGUF file and thread count.
#
# llama.cpp is built from the PyPI source package of llama-cpp-python (its vendored llama.cpp),
# downloaded with pip and compiled with cmake into build-llamacpp/ (ignored by git; minutes on 2
# cores, once). Then, in interleaved rounds (pagedattn, llama.cpp, pagedattn, ...), both run:
#   prefill of a 512-token prompt, decode of 128 tokens for 1 sequence and for 8 sequences,
#   and the peak resident memory of a single-sequence run (GNU time's maximum RSS).
# Both keep K/V in f16: llama.cpp's default cache type, and pagedattn's --kv-cache-dtype f16
# (--kv-cache-dtype auto|f32|bf16 compares another pagedattn cache against it).
# It prints every round, the medians and the ratios pagedattn / llama.cpp. Not part of make test.
#
# Usage: scripts/compare-llamacpp.sh [--model FILE] [--threads N] [--rounds N] [--build DIR]
#                                    [--llamacpp-version V] [--kv-cache-dtype T] [--build-only]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/default-model.sh"
MODEL="$root/models/$DEFAULT_MODEL_NAME"
THREADS=$(nproc)
ROUNDS=3
BUILD="$root/build"
LLAMA_VERSION=0.3.16
BUILD_ONLY=0
PROMPT=512
DECODE=128
KV_DTYPE=f16
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --build) BUILD="$2"; shift 2 ;;
    --llamacpp-version) LLAMA_VERSION="$2"; shift 2 ;;
    --kv-cache-dtype) KV_DTYPE="$2"; shift 2 ;;
    --build-only) BUILD_ONLY=1; shift ;;
    *) echo "compare-llamacpp: unknown argument $1" >&2; exit 2 ;;
  esac
done

out="$root/build-llamacpp"
src="$out/llama-cpp-python-$LLAMA_VERSION/vendor/llama.cpp"
bin="$out/bin-$LLAMA_VERSION"

# 1. llama.cpp, once.
if [ ! -x "$bin/bin/llama-bench" ] || [ ! -x "$bin/bin/llama-batched-bench" ]; then
  mkdir -p "$out"
  if [ ! -d "$src" ]; then
    echo "compare-llamacpp: downloading llama-cpp-python==$LLAMA_VERSION (source)" >&2
    python3 -m pip download --quiet --no-binary :all: --no-deps --disable-pip-version-check \
      "llama-cpp-python==$LLAMA_VERSION" -d "$out"
    tar -xzf "$out/llama_cpp_python-$LLAMA_VERSION.tar.gz" -C "$out"
    [ -d "$out/llama_cpp_python-$LLAMA_VERSION" ] &&
      mv "$out/llama_cpp_python-$LLAMA_VERSION" "$out/llama-cpp-python-$LLAMA_VERSION"
  fi
  echo "compare-llamacpp: building llama.cpp (minutes)" >&2
  cmake -S "$src" -B "$bin" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DGGML_OPENMP=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
  cmake --build "$bin" -j "$(nproc)" --target llama-bench llama-batched-bench >/dev/null
fi
[ "$BUILD_ONLY" = 1 ] && { echo "compare-llamacpp: llama.cpp is in $bin/bin"; exit 0; }

PA="$BUILD/pagedattn"
[ -x "$PA" ] || { echo "compare-llamacpp: $PA is missing (make build)" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "compare-llamacpp: $MODEL is missing (make models)" >&2; exit 1; }
LB="$bin/bin/llama-bench"
LBB="$bin/bin/llama-batched-bench"
export PAGEDATTN_NUM_THREADS=$THREADS

# Each function prints one number.
pa_prefill() {
  "$PA" bench model --device cpu --model "$MODEL" --batch 1 --prompt-len $PROMPT \
    --decode-steps 1 --kv-cache-dtype "$KV_DTYPE" --json | python3 -c 'import json,sys
for l in sys.stdin:
    l=l.strip()
    if l.startswith("{"): print(json.loads(l)["prefill_tokens_per_s"])'
}
pa_decode() {  # $1: sequences
  "$PA" bench model --device cpu --model "$MODEL" --batch "$1" --prompt-len $PROMPT \
    --decode-steps $DECODE --kv-cache-dtype "$KV_DTYPE" --json | python3 -c 'import json,sys
for l in sys.stdin:
    l=l.strip()
    if l.startswith("{"): print(json.loads(l)["decode_tokens_per_s"])'
}
ll_prefill() {
  "$LB" -m "$MODEL" -t "$THREADS" -p $PROMPT -n 0 -r 1 -o json 2>/dev/null | python3 -c '
import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])'
}
ll_decode1() {  # decode after a 512-token prompt, one sequence
  "$LB" -m "$MODEL" -t "$THREADS" -pg $PROMPT,$DECODE -p 0 -n 0 -r 1 -o json 2>/dev/null |
    python3 -c 'import json,sys
r=json.load(sys.stdin)[0]; print(r["avg_ts"])' >/dev/null
  # llama-bench's pg test reports the combined rate; use the batched bench for the decode rate.
  "$LBB" -m "$MODEL" -t "$THREADS" -c $((PROMPT + DECODE + 16)) -npp $PROMPT -ntg $DECODE -npl 1 \
    --output-format jsonl 2>/dev/null | python3 -c 'import json,sys
for l in sys.stdin:
    l=l.strip()
    if l.startswith("{"): print(json.loads(l)["speed_tg"])'
}
ll_decode() {  # $1: sequences, each with its own 512-token prompt
  "$LBB" -m "$MODEL" -t "$THREADS" -c $(((PROMPT + DECODE + 16) * $1)) -npp $PROMPT \
    -ntg $DECODE -npl "$1" --output-format jsonl 2>/dev/null | python3 -c 'import json,sys
for l in sys.stdin:
    l=l.strip()
    if l.startswith("{"): print(json.loads(l)["speed_tg"])'
}
peak_rss_mib() {  # the command's maximum resident set, MiB
  /usr/bin/time -f "%M" "$@" 2>&1 >/dev/null | tail -1 | awk '{printf "%.0f\n", $1 / 1024}'
}
pa_rss() {
  peak_rss_mib "$PA" bench model --device cpu --model "$MODEL" --batch 1 --prompt-len $PROMPT \
    --decode-steps $DECODE --kv-cache-dtype "$KV_DTYPE"
}
ll_rss() {
  peak_rss_mib "$LBB" -m "$MODEL" -t "$THREADS" -c $((PROMPT + DECODE + 16)) -npp $PROMPT \
    -ntg $DECODE -npl 1
}

declare -A R
metrics="prefill decode1 decode8 rss"
echo "compare-llamacpp: $MODEL, $THREADS threads, $ROUNDS rounds, pagedattn KV $KV_DTYPE, load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$ROUNDS"); do
  R[pa_prefill]+="$(pa_prefill) "; R[ll_prefill]+="$(ll_prefill) "
  R[pa_decode1]+="$(pa_decode 1) "; R[ll_decode1]+="$(ll_decode1) "
  R[pa_decode8]+="$(pa_decode 8) "; R[ll_decode8]+="$(ll_decode 8) "
  R[pa_rss]+="$(pa_rss) "; R[ll_rss]+="$(ll_rss) "
  echo "round $r done (load $(cut -d' ' -f1 /proc/loadavg))" >&2
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
printf "\n%-34s %12s %12s %8s\n" "metric (median of $ROUNDS)" pagedattn llama.cpp ratio
for m in $metrics; do
  pa=$(echo "${R[pa_$m]}" | median); ll=$(echo "${R[ll_$m]}" | median)
  case $m in
    prefill) label="prefill $PROMPT tokens (tok/s)" ;;
    decode1) label="decode $DECODE, 1 sequence (tok/s)" ;;
    decode8) label="decode $DECODE, 8 sequences (tok/s)" ;;
    rss) label="peak RSS, 1 sequence (MiB)" ;;
  esac
  printf "%-34s %12.1f %12.1f %7.2fx\n" "$label" "$pa" "$ll" "$(echo "$pa / $ll" | bc -l)"
  echo "  rounds: pagedattn ${R[pa_$m]}| llama.cpp ${R[ll_$m]}"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
