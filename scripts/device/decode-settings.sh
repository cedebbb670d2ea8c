#!/usr/bin/env bash
# One GPU call that compares settings of one build on decode: builds the attention benchmark, the
# decode lab, the CLI and the GPU tests; runs GPU_FILTER's tests under each setting of TEST_ENVS;
# then, alternating the settings of ENVS over ROUNDS rounds, the decode grid (`bench attention
# --mode decode`, page 16), the lab on LAB_SHAPES and `bench model` at MODEL_BATCHES; prints each
# shape's medians per setting and their ratio to the first setting's. A setting is "-" (none) or
# comma-separated environment assignments. Logs under $OUT.
#   ENVS="- LAB_DECODE_CHUNK_TOKENS=512" LAB_SHAPES=bf16:64:528:8 scripts/device/decode-settings.sh
# Environment: ENVS ("-"), ROUNDS (2), TEST_ENVS ("-"), GPU_FILTER ('CudaAttention*'), LAB_SHAPES
# (KV:BATCH:CTX:HKV[:D] ...; none: skip), MODEL_BATCHES (16,32,64; none: skip), BUDGET (570).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/steps.sh
begin_call decode-settings 570
step build 300 build.log env BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh \
  bench_attention_cuda_main attention_decode_lab pagedattn test_gpu ||
  { tail -30 "$OUT/build.log"; print_summary; exit 1; }
if [[ -f "$BUILD_DIR/deps-env.sh" ]]; then source "$BUILD_DIR/deps-env.sh"; fi
assigns() {  # assigns SETTING: the setting's environment assignments into A
  A=()
  [[ "$1" == - ]] || IFS=, read -ra A <<<"$1"
}
for e in ${TEST_ENVS:--}; do
  echo "== tests env $e" >>"$OUT/test_gpu.log"
  assigns "$e"
  step "tests $e" 240 test_gpu.log env "${A[@]}" "$BUILD_DIR/tests/test_gpu" \
    --gtest_filter="${GPU_FILTER:-CudaAttention*}"
  grep -E "^\[  (PASSED|FAILED)" "$OUT/test_gpu.log" | tail -3
done
lab_args=()
for s in ${LAB_SHAPES:-none}; do [[ $s == none ]] || lab_args+=(--shape "$s"); done
for ((r = 1; r <= ${ROUNDS:-2}; ++r)); do
  for e in ${ENVS:--}; do
    echo "== round $r env $e" | tee -a "$OUT/grid.log" "$OUT/lab.log" >>"$OUT/model.log"
    assigns "$e"
    step "grid $r" 120 grid.log env "${A[@]}" "$BUILD_DIR/kernels_dev/bench_attention_cuda_main" \
      --mode decode --page-size 16 --iters 20
    ((${#lab_args[@]} == 0)) || step "lab $r" 90 lab.log env "${A[@]}" \
      "$BUILD_DIR/kernels_dev/attention_decode_lab" --sweep-only --versions 4 "${lab_args[@]}"
    [[ "${MODEL_BATCHES:-16,32,64}" == none ]] || step "model $r" 120 model.log env "${A[@]}" \
      "$BUILD_DIR/pagedattn" bench model --model synthetic:llama3-8b --device cuda \
      --batch "${MODEL_BATCHES:-16,32,64}" --prompt-len 512 --decode-steps 32 --json
  done
done
python3 - "$OUT" "$PWD" <<'PY' | tee "$OUT/summary.txt"
import json, os, sys
sys.path.insert(0, os.path.join(sys.argv[2], "scripts", "device"))
from settings_table import medians, print_table  # noqa: E402
out = sys.argv[1]
def grid(line):
    if not line.startswith("kind=decode"):
        return None
    d = dict(x.split("=", 1) for x in line.split() if "=" in x)
    key = "%s hkv%s d%s b%s ctx%s" % (d["kv"], d["hkv"], d["d"], d["batch"], d.get("ctx"))
    return key, float(d["us"])
def lab(line):
    f = line.split()
    if len(f) == 13 and f[0] in ("bf16", "f16", "fp8_e4m3") and f[1].isdigit():
        return "lab %s b%s ctx%s hkv%s d%s" % tuple(f[:5]), float(f[8])
    return None
def model(line):
    if not line.startswith("{"):
        return None
    d = json.loads(line)
    return "model b%d ms/step" % d["batch"], float(d["decode_ms_per_step"])
for title, res in (("decode grid us", medians(out + "/grid.log", grid)),
                   ("lab us", medians(out + "/lab.log", lab)),
                   ("model", medians(out + "/model.log", model))):
    print_table(title, res, "%.2f")
PY
print_summary | tee -a "$OUT/summary.txt"
