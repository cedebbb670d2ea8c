#!/usr/bin/env bash
# One GPU call for the scheduler on CUDA: builds the CLI and the GPU tests, runs the GPU suite
# (the swap copy kernel's byte-for-byte test among them), then `bench serve` on a synthetic
# Llama-3-8B: the issue's default workload with every preemption policy (recompute against swap),
# and the admission sweep (fixed, uniform, lognormal, pareto outputs at KV budgets of 1x, 2x and
# 4x) against the static baseline. Logs and JSON lines go to $OUT (default ./out/swap).
#   scripts/device/swap-serve.sh
#   BUDGET=500 SKIP_GPU_TESTS=1 scripts/device/swap-serve.sh
#   GPU_FILTER='CudaKvSwap*' SKIP_SWEEP=1 scripts/device/swap-serve.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out/swap}
BUILD_DIR=${BUILD_DIR:-build-gpu}
MODEL=${MODEL:-synthetic:llama3-8b}
mkdir -p "$OUT"
end=$(($(date +%s) + ${BUDGET:-560}))
source scripts/device/steps.sh
record_device

build_cli_and_gpu_tests
run_gpu_suite
B="$BUILD_DIR/pagedattn"
# The bus's roofline for swap: torch's page-locked copies each way (medians of 20 of 256 MiB).
step roofline 60 roofline.log python3 - <<'PY'
import torch
x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
h = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
for name, dst, src in (("device->host", h, x), ("host->device", x, h)):
    times = []
    for i in range(22):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); dst.copy_(src, non_blocking=True); b.record(); torch.cuda.synchronize()
        if i >= 2: times.append(a.elapsed_time(b) / 1e3)
    times.sort()
    print(f"pinned copy {name}: {x.numel() / times[len(times) // 2] / 1e9:.1f} GB/s")
PY
cat "$OUT/roofline.log"
# The issue's defaults (32 requests, 128-token prompts, 128 output tokens, 4096 KV tokens), each
# preemption policy with admission on current use (the one that preempts) and the lookahead.
step defaults 150 defaults.log "$B" bench serve --model "$MODEL" --device cuda --num-requests 32 \
  --mode static,paged --admission lookahead,immediate --preemption-mode recompute,swap,auto \
  --json --no-progress
grep -h '^{' "$OUT/defaults.log" >"$OUT/defaults.jsonl" 2>/dev/null
[[ -n "${SKIP_SWEEP:-}" ]] && { print_summary; exit 0; }
# The sweep: 32 requests, 64-token prompts, F = 64, budgets of 8, 16 and 32 requests' worst case.
step sweep 300 sweep.log "$B" bench serve --model "$MODEL" --device cuda --sweep \
  --num-requests 32 --prompt-len 64 --output-len 64 --sweep-concurrency 8 --mode static,paged \
  --admission lookahead,immediate --json --no-progress
grep -h '^{' "$OUT/sweep.log" >"$OUT/sweep.jsonl" 2>/dev/null
grep -A40 "sweep summary" "$OUT/sweep.log" | head -45
print_summary
