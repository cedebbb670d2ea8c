#!/usr/bin/env bash
# The CLI's tensor-parallel options refuse what cannot run, with a message that says why, and the
# binary never links NCCL (it is loaded when a group starts): usage: test_tensor_parallel_cli.sh BIN
set -uo pipefail
bin=$1
fail=0
expect() {  # expect "what" "needle" command...
  local what=$1 needle=$2 out rc
  shift 2
  out=$("$@" 2>&1)
  rc=$?
  # A build without CUDA refuses every tensor-parallel command up front.
  if [[ $rc -ne 0 && "$out" == *"built without CUDA support"* ]]; then
    echo "ok: $what (built without CUDA)"
  elif [[ $rc -eq 0 || "$out" != *"$needle"* ]]; then
    echo "FAIL: $what: rc=$rc, wanted '$needle' in: $out"
    fail=1
  else
    echo "ok: $what"
  fi
}
expect "--tensor-parallel on the CPU" "needs --device cuda" \
  "$bin" bench model --model synthetic:tiny --device cpu --tensor-parallel 2 --batch 1
expect "--tensor-parallel 0" "--tensor-parallel" \
  "$bin" bench model --model synthetic:tiny --device cpu --tensor-parallel 0
expect "a worker without its group" "rank 0" \
  "$bin" tp-worker --rank 1 --world-size 2 --init-addr 127.0.0.1:1 --connect-timeout 1
expect "a worker with a bad address" "is not host:port" \
  "$bin" tp-worker --rank 1 --world-size 2 --init-addr nohost
expect "--world-size without --init-addr" "needs --init-addr" \
  "$bin" serve --model synthetic:tiny --device cuda --world-size 2
if readelf -d "$bin" | grep NEEDED | grep -q libnccl; then
  echo "FAIL: the binary links libnccl"
  fail=1
fi
exit $fail
