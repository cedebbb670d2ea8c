"""Zero copies: the cache's pools, q and out are the same memory on both sides."""

import gc

import numpy as np
import pytest

import pagedattn


def test_pools_are_the_cache_memory():
    cache = pagedattn.KvCache(num_layers=2, num_kv_heads=2, head_dim=8, num_pages=4, page_size=4)
    for layer in range(2):
        k, v = cache.k_pool(layer), cache.v_pool(layer)
        assert k.shape == (4, 2, 4, 8) and k.dtype == np.float32 and k.flags.c_contiguous
        assert k.ctypes.data == cache.pool_ptr(layer)
        assert v.ctypes.data == cache.pool_ptr(layer, v=True)
        assert cache.k_pool(layer).ctypes.data == k.ctypes.data  # every call, the same memory
    # A write through the operator shows in the numpy view, a write to the view in the next read.
    s = cache.create_sequence()
    slots = cache.append(s, [7])
    pagedattn.write_kv(cache.k_pool(0), cache.v_pool(0), slots, np.full((1, 2, 8), 3.0, np.float32),
                       np.full((1, 2, 8), 4.0, np.float32))
    page, slot = divmod(int(slots[0]), 4)
    assert (k := cache.k_pool(0))[page, :, slot].min() == 3.0
    k[page, :, slot] = 5.0
    assert cache.k_pool(0)[page, 0, slot, 0] == 5.0


def test_a_pool_keeps_its_cache_alive():
    cache = pagedattn.KvCache(num_layers=1, num_kv_heads=1, head_dim=8, num_pages=2)
    k = cache.k_pool(0)
    k[...] = 1.5
    del cache
    gc.collect()
    assert k.sum() == 1.5 * k.size  # still the cache's memory, not freed


def test_dlpack_framework_round_trip():
    cache = pagedattn.KvCache(num_layers=1, num_kv_heads=1, head_dim=8, num_pages=2)
    obj = cache.k_pool(0, framework="dlpack")
    assert hasattr(obj, "__dlpack__") and not isinstance(obj, np.ndarray)
    arr = np.from_dlpack(obj)
    assert arr.ctypes.data == cache.pool_ptr(0)


def test_out_and_q_are_not_copied():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 2, 8)).astype(np.float32)
    k_pool = rng.standard_normal((1, 2, 4, 8)).astype(np.float32)
    out = np.zeros_like(q)
    ptr = out.ctypes.data
    got = pagedattn.paged_attention(q, k_pool, k_pool, np.array([[0]], np.int32),
                                    np.array([3], np.int32), np.array([0, 1], np.int32), out=out)
    assert got is out and got.ctypes.data == ptr and out.any()


def test_torch_tensors_share_memory():
    torch = pytest.importorskip("torch", reason="torch is not installed (CI does not install it)")
    cache = pagedattn.KvCache(num_layers=1, num_kv_heads=2, head_dim=8, num_pages=2)
    t = cache.k_pool(0, framework="torch")
    assert isinstance(t, torch.Tensor) and t.data_ptr() == cache.pool_ptr(0)
    t.fill_(2.0)
    assert cache.k_pool(0)[0, 0, 0, 0] == 2.0
    assert torch.from_dlpack(cache.k_pool(0, framework="dlpack")).data_ptr() == cache.pool_ptr(0)
