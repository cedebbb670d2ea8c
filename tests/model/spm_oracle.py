#!/usr/bin/env python3
"""Reference encodings from Google's `sentencepiece` for the SentencePiece tokenizer tests.

Usage: spm_oracle.py --deps DIR TEXTS.json OUT_DIR

Trains a small BPE model with `sentencepiece` the way Llama 2 and Mistral v0.1/v0.2 were trained
(byte fallback, identity normalisation, a dummy prefix, whitespace kept, digits split), writes its
vocabulary, scores and piece types into OUT_DIR/spm.gguf as GGUF tokenizer metadata
(tokenizer.ggml.model "llama", written with the `gguf` package, not pagedattn's code) and, for
every text of TEXTS.json, sentencepiece's ids and their decoding into OUT_DIR/out.json.
The same model as Hugging Face tokenizer.json folders (OUT_DIR/hf_legacy, OUT_DIR/hf_metaspace,
OUT_DIR/hf_split), written the way transformers converts a SentencePiece model (every split of a
piece into two pieces as a merge, ordered by the piece's score; byte fallback; the legacy
normalizer, or a Metaspace pre-tokenizer that prepends to the first segment, with or without
splitting at spaces), and what the `tokenizers` library makes of every text (added tokens split
out) under "hf" in out.json.
`sentencepiece`, `gguf` and `tokenizers`, when missing, are pip-installed into DIR (pydeps.py);
exits with status 77 when that is impossible (no pip, no network), which the tests report as a
skip.
"""
import argparse
import json
import os
import random

import pydeps  # beside this script

parser = argparse.ArgumentParser()
parser.add_argument("--deps", required=True, help="folder for pip-installed packages")
parser.add_argument("texts")
parser.add_argument("out_dir")
ARGS = parser.parse_args()
pydeps.ensure(ARGS.deps, {"sentencepiece": "sentencepiece", "gguf": "gguf",
                          "tokenizers": "tokenizers"})

import gguf  # noqa: E402
import sentencepiece as spm  # noqa: E402
import tokenizers  # noqa: E402

# A deterministic training corpus: English-like sentences, numbers, code, accented words, a little
# CJK; characters outside it (emoji, most CJK) are left to byte fallback.
rng = random.Random(7)
words = ("the of and to in is that it for was on with as his they at be this from have or by one "
         "had not but what all were when we there can an your which their said if do will each "
         "about how up out them then she many some so these would other into has more her two "
         "like him see time could no make than first been its who now people my made over did down "
         "only way find use may water long little very after words called just where most know "
         "tokenizer paged attention cache sequence request server model").split()
extra = ["café", "naïve", "Straße", "über", "日本", "東京", "1234", "3.14", "x = f(y) + 2;",
         "def main():", "    return 0", "print('hi')", "HTTP/1.1 200 OK", "<tag>", "a\tb"]
lines = []
for _ in range(3000):
    n = rng.randint(3, 14)
    s = " ".join(rng.choice(words) for _ in range(n))
    if rng.random() < 0.3:
        s = s.capitalize() + rng.choice([".", "!", "?", ",", ":"])
    if rng.random() < 0.2:
        s += " " + rng.choice(extra)
    if rng.random() < 0.1:
        s = "  " + s + "  "
    lines.append(s)
os.makedirs(ARGS.out_dir, exist_ok=True)
corpus = os.path.join(ARGS.out_dir, "corpus.txt")
with open(corpus, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
prefix = os.path.join(ARGS.out_dir, "spm")
spm.SentencePieceTrainer.train(
    input=corpus, model_prefix=prefix, model_type="bpe", vocab_size=700, byte_fallback=True,
    normalization_rule_name="identity", add_dummy_prefix=True, remove_extra_whitespaces=False,
    split_digits=True, allow_whitespace_only_pieces=True, character_coverage=0.999,
    unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2, num_threads=1)
sp = spm.SentencePieceProcessor(model_file=prefix + ".model")

# ggml token types: 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte.
pieces, scores, types = [], [], []
for i in range(sp.get_piece_size()):
    pieces.append(sp.id_to_piece(i))
    scores.append(sp.get_score(i))
    types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
                 else 5 if sp.is_unused(i) else 1)
w = gguf.GGUFWriter(os.path.join(ARGS.out_dir, "spm.gguf"), "llama")
w.add_tokenizer_model("llama")
w.add_token_list(pieces)
w.add_token_scores(scores)
w.add_token_types(types)
w.add_bos_token_id(sp.bos_id())
w.add_eos_token_id(sp.eos_id())
w.add_unk_token_id(sp.unk_id())
w.add_add_bos_token(True)
w.add_add_space_prefix(True)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()

with open(ARGS.texts, encoding="utf-8") as f:
    texts = json.load(f)
ids = [sp.encode(t) for t in texts]
out = {"texts": texts, "ids": ids, "decoded": [sp.decode(i) for i in ids],
       "pieces": [[sp.id_to_piece(x) for x in i] for i in ids], "vocab_size": sp.get_piece_size()}

# ---- the same model as Hugging Face tokenizer.json folders ----
SP = "\u2581"
vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
merges = []
for piece, i in vocab.items():
    if types[i] != 1:
        continue
    local = [(piece[:k], piece[k:], i) for k in range(1, len(piece))
             if piece[:k] in vocab and piece[k:] in vocab]
    merges += sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]]))
merges.sort(key=lambda m: -sp.get_score(m[2]))  # stable: a piece's splits stay in their order
added = [{"id": i, "content": sp.id_to_piece(i), "single_word": False, "lstrip": False,
          "rstrip": False, "normalized": False, "special": True} for i in (0, 1, 2)]
strip_decoder = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": SP}, "content": " "}, {"type": "ByteFallback"},
    {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
model = {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
         "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True,
         "ignore_merges": False, "vocab": vocab, "merges": [[a, b] for a, b, _ in merges]}
legacy = {"normalizer": {"type": "Sequence", "normalizers": [
              {"type": "Prepend", "prepend": SP},
              {"type": "Replace", "pattern": {"String": " "}, "content": SP}]},
          "pre_tokenizer": None}


def metaspace(split):
    return {"normalizer": None, "pre_tokenizer": {
        "type": "Metaspace", "replacement": SP, "prepend_scheme": "first", "split": split}}


out["hf"] = {}
for name, parts in (("legacy", legacy), ("metaspace", metaspace(False)),
                    ("split", metaspace(True))):
    d = os.path.join(ARGS.out_dir, "hf_" + name)
    os.makedirs(d, exist_ok=True)
    tj = dict({"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
               "post_processor": None, "decoder": strip_decoder, "model": model}, **parts)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                   "add_bos_token": True, "add_eos_token": False}, f)
    hf = tokenizers.Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    hf_ids = [hf.encode(t, add_special_tokens=False).ids for t in texts]
    out["hf"][name] = {"ids": hf_ids,
                       "decoded": [hf.decode(i, skip_special_tokens=False) for i in hf_ids],
                       "decoded_skip": [hf.decode(i, skip_special_tokens=True) for i in hf_ids]}
with open(os.path.join(ARGS.out_dir, "out.json"), "w", encoding="utf-8") as f:
    json.dump(out, f, ensure_ascii=False)
