#!/usr/bin/env bash
# make demo: until the model runtime exists, runs the CPU attention benchmark.
set -euo pipefail
BUILD=${1:-build}
"$BUILD"/pagedattn bench attention --device cpu --quick
