"""The paged attention operator, the KV write path and the plan object.

Shapes (tokens of all sequences packed, as in the C++ operator):

    q, out          [num_tokens, num_q_heads, head_dim]            float32 | float16 | bfloat16
    k_pool, v_pool  [num_pages, num_kv_heads, page_size, head_dim] q's dtype or fp8 e4m3
    block_table     [num_seqs, max_pages_per_seq] int32
    kv_len          [num_seqs] int32: tokens in the cache for each sequence, new ones included
    q_indptr        [num_seqs + 1] int32: sequence b's queries are rows q_indptr[b]..q_indptr[b+1]

Query j of sequence b sits at position kv_len[b] - q_len[b] + j. numpy arrays and CPU tensors run
the fused CPU kernel; CUDA tensors the CUDA kernels on torch's current stream (CUDA: float16 or
bfloat16, head_dim 64/128/256). Every array is read and written in place (DLPack, no copy);
batch metadata given on the GPU is copied to the host, where plans are made.
"""

from __future__ import annotations

from typing import Any, Optional

from . import _C
from ._arrays import (
    arg,
    check_options,
    empty_like,
    host_int32,
    is_torch,
    optional_arg,
    require_array,
    stream_of,
)

_DEFAULT_WORKSPACE = 64 << 20


def _attention_into(op: str, q, k_pool, v_pool, block_table, kv_len, q_indptr, out, causal,
                    scale, window, softcap, k_scale, v_scale) -> None:
    """Runs the operator into out (the body of the public call and of the torch custom op)."""
    _C.paged_attention(
        arg(q, op, "q"), arg(k_pool, op, "k_pool"), arg(v_pool, op, "v_pool"),
        host_int32(block_table, op, "block_table"), host_int32(kv_len, op, "kv_len"),
        host_int32(q_indptr, op, "q_indptr"), arg(out, op, "out"), bool(causal),
        None if scale is None else float(scale), int(window), float(softcap),
        optional_arg(k_scale, op, "k_scale"), optional_arg(v_scale, op, "v_scale"), stream_of(q))


def _write_kv_into(op: str, k_pool, v_pool, slots, k, v, k_scale, v_scale) -> None:
    k_pool = require_array(k_pool, op, "k_pool")
    slots = require_array(slots, op, "slots") if not isinstance(slots, (list, tuple)) else slots
    host_slots = None
    if is_torch(k_pool) and k_pool.device.type == "cuda":
        # Slots given on the host are validated there first, then uploaded.
        if isinstance(slots, (list, tuple)) or not is_torch(slots) or slots.device.type == "cpu":
            host_slots = _host_slots(slots, op)
            slots = _torch().as_tensor(host_slots).to(k_pool.device)
        slots = arg(slots, op, "slots")
    else:
        slots = host_int32(slots, op, "slots")
    _C.write_kv(arg(k_pool, op, "k_pool"), arg(v_pool, op, "v_pool"), slots, arg(k, op, "k"),
                arg(v, op, "v"), optional_arg(k_scale, op, "k_scale"),
                optional_arg(v_scale, op, "v_scale"), host_slots, stream_of(k_pool))


def _host_slots(slots, op: str):
    """Slots given on the host as a numpy array (the extension checks them, then they are
    uploaded): read twice, so not a DLPack capsule, which can be read once."""
    if not is_torch(slots):
        return host_int32(slots, op, "slots")
    try:
        return slots.detach().numpy()
    except TypeError:
        raise TypeError(f"{op}: slots must be int32, got {slots.dtype}") from None


def _torch():
    import torch

    return torch


# Set by _torch_ops once the torch custom ops are registered: the module holding them.
_TORCH_OPS: Any = None


def _tracing() -> bool:
    """Whether torch.compile is tracing: then torch tensors go through the custom ops. Eager
    calls go straight to the extension (a custom op's dispatch costs microseconds per call)."""
    return _TORCH_OPS is not None and _TORCH_OPS.is_compiling()


def paged_attention(q: Any, k_pool: Any, v_pool: Any, block_table: Any, kv_len: Any,
                    q_indptr: Any, *, causal: bool = True, scale: Optional[float] = None,
                    window: int = 0, softcap: float = 0.0, k_scale: Any = None,
                    v_scale: Any = None, out: Any = None) -> Any:
    """Attention of q over the paged cache; returns out (a new array of q's shape and dtype when
    out is None). scale defaults to 1/sqrt(head_dim); window > 0 keeps only the last window
    positions; softcap > 0 maps each logit x to softcap * tanh(x / softcap). fp8 pools need
    k_scale and v_scale ([num_kv_heads] float32 on the pools' device).

    Raises TypeError (not an array, a wrong dtype) or ValueError (shape, device, contiguity, bad
    metadata), naming the argument. Under torch.compile, torch tensors go through the custom op
    torch.ops.pagedattn.paged_attention (fake implementation registered), so it traces through
    the call."""
    if _tracing():
        return _TORCH_OPS.traced_attention(q, k_pool, v_pool, block_table, kv_len, q_indptr,
                                           causal, scale, window, softcap, k_scale, v_scale, out)
    op = "paged_attention"
    check_options(op, causal, scale, window, softcap)
    q = require_array(q, op, "q")
    if out is None:
        out = empty_like(q)
    _attention_into(op, q, k_pool, v_pool, block_table, kv_len, q_indptr, out, causal, scale,
                    window, softcap, k_scale, v_scale)
    return out


def write_kv(k_pool: Any, v_pool: Any, slots: Any, k: Any, v: Any, *, k_scale: Any = None,
             v_scale: Any = None) -> None:
    """Stores k and v [num_tokens, num_kv_heads, head_dim] (float32/16, bfloat16) at their slots
    (slot = page * page_size + offset, int32 [num_tokens]) of the pools, converting to the pools'
    dtype (fp8: x / scale, saturating). Every slot is checked before anything is written when the
    slots are on the host; on the GPU, slots outside the pool are skipped."""
    if _tracing():
        _TORCH_OPS.traced_write_kv(k_pool, v_pool, slots, k, v, k_scale, v_scale)
        return
    op = "write_kv"
    _write_kv_into(op, k_pool, v_pool, slots, k, v, k_scale, v_scale)


class AttentionPlan:
    """One step's batch planned once, run on every layer:

        plan = AttentionPlan(q, k_pool, block_table, kv_len, q_indptr, causal=True)
        for layer in range(num_layers):
            plan.run(q[layer], k_pools[layer], v_pools[layer], out=out[layer])
        plan.plan(q, k_pool, block_table, kv_len, q_indptr)   # the next step, same workspace

    On CUDA the plan owns a fixed device workspace (the batch metadata and the split-KV partials)
    and run() only launches kernels, so it can be captured in a CUDA graph; two plans with the
    same launch_signature launch the same kernels. q and k_pool fix the shapes and dtypes that
    run() accepts; the metadata is copied at plan time (its buffers may be reused)."""

    def __init__(self, q: Any, k_pool: Any, block_table: Any, kv_len: Any, q_indptr: Any, *,
                 causal: bool = True, scale: Optional[float] = None, window: int = 0,
                 softcap: float = 0.0, workspace_bytes: int = _DEFAULT_WORKSPACE) -> None:
        op = "AttentionPlan"
        check_options(op, causal, scale, window, softcap)
        q = require_array(q, op, "q")
        self._plan = _C.AttentionPlan(
            arg(q, op, "q"), arg(k_pool, op, "k_pool"), host_int32(block_table, op, "block_table"),
            host_int32(kv_len, op, "kv_len"), host_int32(q_indptr, op, "q_indptr"),
            bool(causal), None if scale is None else float(scale), int(window), float(softcap),
            int(workspace_bytes), stream_of(q))

    def plan(self, q: Any, k_pool: Any, block_table: Any, kv_len: Any, q_indptr: Any) -> None:
        """Plans the next step with the same options and workspace."""
        op = "AttentionPlan.plan"
        q = require_array(q, op, "q")
        self._plan.plan(arg(q, op, "q"), arg(k_pool, op, "k_pool"),
                        host_int32(block_table, op, "block_table"),
                        host_int32(kv_len, op, "kv_len"), host_int32(q_indptr, op, "q_indptr"),
                        stream_of(q))

    def run(self, q: Any, k_pool: Any, v_pool: Any, *, k_scale: Any = None, v_scale: Any = None,
            out: Any = None) -> Any:
        """Attention of q (the planned shape) over one layer's pools; returns out."""
        op = "AttentionPlan.run"
        q = require_array(q, op, "q")
        if out is None:
            out = empty_like(q)
        self._plan.run(arg(q, op, "q"), arg(k_pool, op, "k_pool"), arg(v_pool, op, "v_pool"),
                       arg(out, op, "out"), optional_arg(k_scale, op, "k_scale"),
                       optional_arg(v_scale, op, "v_scale"), stream_of(q))
        return out

    @property
    def device(self) -> str:
        return self._plan.device

    @property
    def num_seqs(self) -> int:
        return self._plan.num_seqs

    @property
    def num_tokens(self) -> int:
        return self._plan.num_tokens

    @property
    def launch_signature(self) -> str:
        """What the CUDA launches depend on besides the metadata ('' on the CPU)."""
        return self._plan.launch_signature
