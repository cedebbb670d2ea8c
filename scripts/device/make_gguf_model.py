#!/usr/bin/env python3
"""Writes a small llama GGUF file that the CUDA runner takes (head dim 64) with a byte-level BPE
tokenizer: matrices in Q8_0, Q4_1, Q4_0 and F16 blocks of deterministic small values (the fuzz
corpus's writer, tests/fuzz/make_corpus.py). For runs of the CLI's GGUF path on GPUs, where no
downloaded model file travels; prints the vocabulary size.

    python3 scripts/device/make_gguf_model.py OUT.gguf [--layers 2]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                                "fuzz"))
from make_corpus import gguf, tokenizer_kvs  # noqa: E402


def model(layers):
    hidden, inter, heads, kv_heads = 256, 512, 4, 2
    head_dim = hidden // heads
    n, tok = tokenizer_kvs()
    arch = "llama"
    kvs = [("general.architecture", 8, arch), ("general.alignment", 4, 32),
           (arch + ".embedding_length", 4, hidden), (arch + ".block_count", 4, layers),
           (arch + ".feed_forward_length", 4, inter), (arch + ".attention.head_count", 4, heads),
           (arch + ".attention.head_count_kv", 4, kv_heads), (arch + ".context_length", 4, 512),
           (arch + ".attention.layer_norm_rms_epsilon", 6, 1e-5),
           (arch + ".rope.freq_base", 6, 10000.0)] + tok
    t = [("token_embd.weight", [hidden, n], "Q8_0"), ("output_norm.weight", [hidden], "F32")]
    for i in range(layers):
        b = "blk.%d." % i
        t += [(b + "attn_norm.weight", [hidden], "F32"), (b + "ffn_norm.weight", [hidden], "F32"),
              (b + "attn_q.weight", [hidden, heads * head_dim], "Q8_0"),
              (b + "attn_k.weight", [hidden, kv_heads * head_dim], "Q4_1"),
              (b + "attn_v.weight", [hidden, kv_heads * head_dim], "Q8_0"),
              (b + "attn_output.weight", [heads * head_dim, hidden], "Q4_0"),
              (b + "ffn_gate.weight", [hidden, inter], "Q8_0"),
              (b + "ffn_up.weight", [hidden, inter], "Q4_1"),
              (b + "ffn_down.weight", [inter, hidden], "F16")]
    return n, gguf(kvs, t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args()
    n, data = model(a.layers)
    with open(a.out, "wb") as f:
        f.write(data)
    print(n)


if __name__ == "__main__":
    main()
