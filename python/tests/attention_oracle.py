"""Independent oracles for the operator tests: a float64 numpy implementation of paged attention
written from the definition (gather each sequence's K/V to dense, two-pass softmax), and random
ragged batches over paged pools."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List

import numpy as np


def attention_oracle(q, k_pool, v_pool, block_table, kv_len, q_indptr, *, causal=True,
                     scale=None, window=0, softcap=0.0):
    """out [num_tokens, num_q_heads, head_dim] float64 from float64 copies of the inputs."""
    q = np.asarray(q, dtype=np.float64)
    k_pool = np.asarray(k_pool, dtype=np.float64)
    v_pool = np.asarray(v_pool, dtype=np.float64)
    num_tokens, hq, d = q.shape
    _, hk, page_size, _ = k_pool.shape
    group = hq // hk
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = np.zeros((num_tokens, hq, d))
    for b in range(len(kv_len)):
        lo, hi, n = int(q_indptr[b]), int(q_indptr[b + 1]), int(kv_len[b])
        pages = [int(block_table[b][p // page_size]) for p in range(n)]
        slots = [p % page_size for p in range(n)]
        k = k_pool[pages, :, slots, :]  # [n, hk, d]
        v = v_pool[pages, :, slots, :]
        for j in range(hi - lo):
            pos = n - (hi - lo) + j
            keys = np.arange(n)
            visible = np.ones(n, dtype=bool)
            if causal:
                visible &= keys <= pos
            if window > 0:
                visible &= keys > pos - window
            if not visible.any():
                continue
            for h in range(hq):
                logits = k[:, h // group, :] @ q[lo + j, h] * scale
                if softcap > 0:
                    logits = softcap * np.tanh(logits / softcap)
                logits = np.where(visible, logits, -np.inf)
                p = np.exp(logits - logits.max())
                out[lo + j, h] = (p / p.sum()) @ v[:, h // group, :]
    return out


@dataclass
class RaggedBatch:
    q: np.ndarray            # [num_tokens, hq, d]
    k_pool: np.ndarray       # [num_pages, hk, page_size, d]
    v_pool: np.ndarray
    block_table: np.ndarray  # [num_seqs, max_pages] int32
    kv_len: np.ndarray       # [num_seqs] int32
    q_indptr: np.ndarray     # [num_seqs + 1] int32


def random_batch(rng: np.random.Generator, *, q_lens: List[int], kv_lens: List[int], hq: int,
                 hk: int, d: int, page_size: int, dtype=np.float32, spare_pages: int = 3):
    """Sequences with q_lens[b] queries over kv_lens[b] cached tokens, on pages shuffled over a
    pool with spare pages (so a wrong page id reads other data)."""
    pages_per_seq = [(n + page_size - 1) // page_size for n in kv_lens]
    num_pages = sum(pages_per_seq) + spare_pages
    perm = rng.permutation(num_pages).astype(np.int32)
    width = max(max(pages_per_seq), 1)
    block_table = np.zeros((len(kv_lens), width), dtype=np.int32)
    at = 0
    for b, np_ in enumerate(pages_per_seq):
        block_table[b, :np_] = perm[at:at + np_]
        at += np_
    q_indptr = np.zeros(len(q_lens) + 1, dtype=np.int32)
    q_indptr[1:] = np.cumsum(q_lens)
    shape = (num_pages, hk, page_size, d)
    return RaggedBatch(
        q=rng.standard_normal((int(q_indptr[-1]), hq, d)).astype(dtype),
        k_pool=rng.standard_normal(shape).astype(dtype),
        v_pool=rng.standard_normal(shape).astype(dtype),
        block_table=block_table, kv_len=np.array(kv_lens, dtype=np.int32), q_indptr=q_indptr)
