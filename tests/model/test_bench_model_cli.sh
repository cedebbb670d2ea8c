#!/usr/bin/env bash
# `bench model` on the CPU: its warm-up steps (--warmup-steps) untimed before the timed ones, the
# smallest runs (a 1-token prompt, no warm-up: its own warm-up request still fits), and clear
# refusals of what cannot run: usage: test_bench_model_cli.sh BIN
set -uo pipefail
bin=$1
fail=0
check() {  # check "what" "needle" command...: exit 0 and the needle in the output
  local what=$1 needle=$2 out rc
  shift 2
  out=$("$@" 2>&1)
  rc=$?
  if [[ $rc -ne 0 || "$out" != *"$needle"* ]]; then
    echo "FAIL: $what: rc=$rc, wanted '$needle' in: $out"
    fail=1
  else
    echo "ok: $what"
  fi
}
refuse() {  # refuse "what" "needle" command...: a failure naming the needle
  local what=$1 needle=$2 out rc
  shift 2
  out=$("$@" 2>&1)
  rc=$?
  if [[ $rc -eq 0 || "$out" != *"$needle"* ]]; then
    echo "FAIL: $what: rc=$rc, wanted a refusal naming '$needle' in: $out"
    fail=1
  else
    echo "ok: $what"
  fi
}
tiny=(bench model --model synthetic:tiny --device cpu --json)
check "a 1-token prompt, one step, no warm-up" '"decode_steps":1,"warmup_steps":0' \
  "$bin" "${tiny[@]}" --batch 1 --prompt-len 1 --decode-steps 1 --warmup-steps 0
check "the default warm-up" '"warmup_steps":16' "$bin" "${tiny[@]}" --batch 2 --prompt-len 8 \
  --decode-steps 3
check "the table names the untimed steps" "decode 3 steps (after 5 untimed)" \
  "$bin" bench model --model synthetic:tiny --device cpu --batch 1 --prompt-len 4 \
  --decode-steps 3 --warmup-steps 5
refuse "a negative warm-up" "--warmup-steps" "$bin" "${tiny[@]}" --warmup-steps -1
refuse "sequences past 32 bits" "too long" "$bin" "${tiny[@]}" --prompt-len 2000000000 \
  --decode-steps 2000000000
exit $fail
