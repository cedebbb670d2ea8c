"""pagedattn.KvCache: sequences, fork, free, the prefix cache with salts, stats and errors."""

import numpy as np
import pytest

import pagedattn


def make(**kw):
    args = dict(num_layers=2, num_kv_heads=2, head_dim=8, num_pages=8, page_size=4)
    args.update(kw)
    return pagedattn.KvCache(**args)


def test_append_commit_fork_free():
    cache = make()
    s = cache.create_sequence()
    slots = cache.append(s, [1, 2, 3, 4, 5])
    assert slots.dtype == np.int32 and len(slots) == 5
    assert cache.kv_len(s) == 5 and len(cache.block_table(s)) == 2
    pages = [int(p) for p in cache.block_table(s)]
    np.testing.assert_array_equal(slots, [pages[0] * 4 + i for i in range(4)] + [pages[1] * 4])
    cache.commit(s)
    child = cache.fork(s)
    assert list(cache.block_table(child)) == pages
    assert all(cache.refcount(p) == 2 for p in pages)
    assert cache.tokens(child) == [1, 2, 3, 4, 5]
    # Writing into the shared tail page copies it first (copy-on-write).
    cache.append(child, [6])
    assert int(cache.block_table(child)[1]) != pages[1]
    assert cache.refcount(pages[0]) == 2 and cache.refcount(pages[1]) == 1
    st = cache.stats()
    assert st["num_sequences"] == 2 and st["pages_used"] == 3
    cache.free(child)
    cache.free(s)
    st = cache.stats()
    assert st["num_sequences"] == 0 and st["pages_used"] == 0
    assert st["pages_free"] + st["pages_cached"] == 8
    assert not cache.has_sequence(s)


def test_prefix_lookup_respects_the_salt():
    cache = make(num_pages=16)
    tokens = list(range(100, 113))  # 13 tokens: 3 full pages
    a = cache.create_sequence("tenant-a")
    cache.append(a, tokens)
    cache.commit(a)
    cache.free(a)
    same = cache.create_sequence("tenant-a")
    assert cache.attach_prefix(same, tokens) == 12
    other = cache.create_sequence("tenant-b")
    assert cache.attach_prefix(other, tokens) == 0
    st = cache.stats()
    assert st["prefix_queries"] > 0 and st["prefix_hits"] == 12


def test_errors_change_nothing():
    cache = make(num_pages=2)
    s = cache.create_sequence()
    cache.append(s, [1, 2, 3])
    before = cache.stats()
    with pytest.raises(ValueError, match=r"append_slots"):
        cache.append(s, list(range(20)))  # needs more pages than exist
    assert cache.stats() == before and cache.kv_len(s) == 3
    with pytest.raises(ValueError, match=r"kv_len: unknown seq 12345"):
        cache.kv_len(12345)
    with pytest.raises(ValueError):
        cache.k_pool(2)  # layers 0..1
    with pytest.raises(TypeError, match=r"KvCache: dtype"):
        make(dtype="int8")
    with pytest.raises(ValueError, match=r"KvCache: device"):
        make(device="tpu")
    with pytest.raises(TypeError, match=r"KvCache: num_pages must be an int"):
        make(num_pages=2.5)
    with pytest.raises(ValueError, match=r"numpy has no bfloat16"):
        make(dtype="bf16").k_pool(0)


def test_fp8_cache_scales():
    cache = make(dtype="fp8")
    assert cache.dtype == "fp8_e4m3" and cache.k_pool(0).dtype == np.uint8
    s = cache.create_sequence()
    with pytest.raises(ValueError, match=r"scale"):
        cache.append(s, [1])  # no scales yet
    for layer in range(2):
        cache.set_scales(layer, [0.5, 0.25], [1.0, 2.0])
    np.testing.assert_array_equal(cache.k_scale(1), [0.5, 0.25])
    np.testing.assert_array_equal(cache.v_scale(0), [1.0, 2.0])
    slots = cache.append(s, [1, 2])
    k = np.full((2, 2, 8), 0.5, np.float32)
    pagedattn.write_kv(cache.k_pool(0), cache.v_pool(0), slots, k, k,
                       k_scale=cache.k_scale(0), v_scale=cache.v_scale(0))
    page, slot = divmod(int(slots[0]), 4)
    # 0.5 / 0.5 = 1.0 is fp8 e4m3 0x38; 0.5 / 0.25 = 2.0 is 0x40.
    assert cache.k_pool(0)[page, 0, slot, 0] == 0x38 and cache.k_pool(0)[page, 1, slot, 0] == 0x40
