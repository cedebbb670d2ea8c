# Sourced by the GPU call scripts: `step NAME SECONDS LOG command...` runs a command with its output
# appended to $OUT/LOG, never past the call's deadline $end (seconds since the epoch), and records
# a line of the summary (`print_summary`). A step with under 5 s left is skipped.
summary=()
step() {
  local name=$1 secs=$2 log=$3 t0 rc
  shift 3
  t0=$(date +%s)
  if ((t0 + secs > end)); then secs=$((end - t0)); fi
  if ((secs < 5)); then
    summary+=("$(printf '%-10s skipped (no time left)' "$name")")
    return 1
  fi
  timeout "$secs" "$@" >>"$OUT/$log" 2>&1
  rc=$?
  summary+=("$(printf '%-10s rc=%-4s %4ss' "$name" "$rc" "$(($(date +%s) - t0))")")
  return $rc
}
print_summary() { echo "== summary"; printf '%s\n' "${summary[@]}"; }
# The machine, the driver and the compiler, into $OUT/device.txt and on stdout.
record_device() {
  {
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    nvcc --version | tail -1
  } >"$OUT/device.txt" 2>&1
  cat "$OUT/device.txt"
}
