"""pagedattn.KvCache: the paged KV cache (one K and one V pool per layer, a block table per
sequence, copy-on-write fork, a prefix cache keyed by SHA-256 chains and a cache salt).

    cache = KvCache(num_layers=2, num_kv_heads=2, head_dim=64, num_pages=256)
    seq = cache.create_sequence()
    slots = cache.append(seq, token_ids)          # reserve slots for the new tokens
    write_kv(cache.k_pool(0), cache.v_pool(0), slots, k, v)
    cache.commit(seq)                             # full pages become reusable prefixes
    block_table, kv_len, q_indptr = cache.batch([seq], [len(token_ids)])

k_pool(layer) / v_pool(layer) are the cache's own memory ([num_pages, num_kv_heads, page_size,
head_dim]), as numpy arrays (CPU) or torch tensors (framework="torch"; the default on CUDA):
no copy, and the array keeps the cache alive. fp8 pools are uint8 bytes (torch:
.view(torch.float8_e4m3fn)).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from . import _C

_DTYPES = {"f32": "f32", "float32": "f32", "f16": "f16", "float16": "f16", "half": "f16",
           "bf16": "bf16", "bfloat16": "bf16", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3",
           "float8_e4m3fn": "fp8_e4m3"}


def _dtype_name(dtype: Any) -> str:
    name = str(dtype).replace("torch.", "")
    if name not in _DTYPES:
        raise TypeError(f"KvCache: dtype must be one of f32, f16, bf16, fp8 (or the numpy/torch "
                        f"dtypes), got {dtype!r}")
    return _DTYPES[name]


def _device(device: Any) -> Tuple[str, int]:
    text = str(device)
    kind, _, index = text.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()):
        raise ValueError(f"KvCache: device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if kind == "cuda" and not index:
        # NOTE: torch.cuda.current_device() raises where torch has no usable GPU; then the
        # extension's own check says that cuda:0 is not available.
        torch = _torch_if_imported()
        usable = torch is not None and torch.cuda.is_available()
        index = str(torch.cuda.current_device()) if usable else "0"
    return kind, int(index or 0)


def _torch_if_imported():
    import sys

    return sys.modules.get("torch")


class KvCache:
    """The paged KV cache of a model; see the module's docstring."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_pages: int, *,
                 page_size: int = 16, dtype: Any = "f32", device: Any = "cpu",
                 enable_prefix_cache: bool = True) -> None:
        for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim), ("num_pages", num_pages),
                            ("page_size", page_size)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"KvCache: {name} must be an int, got {type(value).__name__}")
        kind, index = _device(device)
        self._cache = _C.KvCache(int(num_layers), int(num_kv_heads), int(head_dim),
                                 int(page_size), int(num_pages), _dtype_name(dtype), kind, index,
                                 bool(enable_prefix_cache))
        self._framework = "numpy" if kind == "cpu" else "torch"

    # ---- shape ----
    num_layers = property(lambda self: self._cache.num_layers)
    num_kv_heads = property(lambda self: self._cache.num_kv_heads)
    head_dim = property(lambda self: self._cache.head_dim)
    page_size = property(lambda self: self._cache.page_size)
    num_pages = property(lambda self: self._cache.num_pages)
    dtype = property(lambda self: self._cache.dtype, doc="f32, f16, bf16 or fp8_e4m3")
    device = property(lambda self: self._cache.device, doc="cpu or cuda:N")

    # ---- sequences ----
    def create_sequence(self, cache_salt: str = "") -> int:
        """A new, empty sequence; sequences with different salts never share cached pages."""
        return self._cache.create_sequence(cache_salt)

    def attach_prefix(self, seq: int, tokens: Sequence[int]) -> int:
        """Reuses the longest chain of cached full pages matching the start of tokens (same
        salt) for an empty sequence; returns the number of tokens reused (whole pages, at most
        len(tokens) - 1)."""
        return self._cache.attach_prefix(seq, list(tokens))

    def append(self, seq: int, tokens: Sequence[int]) -> np.ndarray:
        """Reserves slots for new tokens (their ids, kept for prefix hashing) at positions
        kv_len .. kv_len + n - 1, copying a shared tail page first; returns the slots (int32).
        Raises ValueError, changing nothing, when the pages do not fit."""
        return self._cache.append_slots(seq, list(tokens))

    append_slots = append

    def can_append(self, seq: int, n: int) -> bool:
        return self._cache.can_append(seq, n)

    def pages_needed(self, seq: int, n: int) -> int:
        return self._cache.pages_needed(seq, n)

    def commit(self, seq: int) -> None:
        """Declares the K/V of every reserved position written: full pages get their prefix
        hash and become reusable by attach_prefix."""
        self._cache.commit(seq)

    def fork(self, seq: int) -> int:
        """A child sharing all the parent's pages (copy-on-write on the tail page)."""
        return self._cache.fork(seq)

    def free(self, seq: int) -> None:
        """Releases the sequence's pages (full committed pages stay cached for reuse)."""
        self._cache.free(seq)

    def has_sequence(self, seq: int) -> bool:
        return self._cache.has_sequence(seq)

    def kv_len(self, seq: int) -> int:
        return self._cache.kv_len(seq)

    def block_table(self, seq: int) -> np.ndarray:
        return self._cache.block_table(seq)

    def tokens(self, seq: int) -> List[int]:
        return self._cache.tokens(seq)

    def refcount(self, page: int) -> int:
        return self._cache.refcount(page)

    def stats(self) -> Dict[str, int]:
        """num_pages, pages_used, pages_free, pages_cached, tail_slots_wasted, prefix_queries,
        prefix_hits, evictions, num_sequences."""
        return self._cache.stats()

    def batch(self, seqs: Sequence[int], q_lens: Iterable[int]) -> Tuple[np.ndarray, np.ndarray,
                                                                            np.ndarray]:
        """The operator's batch metadata for these sequences, whose last q_lens[b] tokens are
        the queries: (block_table [num_seqs, max_pages] int32, kv_len [num_seqs] int32,
        q_indptr [num_seqs + 1] int32), host arrays."""
        q_lens = list(q_lens)
        if len(q_lens) != len(seqs):
            raise ValueError(f"KvCache.batch: {len(seqs)} seqs but {len(q_lens)} q_lens")
        tables = [self._cache.block_table(s) for s in seqs]
        width = max((len(t) for t in tables), default=0)
        block_table = np.zeros((len(seqs), width), dtype=np.int32)
        for b, t in enumerate(tables):
            block_table[b, :len(t)] = t
        kv_len = np.array([self._cache.kv_len(s) for s in seqs], dtype=np.int32)
        q_indptr = np.zeros(len(seqs) + 1, dtype=np.int32)
        q_indptr[1:] = np.cumsum(q_lens)
        return block_table, kv_len, q_indptr

    # ---- pools ----
    def k_pool(self, layer: int, framework: Optional[str] = None) -> Any:
        """Layer's K pool over the cache's memory: framework 'numpy' (the CPU default), 'torch'
        (the CUDA default) or 'dlpack' (an object with __dlpack__)."""
        return self._cache.pool(layer, False, framework or self._framework)

    def v_pool(self, layer: int, framework: Optional[str] = None) -> Any:
        return self._cache.pool(layer, True, framework or self._framework)

    def pool_ptr(self, layer: int, v: bool = False) -> int:
        """The address of a layer's K (or V) pool (to check that arrays share it)."""
        return self._cache.pool_ptr(layer, v)

    def set_scales(self, layer: int, k_scale: Sequence[float], v_scale: Sequence[float]) -> None:
        """fp8 caches: the per-KV-head scales of a layer, set once before any write."""
        self._cache.set_scales(layer, [float(x) for x in k_scale], [float(x) for x in v_scale])

    @property
    def scales_set(self) -> bool:
        return self._cache.scales_set

    def k_scale(self, layer: int, framework: Optional[str] = None) -> Any:
        """fp8 caches: layer's K scales [num_kv_heads] float32 on the pools' device."""
        return self._cache.scale(layer, False, framework or self._framework)

    def v_scale(self, layer: int, framework: Optional[str] = None) -> Any:
        return self._cache.scale(layer, True, framework or self._framework)

    def __repr__(self) -> str:
        return (f"KvCache(num_layers={self.num_layers}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, num_pages={self.num_pages}, "
                f"page_size={self.page_size}, dtype={self.dtype!r}, device={self.device!r})")
