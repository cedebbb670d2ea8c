"""pagedattn from Python: the paged attention operator, the paged KV cache and the engine.

    import pagedattn
    out = pagedattn.paged_attention(q, k_pool, v_pool, block_table, kv_len, q_indptr)
    cache = pagedattn.KvCache(num_layers, num_kv_heads, head_dim, num_pages)
    llm = pagedattn.LLM()
    llm.generate(["The capital of France is"], pagedattn.SamplingParams(temperature=0))

numpy arrays and torch tensors (CPU, and CUDA where the package was built with CUDA) are read in
place through DLPack. Bad arguments raise TypeError or ValueError naming the argument;
pagedattn.Error (a ValueError) carries the C++ library's own checks.
"""

from __future__ import annotations

import importlib.util as _importlib_util

from . import _C
from ._C import Error
from .cache import KvCache
from .llm import (
    LLM,
    CompletionOutput,
    RequestOutput,
    SamplingParams,
    StreamDelta,
    default_model_path,
)
from .ops import AttentionPlan, paged_attention, write_kv

__version__ = "0.1.0"

built_with_cuda: bool = _C.built_with_cuda


def cuda_device_count() -> int:
    """Usable CUDA devices (0 in builds without CUDA)."""
    return _C.cuda_device_count()


# The torch custom ops (torch.ops.pagedattn.*) exist as soon as the package is imported wherever
# torch is installed, so torch.compile finds them.
if _importlib_util.find_spec("torch") is not None:
    from . import _torch_ops  # noqa: F401

__all__ = [
    "AttentionPlan", "CompletionOutput", "Error", "KvCache", "LLM", "RequestOutput",
    "SamplingParams", "StreamDelta", "built_with_cuda", "cuda_device_count", "default_model_path",
    "paged_attention", "write_kv",
]
