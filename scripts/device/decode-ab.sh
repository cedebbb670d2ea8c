#!/usr/bin/env bash
# One GPU call that compares the attention kernels of two commits side by side: builds the
# attention benchmark of BASE (default: main) in a git worktree and of the working tree, then runs
# both on the decode grid (`--mode decode`, page 16 unless BENCH_ARGS says otherwise; MODE=prefill
# for the prefill one), alternating, ROUNDS rounds, and prints each shape's median per round for
# both. Logs under $OUT.
#   BASE=c7d6eaa scripts/device/decode-ab.sh
#   GPU_FILTER='CudaAttention*' LAB_ARGS="--versions 34 --shape bf16:1:512:32" \
#     scripts/device/decode-ab.sh   # the working tree's GPU tests and a lab sweep first
# Environment: BASE, BASE_DIR (the base's sources exported there instead of a worktree of BASE,
# e.g. `git archive REV | tar -x -C out/ab-base`, for a commit the machine's clone lacks), MODE
# (decode), ROUNDS (2), BENCH_ARGS ("--page-size 16 --iters 20"),
# BUDGET (500),
# GPU_FILTER (builds test_gpu and runs those tests), LAB_ARGS (builds attention_decode_lab and
# runs `--sweep-only LAB_ARGS`).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/steps.sh
begin_call decode-ab 500
base_tree=/tmp/pagedattn-base
rm -rf "$base_tree"
if [[ -n "${BASE_DIR:-}" ]]; then
  cp -r "$BASE_DIR" "$base_tree"
else
  git worktree prune 2>/dev/null
  git worktree add --detach "$base_tree" "${BASE:-main}" >>"$OUT/build.log" 2>&1 ||
    { echo "no worktree of ${BASE:-main}"; exit 1; }
fi
deps=$(realpath "${DEPS_DIR:-build-cuda-deps}")
step build-new 300 build.log env BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh \
  bench_attention_cuda_main ${GPU_FILTER:+test_gpu} ${LAB_ARGS:+attention_decode_lab} ||
  { tail -20 "$OUT/build.log"; exit 1; }
step build-base 240 build.log env BUILD_DIR="$base_tree/build-gpu" DEPS_DIR="$deps" \
  DEPS_PREFIX=/tmp/pagedattn-deps-base bash "$base_tree/scripts/device/build.sh" \
  bench_attention_cuda_main || { tail -20 "$OUT/build.log"; exit 1; }
if [[ -f "$BUILD_DIR/deps-env.sh" ]]; then source "$BUILD_DIR/deps-env.sh"; fi
[[ -z "${GPU_FILTER:-}" ]] || run_gpu_suite
if [[ -n "${LAB_ARGS:-}" ]]; then
  # shellcheck disable=SC2086
  step lab 120 lab.log "$BUILD_DIR/kernels_dev/attention_decode_lab" --sweep-only $LAB_ARGS
  grep -vE "^\s*$" "$OUT/lab.log" | tail -30
fi
args=(--mode "${MODE:-decode}" ${BENCH_ARGS:---page-size 16 --iters 20})
for ((r = 1; r <= ${ROUNDS:-2}; ++r)); do
  step "base $r" 120 "base_$r.log" "$base_tree/build-gpu/kernels_dev/bench_attention_cuda_main" \
    "${args[@]}"
  step "new $r" 120 "new_$r.log" "$BUILD_DIR/kernels_dev/bench_attention_cuda_main" "${args[@]}"
done
python3 - "$OUT" "${ROUNDS:-2}" "${MODE:-decode}" <<'PY'
import sys, collections
out, rounds, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
res = collections.OrderedDict()
for r in range(1, rounds + 1):
    for who in ("base", "new"):
        try:
            lines = open(f"{out}/{who}_{r}.log")
        except OSError:
            continue
        for line in lines:
            if not line.startswith("kind=" + mode):
                continue
            d = dict(x.split("=", 1) for x in line.split() if "=" in x)
            k = (d["kv"], d["hkv"], d["d"], d["batch"], d.get("ctx", d.get("len")), d["page"],
                 d.get("q_per_seq", "-"))
            res.setdefault(k, {"base": [], "new": []})[who].append(float(d["us"]))
print("kv hkv d batch ctx page q | base us (rounds) | new us (rounds) | new/base (medians)")
for k, v in res.items():
    b, n = sorted(v["base"]), sorted(v["new"])
    ratio = n[len(n) // 2] / b[len(b) // 2] if b and n else float("nan")
    print(" ".join(k), "|", "/".join("%.2f" % x for x in v["base"]), "|",
          "/".join("%.2f" % x for x in v["new"]), "| %.3f" % ratio)
PY
print_summary
[[ -n "${BASE_DIR:-}" ]] || git worktree remove --force "$base_tree" >/dev/null 2>&1
