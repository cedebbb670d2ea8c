#!/usr/bin/env bash
# The Python package on a GPU machine without network access: pip install . with CUDA (the build
# requirements from the wheels in $WHEELS, filled by `pip download -d .whl nanobind
# scikit-build-core pytest tomli`; missing Debian dev packages unpacked by build.sh from
# $DEPS_DIR, filled by fetch-deps.sh), then its pytest suite (the torch and CUDA tests included),
# the examples and the overhead benchmark. Logs go to $OUT (default ./out/python).
#   scripts/device/python-test.sh                  # install tests examples bench
#   scripts/device/python-test.sh tests bench      # reuse the installed package
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out/python}
WHEELS=${WHEELS:-.whl}
BUILD_DIR=${BUILD_DIR:-build-python-gpu}
mkdir -p "$OUT"
steps=${*:-install tests examples bench}
has() { [[ " $steps " == *" $1 "* ]]; }
status=0
note() { echo "== $*" | tee -a "$OUT/summary.txt"; }

{
  date -u
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
  python3 --version
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1
} | tee -a "$OUT/summary.txt"

# The unpacked dependencies' environment (PREPARE_ONLY: no CMake build of the CLI).
PREPARE_ONLY=1 BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh >"$OUT/deps.log" 2>&1
if [[ -f "$BUILD_DIR/deps-env.sh" ]]; then source "$BUILD_DIR/deps-env.sh"; fi
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"

if has install; then
  note "install"
  python3 -c "import nanobind, scikit_build_core, pytest" 2>/dev/null ||
    python3 -m pip install -q --no-index --find-links "$WHEELS" nanobind scikit-build-core pytest \
      >>"$OUT/install.log" 2>&1
  start=$(date +%s)
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install -v --no-build-isolation \
    -Ccmake.define.PAGEDATTN_CUDA=ON . >>"$OUT/install.log" 2>&1 || { note "install FAILED"; tail -40 "$OUT/install.log"; exit 1; }
  note "pip install . took $(( $(date +%s) - start )) s"
  python3 -c "import pagedattn; print('built_with_cuda', pagedattn.built_with_cuda, 'devices', pagedattn.cuda_device_count())" 2>&1 | tee -a "$OUT/summary.txt"
fi

if has tests; then
  note "tests"
  # NOTE: from the repository root, so that the installed package is imported (not python/).
  python3 -m pytest -q -rs -p no:cacheprovider python/tests >"$OUT/pytest.log" 2>&1 || status=1
  tail -25 "$OUT/pytest.log" | tee -a "$OUT/summary.txt"
fi

if has examples; then
  note "examples"
  python3 examples/decode_layer.py --device cuda >"$OUT/examples.log" 2>&1 || status=1
  python3 examples/decode_layer.py --device cpu >>"$OUT/examples.log" 2>&1 || status=1
  tail -4 "$OUT/examples.log" | tee -a "$OUT/summary.txt"
fi

if has bench; then
  note "overhead"
  python3 python/bench/overhead.py --device cuda >"$OUT/overhead.txt" 2>&1 || status=1
  python3 python/bench/overhead.py --device cuda --json >"$OUT/overhead.jsonl" 2>&1 || status=1
  cat "$OUT/overhead.txt" | tee -a "$OUT/summary.txt"
fi
exit $status
