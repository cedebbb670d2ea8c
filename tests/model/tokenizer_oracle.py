#!/usr/bin/env python3
"""Reference encodings from the `tokenizers` library (Hugging Face) for the tokenizer tests.

Usage: tokenizer_oracle.py --deps DIR MODEL.gguf TEXTS.json OUT.json

Builds tokenizers.Tokenizer objects from the vocabulary and merges of a GGUF file (read with the
`gguf` package, independently of pagedattn's reader) and writes, for every text:
  encodings[family]: ids with the family's pre-tokenizer (smollm: the file's own; llama3, qwen2:
                     the same vocabulary behind those families' split regexes)
  pretokens[family]: the pre-token strings of gpt2, llama3 and qwen2 split regexes
`tokenizers` and `gguf`, when missing, are pip-installed into DIR (pydeps.py); exits with status 77
when that is impossible (no pip, no network), which the tests report as a skip.
"""
import argparse
import json

import pydeps  # beside this script

parser = argparse.ArgumentParser()
parser.add_argument("--deps", required=True, help="folder for pip-installed packages")
parser.add_argument("model")
parser.add_argument("texts")
parser.add_argument("out")
ARGS = parser.parse_args()
pydeps.ensure(ARGS.deps, {"tokenizers": "tokenizers", "gguf": "gguf"})

from gguf import GGUFReader  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers  # noqa: E402

GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
          r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
         r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")


def field(reader, key):
    return reader.fields[key].contents()


def build(tokens, merges, specials, pre, ignore_merges=False):
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab, pairs, ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok


def split(regex):
    return pre_tokenizers.Split(Regex(regex), behavior="isolated")


def main():
    model, texts_path, out_path = ARGS.model, ARGS.texts, ARGS.out
    reader = GGUFReader(model)
    tokens = field(reader, "tokenizer.ggml.tokens")
    merges = field(reader, "tokenizer.ggml.merges")
    types = field(reader, "tokenizer.ggml.token_type")
    specials = [t for t, ty in zip(tokens, types) if ty in (3, 4)]
    with open(texts_path, encoding="utf-8") as f:
        texts = json.load(f)

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    families = {
        "smollm": build(tokens, merges, specials, pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])),
        "llama3": build(tokens, merges, specials,
                        pre_tokenizers.Sequence([split(LLAMA3), byte_level]), ignore_merges=True),
        "qwen2": build(tokens, merges, specials, pre_tokenizers.Sequence([split(QWEN2), byte_level])),
    }
    out = {"encodings": {}, "pretokens": {}}
    for name, tok in families.items():
        out["encodings"][name] = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    for name, regex in (("gpt2", GPT2), ("llama3", LLAMA3), ("qwen2", QWEN2)):
        pre = split(regex)
        out["pretokens"][name] = [[p for p, _ in pre.pre_tokenize_str(t)] for t in texts]
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
