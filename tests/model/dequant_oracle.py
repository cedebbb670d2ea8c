#!/usr/bin/env python3
"""Reference dequantisation of ggml blocks by llama.cpp's gguf-py (`gguf.quants.dequantize`).

Usage: dequant_oracle.py --deps DIR TYPE BLOCKS.bin OUT.f32

Reads raw blocks of TYPE (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K) and writes their
values as little-endian float32. `gguf` (and numpy), when missing, are pip-installed into DIR
(pydeps.py); exits with status 77 when that is impossible (no pip, no network), which the tests
report as a skip.
"""
import argparse

import pydeps  # beside this script

parser = argparse.ArgumentParser()
parser.add_argument("--deps", required=True, help="folder for pip-installed packages")
parser.add_argument("type")
parser.add_argument("blocks")
parser.add_argument("out")
ARGS = parser.parse_args()
pydeps.ensure(ARGS.deps, {"gguf": "gguf", "numpy": "numpy"})

import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize  # noqa: E402


def main():
    qtype = GGMLQuantizationType[ARGS.type]
    data = np.fromfile(ARGS.blocks, dtype=np.uint8)
    values = dequantize(data, qtype)
    # Computed in float32 (a float64 result cast here would round differently).
    assert values.dtype == np.float32, values.dtype
    values.astype("<f4", copy=False).tofile(ARGS.out)


if __name__ == "__main__":
    main()
