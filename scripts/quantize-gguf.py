#!/usr/bin/env python3
"""Requantise a GGUF file with llama.cpp's own quantiser (llama_model_quantize), through the
llama-cpp-python sources and library that scripts/compare-llamacpp.sh builds.

Usage: scripts/quantize-gguf.py IN.gguf OUT.gguf [FTYPE]
FTYPE is llama.cpp's file type number (default 15, Q4_K_M; 17 is Q5_K_M). A model whose widths
are not multiples of 256 gets llama.cpp's fallback formats for those tensors (Q5_0 for most of
SmolLM2-135M's), as in the files published for it.
"""
import ctypes
import glob
import os
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    src = glob.glob(os.path.join(ROOT, "build-llamacpp", "llama-cpp-python-*"))
    lib = glob.glob(os.path.join(ROOT, "build-llamacpp", "bin-*", "bin", "libllama.so"))
    if not src or not lib:
        sys.exit("quantize-gguf: build llama.cpp first (scripts/compare-llamacpp.sh --build-only)")
    os.environ["LLAMA_CPP_LIB_PATH"] = os.path.dirname(lib[0])
    sys.path.insert(0, src[0])
    # NOTE: the package's __init__ imports its high-level API, which needs diskcache; only the
    # ctypes bindings are used here.
    sys.modules.setdefault("diskcache", types.ModuleType("diskcache"))
    sys.modules["diskcache"].Cache = object
    import llama_cpp.llama_cpp as L  # noqa: E402

    params = L.llama_model_quantize_default_params()
    params.ftype = int(sys.argv[3]) if len(sys.argv) == 4 else 15
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    rc = L.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(params))
    sys.exit(0 if rc == 0 else f"quantize-gguf: llama_model_quantize returned {rc}")


if __name__ == "__main__":
    main()
