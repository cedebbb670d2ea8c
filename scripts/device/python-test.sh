#!/usr/bin/env bash
# The Python package on a GPU machine without network access: pip install . with CUDA (the build
# requirements from the wheels in $WHEELS, filled by `pip download -d .whl nanobind
# scikit-build-core pytest`; missing Debian dev packages unpacked by build.sh from $DEPS_DIR,
# filled by fetch-deps.sh), then its pytest suite (the torch and CUDA tests included), the
# examples and the overhead benchmark. Every step has a time limit (steps.sh) so the logs always
# come back; they go to $OUT (default ./out/python), a summary is printed last.
#   scripts/device/python-test.sh                  # install tests examples bench
#   scripts/device/python-test.sh tests bench      # reuse the installed package
#   BUDGET=240 scripts/device/python-test.sh       # seconds for the whole call (default 280)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out/python}
WHEELS=${WHEELS:-.whl}
BUILD_DIR=${BUILD_DIR:-build-python-gpu}
mkdir -p "$OUT"
end=$(($(date +%s) + ${BUDGET:-280}))
source scripts/device/steps.sh
steps=${*:-install tests examples bench}
has() { [[ " $steps " == *" $1 "* ]]; }

{
  date -u
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
  python3 --version
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1
  echo "c++: $(command -v c++) $(c++ --version | head -1)"
} | tee -a "$OUT/summary.txt"

# The unpacked dependencies' environment (PREPARE_ONLY: no CMake build of the CLI).
PREPARE_ONLY=1 BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh >"$OUT/deps.log" 2>&1
if [[ -f "$BUILD_DIR/deps-env.sh" ]]; then source "$BUILD_DIR/deps-env.sh"; fi
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"

if has install; then
  python3 -c "import nanobind, scikit_build_core, pytest" 2>/dev/null ||
    python3 -m pip install -q --no-index --find-links "$WHEELS" nanobind scikit-build-core pytest \
      >>"$OUT/install.log" 2>&1
  step install 200 install.log env CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" python3 -m pip install \
    -v --no-build-isolation -Ccmake.define.PAGEDATTN_CUDA=ON . || tail -40 "$OUT/install.log"
  python3 -c "import pagedattn; print('built_with_cuda', pagedattn.built_with_cuda, 'devices', pagedattn.cuda_device_count())" 2>&1 | tee -a "$OUT/summary.txt"
fi

if has tests; then
  # NOTE: from the repository root, so that the installed package is imported (not python/).
  step tests 120 pytest.log python3 -m pytest -q -rs -p no:cacheprovider python/tests
  tail -25 "$OUT/pytest.log"
fi

if has examples; then
  step examples 60 examples.log bash -c "python3 examples/decode_layer.py --device cuda &&
    python3 examples/decode_layer.py --device cpu"
  tail -4 "$OUT/examples.log"
fi

if has bench; then
  step bench 60 overhead.txt python3 python/bench/overhead.py --device cuda
  step bench_json 60 overhead.jsonl python3 python/bench/overhead.py --device cuda --json
  cat "$OUT/overhead.txt"
fi
print_summary | tee -a "$OUT/summary.txt"
