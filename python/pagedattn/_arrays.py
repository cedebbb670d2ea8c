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


# torch.Tensor and torch's C++ DLPack exporter, looked up once torch is imported.
_TENSOR: Any = None
_TO_DLPACK: Any = None


def _torch_tensor_type() -> Any:
    global _TENSOR, _TO_DLPACK
    if _TENSOR is None:
        torch = torch_module()
        if torch is None:
            return None
        # NOTE: torch's Tensor.__dlpack__ (what the extension would call) is Python code that
        # costs several microseconds a tensor, most of a decode call's budget; torch._C._to_dlpack,
        # the C++ exporter under it, costs about one. It also reads tensors that require grad
        # (the operator computes no gradient), which __dlpack__ refuses.
        _TO_DLPACK = getattr(torch._C, "_to_dlpack", None) or (
            lambda t: t.detach() if t.requires_grad else t)
        _TENSOR = torch.Tensor
    return _TENSOR


def is_torch(x: Any) -> bool:
    tensor = _TENSOR if _TENSOR is not None else _torch_tensor_type()
    return tensor is not None and isinstance(x, tensor)


def require_array(x: Any, op: str, name: str) -> Any:
    """x itself if the extension can read it zero-copy; TypeError naming the argument otherwise."""
    if type(x) is np.ndarray:  # the common cases first: this runs several times per call
        return x
    if is_torch(x) or isinstance(x, np.ndarray) or hasattr(x, "__dlpack__"):
        return x
    raise TypeError(f"{op}: {name} must be a numpy array or a torch tensor, got {type(x).__name__}")


def export(x: Any) -> Any:
    """A checked array as the extension takes it: numpy arrays as they are, torch tensors as DLPack
    capsules over their memory (no copy; a capsule is read once)."""
    return _TO_DLPACK(x) if is_torch(x) else x


def arg(x: Any, op: str, name: str) -> Any:
    """require_array then export: an array argument on its way into the extension."""
    if type(x) is np.ndarray:
        return x
    if _TENSOR is not None and isinstance(x, _TENSOR):
        return _TO_DLPACK(x)
    return export(require_array(x, op, name))


def optional_arg(x: Any, op: str, name: str) -> Any:
    return None if x is None else arg(x, op, name)


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
    if is_torch(x) and x.is_cuda:
        x = x.to("cpu")
    return export(x)


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


_RAW_STREAM: Any = None


def stream_of(x: Any) -> int:
    """torch's current CUDA stream on x's device as an integer cudaStream_t; 0 otherwise."""
    global _RAW_STREAM
    if type(x) is np.ndarray or not is_torch(x) or not x.is_cuda:
        return 0
    if _RAW_STREAM is None:
        torch = torch_module()
        # No Stream object: about ten times faster than torch.cuda.current_stream().
        _RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
            lambda index: torch.cuda.current_stream(index).cuda_stream)
    return int(_RAW_STREAM(x.get_device()))


def empty_like(x: Any) -> Any:
    if is_torch(x):
        return torch_module().empty_like(x)
    return np.empty_like(np.asarray(x))
