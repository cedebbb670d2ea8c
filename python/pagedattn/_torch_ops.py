"""The operator as torch custom ops (torch.library), with fake implementations so that
torch.compile traces through them without running them:

    torch.ops.pagedattn.paged_attention(q, k_pool, v_pool, block_table, kv_len, q_indptr,
                                        causal, scale, window, softcap, k_scale, v_scale) -> Tensor
    torch.ops.pagedattn.paged_attention_out(..., out, ...) -> None     (writes out)
    torch.ops.pagedattn.write_kv(k_pool, v_pool, slots, k, v, k_scale, v_scale) -> None

Registered when this module is imported with torch importable (torch >= 2.4 for
torch.library.custom_op); REGISTERED says whether it happened.
"""

from __future__ import annotations

import sys
from typing import Optional

REGISTERED = False

try:
    import torch

    _custom_op = getattr(torch.library, "custom_op", None)
    if not hasattr(torch, "compiler") or not hasattr(torch.compiler, "is_compiling"):
        _custom_op = None
except ImportError:  # numpy-only installs
    torch = None
    _custom_op = None

if _custom_op is not None:
    from torch import Tensor

    from .ops import _attention_into, _write_kv_into

    @_custom_op("pagedattn::paged_attention", mutates_args=())
    def paged_attention(q: Tensor, k_pool: Tensor, v_pool: Tensor, block_table: Tensor,
                        kv_len: Tensor, q_indptr: Tensor, causal: bool, scale: Optional[float],
                        window: int, softcap: float, k_scale: Optional[Tensor],
                        v_scale: Optional[Tensor]) -> Tensor:
        out = torch.empty_like(q)
        _attention_into("paged_attention", q, k_pool, v_pool, block_table, kv_len, q_indptr, out,
                        causal, scale, window, softcap, k_scale, v_scale)
        return out

    @paged_attention.register_fake
    def _(q, k_pool, v_pool, block_table, kv_len, q_indptr, causal, scale, window, softcap,
          k_scale, v_scale):
        return torch.empty_like(q)

    @_custom_op("pagedattn::paged_attention_out", mutates_args=("out",))
    def paged_attention_out(q: Tensor, k_pool: Tensor, v_pool: Tensor, block_table: Tensor,
                            kv_len: Tensor, q_indptr: Tensor, out: Tensor, causal: bool,
                            scale: Optional[float], window: int, softcap: float,
                            k_scale: Optional[Tensor], v_scale: Optional[Tensor]) -> None:
        _attention_into("paged_attention", q, k_pool, v_pool, block_table, kv_len, q_indptr, out,
                        causal, scale, window, softcap, k_scale, v_scale)

    @paged_attention_out.register_fake
    def _(q, k_pool, v_pool, block_table, kv_len, q_indptr, out, causal, scale, window, softcap,
          k_scale, v_scale):
        return None

    @_custom_op("pagedattn::write_kv", mutates_args=("k_pool", "v_pool"))
    def write_kv(k_pool: Tensor, v_pool: Tensor, slots: Tensor, k: Tensor, v: Tensor,
                 k_scale: Optional[Tensor], v_scale: Optional[Tensor]) -> None:
        _write_kv_into("write_kv", k_pool, v_pool, slots, k, v, k_scale, v_scale)

    @write_kv.register_fake
    def _(k_pool, v_pool, slots, k, v, k_scale, v_scale):
        return None

    is_compiling = torch.compiler.is_compiling

    def traced_attention(q, k_pool, v_pool, block_table, kv_len, q_indptr, causal, scale, window,
                         softcap, k_scale, v_scale, out):
        """pagedattn.paged_attention under torch.compile: the custom op on tensors."""
        meta = [x if isinstance(x, Tensor) else torch.as_tensor(x, dtype=torch.int32)
                for x in (block_table, kv_len, q_indptr)]
        if out is None:
            return paged_attention(q, k_pool, v_pool, *meta, causal, scale, window, softcap,
                                   k_scale, v_scale)
        paged_attention_out(q, k_pool, v_pool, *meta, out, causal, scale, window, softcap,
                            k_scale, v_scale)
        return out

    def traced_write_kv(k_pool, v_pool, slots, k, v, k_scale, v_scale):
        if not isinstance(slots, Tensor):
            slots = torch.as_tensor(slots, dtype=torch.int32)
        write_kv(k_pool, v_pool, slots, k, v, k_scale, v_scale)

    from . import ops as _ops

    _ops._TORCH_OPS = sys.modules[__name__]
    REGISTERED = True
