#!/usr/bin/env python3
"""Reference encodings from the `tokenizers` library (Hugging Face) for the tokenizer tests.

Usage: tokenizer_oracle.py MODEL.gguf TEXTS.json OUT.json

Builds tokenizers.Tokenizer objects from the vocabulary and merges of a GGUF file (read with the
`gguf` package, independently of pagedattn's reader) and writes, for every text:
  encodings[family]: ids with the family's pre-tokenizer (smollm: the file's own; llama3, qwen2:
                     the same vocabulary behind those families' split regexes)
  pretokens[family]: the pre-token strings of gpt2, llama3 and qwen2 split regexes
Installs `tokenizers` and `gguf` with pip (quietly) when they are missing; exits with status 77
when that is impossible (no pip, no network), which the tests report as a skip.
"""
import json
import subprocess
import sys


def ensure(module, package):
    try:
        __import__(module)
    except ImportError:
        try:
            subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet",
                                   "--disable-pip-version-check", package],
                                  stdout=subprocess.DEVNULL)
        except (OSError, subprocess.CalledProcessError):
            print(f"tokenizer_oracle: cannot pip-install {package}", file=sys.stderr)
            sys.exit(77)


ensure("tokenizers", "tokenizers")
ensure("gguf", "gguf")

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
    model, texts_path, out_path = sys.argv[1:4]
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
