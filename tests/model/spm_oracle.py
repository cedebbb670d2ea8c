#!/usr/bin/env python3
"""Reference encodings from Google's `sentencepiece` for the SentencePiece tokenizer tests.

Usage: spm_oracle.py --deps DIR TEXTS.json OUT_DIR

Trains a small BPE model with `sentencepiece` the way Llama 2 and Mistral v0.1/v0.2 were trained
(byte fallback, identity normalisation, a dummy prefix, whitespace kept, digits split), writes its
vocabulary, scores and piece types into OUT_DIR/spm.gguf as GGUF tokenizer metadata
(tokenizer.ggml.model "llama", written with the `gguf` package, not pagedattn's code) and, for
every text of TEXTS.json, sentencepiece's ids and their decoding into OUT_DIR/out.json.
`sentencepiece` and `gguf`, when missing, are pip-installed into DIR (pydeps.py); exits with
status 77 when that is impossible (no pip, no network), which the tests report as a skip.
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
pydeps.ensure(ARGS.deps, {"sentencepiece": "sentencepiece", "gguf": "gguf"})

import gguf  # noqa: E402
import sentencepiece as spm  # noqa: E402

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
with open(os.path.join(ARGS.out_dir, "out.json"), "w", encoding="utf-8") as f:
    json.dump(out, f, ensure_ascii=False)
