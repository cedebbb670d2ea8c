#!/usr/bin/env bash
# Several source trees' prefill kernels side by side in one call: builds the attention benchmark
# of each tree (in parallel, each in its own build directory), then runs
# scripts/device/prefill-works.sh over them (alternating, ROUNDS rounds) on full prompts and on
# chunks. Output under $OUT: works.jsonl (one object per result, with its tree's name) and a table
# of medians per shape and tree.
#   TREES="base=out/ab-base v1=out/v1 new=." scripts/device/prefill-trees.sh
# Environment: TREES (name=dir pairs), FULL (batch:len shapes of whole prompts), CHUNKED
# (batch:len shapes of 128-query chunks at the end), ROUNDS (2), HEAD_DIM, KV.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/steps.sh
begin_call prefill-trees 560
deps=$(realpath "${DEPS_DIR:-build-cuda-deps}")
bins=""
i=0
for t in ${TREES:-new=.}; do
  name=${t%%=*} dir=$(realpath "${t#*=}")
  i=$((i + 1))
  (env BUILD_DIR="$dir/build-tree" DEPS_DIR="$deps" DEPS_PREFIX="/tmp/pagedattn-deps-$i" \
    bash "$dir/scripts/device/build.sh" bench_attention_cuda_main >"/tmp/build-$name.log" 2>&1 ||
    tail -20 "/tmp/build-$name.log") &
  bins+=" $name=$dir/build-tree/kernels_dev/bench_attention_cuda_main"
done
wait
export SKIP_BUILD=1 BINS="$bins"
CHUNK=0 SHAPES="${FULL:-1:2048 1:8192 4:2048 4:8192 64:512}" BUDGET=$((end - $(date +%s) - 120)) \
  scripts/device/prefill-works.sh >/dev/null
CHUNK=128 SHAPES="${CHUNKED:-264:512 132:1024 66:2048}" BUDGET=$((end - $(date +%s) - 5)) \
  scripts/device/prefill-works.sh >/dev/null
rm -f "$OUT/works.log"
python3 - "$OUT/works.jsonl" <<'PY'
import collections, json, sys
r = collections.defaultdict(list)
names = []
for line in open(sys.argv[1]):
    d = json.loads(line)
    r[(d["q_per_seq"], d["batch"], d["len"], d["d"], d["bin"])].append(d["us"])
    if d["bin"] not in names:
        names.append(d["bin"])
print("queries batch len d | " + " | ".join(f"{n} us (speed over {names[0]})" for n in names))
for k in sorted({k[:4] for k in r}):
    meds = []
    for n in names:
        v = sorted(r.get(k + (n,), []))
        meds.append(v[len(v) // 2] if v else float("nan"))
    print(" ".join(map(str, k)), "|", " | ".join(
        f"{m:.1f} ({meds[0] / m:.3f})" for m in meds))
PY
print_summary
