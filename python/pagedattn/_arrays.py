"""Argument handling shared by the operator, the plan and the cache.

Arrays cross into C++ zero-copy through DLPack; these helpers only check what Python can check
cheaply (is it an array at all, is an option of the right type), find torch's current CUDA
stream, and bring small batch metadata to the host where the C++ side reads it.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import numpy as np


def torch_module() -> Any:
    """torch if it is already imported (never imports it: numpy users do not pay for it)."""
    return sys.modules.get("torch")


def is_torch(x: Any) -> bool:
    torch = torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def require_array(x: Any, op: str, name: str) -> Any:
    """x as something the extension reads zero-copy; TypeError naming the argument otherwise."""
    if type(x) is np.ndarray:  # the common cases first: this runs several times per call
        return x
    if is_torch(x):
        # NOTE: DLPack refuses tensors that require grad; the operator computes no gradient.
        return x.detach() if x.requires_grad else x
    if isinstance(x, np.ndarray) or hasattr(x, "__dlpack__"):
        return x
    raise TypeError(f"{op}: {name} must be a numpy array or a torch tensor, got {type(x).__name__}")


def optional_array(x: Any, op: str, name: str) -> Any:
    return None if x is None else require_array(x, op, name)


def host_int32(x: Any, op: str, name: str) -> Any:
    """Batch metadata for the host: lists become int32 numpy arrays, CUDA tensors are copied to
    the CPU (a synchronising copy of a few bytes; pass CPU tensors to avoid it). The dtype is
    checked by the extension (TypeError unless int32)."""
    if type(x) is np.ndarray:
        return x
    if isinstance(x, (list, tuple)):
        try:
            return np.asarray(x, dtype=np.int32)
        except (TypeError, ValueError, OverflowError) as e:
            raise TypeError(f"{op}: {name} must hold int32 values: {e}") from None
    x = require_array(x, op, name)
    if is_torch(x) and x.device.type != "cpu":
        return x.to("cpu")
    return x


def check_options(op: str, causal: Any, scale: Any, window: Any, softcap: Any) -> None:
    if causal is True and scale is None and window == 0 and softcap == 0.0 and type(window) is int:
        return  # the defaults
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"{op}: causal must be a bool, got {type(causal).__name__}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"{op}: scale must be a float or None, got {type(scale).__name__}")
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)):
        raise TypeError(f"{op}: window must be an int, got {type(window).__name__}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"{op}: softcap must be a float, got {type(softcap).__name__}")
    if window < 0:
        raise ValueError(f"{op}: window must be >= 0 (0: no sliding window), got {window}")
    if window > 2**31 - 1:
        raise ValueError(f"{op}: window must fit in int32, got {window}")


def stream_of(x: Any) -> int:
    """torch's current CUDA stream on x's device as an integer cudaStream_t; 0 otherwise."""
    if type(x) is np.ndarray:
        return 0
    if is_torch(x) and x.is_cuda:
        torch = torch_module()
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # no Stream object: ~10x faster
        if raw is not None:
            return int(raw(x.device.index))
        return int(torch.cuda.current_stream(x.device).cuda_stream)
    return 0



def empty_like(x: Any) -> Any:
    if is_torch(x):
        return torch_module().empty_like(x)
    return np.empty_like(np.asarray(x))
