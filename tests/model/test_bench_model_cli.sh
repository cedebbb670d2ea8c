#!/usr/bin/env bash
# `bench model` on the CPU: its warm-up steps (--warmup-steps) untimed before the timed ones, the
# smallest runs (a 1-token prompt, no warm-up: its own warm-up request still fits), and clear
# refusals of what cannot run: usage: test_bench_model_cli.sh BIN
set -uo pipefail
bin=$1
fail=0
expect() {  # expect "what" ok|refused "needle" command...: that exit and the needle in the output
  local what=$1 want=$2 needle=$3 out rc
  shift 3
  out=$("$@" 2>&1)
  rc=$?
  local got=refused
  [[ $rc -eq 0 ]] && got=ok
  if [[ $got != "$want" || "$out" != *"$needle"* ]]; then
    echo "FAIL: $what: rc=$rc, wanted $want with '$needle' in: $out"
    fail=1
  else
    echo "ok: $what"
  fi
}
tiny=(bench model --model synthetic:tiny --device cpu --json)
expect "a 1-token prompt, one step, no warm-up" ok '"decode_steps":1,"warmup_steps":0' \
  "$bin" "${tiny[@]}" --batch 1 --prompt-len 1 --decode-steps 1 --warmup-steps 0
expect "the default warm-up" ok '"warmup_steps":16' "$bin" "${tiny[@]}" --batch 2 --prompt-len 8 \
  --decode-steps 3
expect "the table names the untimed steps" ok "decode 3 steps (after 5 untimed)" \
  "$bin" bench model --model synthetic:tiny --device cpu --batch 1 --prompt-len 4 \
  --decode-steps 3 --warmup-steps 5
expect "a negative warm-up" refused "--warmup-steps" "$bin" "${tiny[@]}" --warmup-steps -1
expect "sequences past 32 bits" refused "too long" "$bin" "${tiny[@]}" --prompt-len 2000000000 \
  --decode-steps 2000000000
exit $fail
