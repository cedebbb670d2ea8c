#!/usr/bin/env bash
# One call on a machine with 2 GPUs: the tensor-parallel step of this tree against another's
# (BASE_DIR, e.g. `git archive main | tar -x -C out/ab-base`), alternating rounds, with kernel
# traces of both; then one GPU under both trees (the ratio's denominator), the tensor-parallel
# and argmax tests (GPU_FILTER), and the logits over two GPUs against one (tp_parity.py).
# Output under $OUT (default out/tp-ab): summary_tp2.txt, summary_tp1.txt, timeline_tp2.txt,
# trace_tables_tp2.txt, test_gpu.log, parity.log (the rest stays in /tmp/tp-ab-*).
#   BASE_DIR=out/ab-base scripts/device/tp-ab.sh
# Environment: BASE_DIR, ROUNDS (3), BATCHES ("1 32 64"), GPU_FILTER, BUDGET (540).
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}  # NVLink multicast stays off on shared machines
OUT=${OUT:-$PWD/out/tp-ab}
mkdir -p "$OUT"
common=(BASE_DIR="${BASE_DIR:?set BASE_DIR}" VARIANTS="main base" ROUNDS="${ROUNDS:-3}"
  BATCHES="${BATCHES:-1 32 64}" DECODE_STEPS=32 LAB_VARIANTS=none)
env "${common[@]}" OUT=/tmp/tp-ab-2 BUDGET=${BUDGET:-540} TRACE_SEQ=24 \
  GPU_FILTER="${GPU_FILTER:-TensorParallel*:PeerAllReduce*:LlamaCudaSynthetic.*Argmax*}" \
  BENCH_EXTRA="--tensor-parallel 2" bash scripts/device/timeline-model.sh >/tmp/tp-ab-2.log 2>&1
env "${common[@]}" OUT=/tmp/tp-ab-1 BUDGET=150 SKIP_TRACE=1 bash scripts/device/timeline-model.sh \
  >/tmp/tp-ab-1.log 2>&1
cp /tmp/tp-ab-2/summary.txt "$OUT/summary_tp2.txt"
cp /tmp/tp-ab-1/summary.txt "$OUT/summary_tp1.txt"
cp /tmp/tp-ab-2/trace_tables.txt "$OUT/trace_tables_tp2.txt"
cp /tmp/tp-ab-2/timeline.txt "$OUT/timeline_tp2.txt"
cp /tmp/tp-ab-2/test_gpu.log "$OUT/" 2>/dev/null
tail -5 "$OUT/test_gpu.log" 2>/dev/null
timeout 120 python3 scripts/device/tp_parity.py build-gpu/pagedattn --tp 2 >"$OUT/parity.log" 2>&1
tail -3 "$OUT/parity.log"
echo "== two GPUs"; cat "$OUT/summary_tp2.txt"
echo "== one GPU"; cat "$OUT/summary_tp1.txt"
