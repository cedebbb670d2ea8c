#!/usr/bin/env bash
# Fuzzes one libFuzzer target for a bounded time, starting from its seed corpus.
#   run_fuzz.sh BINARY SEED_DIR WORK_DIR SECONDS [extra libFuzzer flags...]
# New inputs go to WORK_DIR/corpus (never into the source tree); a crash, leak, timeout (one input
# over 10 s) or out-of-memory (2 GB) is written to WORK_DIR/ and fails the run: copy it to
# tests/fuzz/regressions/<target>/ and fix it.
set -euo pipefail
bin="$1" seeds="$2" work="$3" seconds="$4"
shift 4
mkdir -p "$work/corpus"
dict=()
[ -f "$seeds/../../$(basename "$seeds").dict" ] && dict=(-dict="$seeds/../../$(basename "$seeds").dict")
exec "$bin" "$work/corpus" "$seeds" "${dict[@]}" -max_total_time="$seconds" -timeout=10 \
  -rss_limit_mb=2048 -max_len=65536 -artifact_prefix="$work/" -print_final_stats=1 "$@"
