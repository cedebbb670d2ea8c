"""The operator on random ragged / chunked / GQA batches against the float64 numpy oracle."""

import dataclasses

import numpy as np
import pytest

import pagedattn
from attention_oracle import attention_oracle, random_batch

# (q_lens, kv_lens): decode rows, chunked prefill (q_len < kv_len), whole prompts, a page edge.
SHAPES = [
    ([1, 1, 1], [1, 17, 40]),
    ([5, 1, 16], [21, 33, 16]),
    ([7], [7]),
    ([3, 1], [64, 65]),
]
HEADS = [(4, 4), (8, 2), (6, 1)]  # (num_q_heads, num_kv_heads): MHA, GQA, MQA
TOL = {np.float32: 2e-5, np.float16: 4e-3}


def _check(batch, out, **opt):
    want = attention_oracle(batch.q, batch.k_pool, batch.v_pool, batch.block_table, batch.kv_len,
                            batch.q_indptr, **opt)
    tol = TOL[batch.q.dtype.type]
    np.testing.assert_allclose(out.astype(np.float64), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("q_lens,kv_lens", SHAPES)
@pytest.mark.parametrize("hq,hk", HEADS)
@pytest.mark.parametrize("page_size", [16, 5])
def test_random_ragged_batches_match_the_oracle(q_lens, kv_lens, hq, hk, page_size):
    rng = np.random.default_rng(hash((tuple(q_lens), hq, hk, page_size)) % 2**32)
    b = random_batch(rng, q_lens=q_lens, kv_lens=kv_lens, hq=hq, hk=hk, d=64, page_size=page_size)
    out = pagedattn.paged_attention(b.q, b.k_pool, b.v_pool, b.block_table, b.kv_len, b.q_indptr)
    assert out.shape == b.q.shape and out.dtype == b.q.dtype
    _check(b, out)


@pytest.mark.parametrize("causal,window,softcap,scale", [
    (False, 0, 0.0, None), (True, 8, 0.0, None), (True, 0, 5.0, None), (True, 4, 2.0, 0.3)])
def test_options_match_the_oracle(causal, window, softcap, scale):
    rng = np.random.default_rng(7)
    b = random_batch(rng, q_lens=[4, 1, 9], kv_lens=[30, 12, 9], hq=4, hk=2, d=32, page_size=8)
    out = pagedattn.paged_attention(b.q, b.k_pool, b.v_pool, b.block_table, b.kv_len, b.q_indptr,
                                    causal=causal, window=window, softcap=softcap, scale=scale)
    _check(b, out, causal=causal, window=window, softcap=softcap, scale=scale)


def test_float16_inputs():
    rng = np.random.default_rng(3)
    b = random_batch(rng, q_lens=[3, 1], kv_lens=[19, 40], hq=8, hk=2, d=64, page_size=16,
                     dtype=np.float16)
    out = pagedattn.paged_attention(b.q, b.k_pool, b.v_pool, b.block_table, b.kv_len, b.q_indptr)
    assert out.dtype == np.float16
    _check(b, out)


def test_out_is_written_in_place_and_returned():
    rng = np.random.default_rng(4)
    b = random_batch(rng, q_lens=[2, 1], kv_lens=[9, 20], hq=4, hk=4, d=64, page_size=16)
    out = np.full_like(b.q, np.nan)
    got = pagedattn.paged_attention(b.q, b.k_pool, b.v_pool, b.block_table, b.kv_len,
                                    b.q_indptr, out=out)
    assert got is out
    _check(b, out)


def test_write_kv_stores_each_token_at_its_slot():
    rng = np.random.default_rng(5)
    k_pool = np.zeros((4, 2, 8, 16), dtype=np.float16)
    v_pool = np.zeros_like(k_pool)
    slots = np.array([3, 8 + 7, 3 * 8], dtype=np.int32)
    k = rng.standard_normal((3, 2, 16)).astype(np.float32)
    v = rng.standard_normal((3, 2, 16)).astype(np.float32)
    pagedattn.write_kv(k_pool, v_pool, slots, k, v)
    for t, s in enumerate(slots):
        page, slot = divmod(int(s), 8)
        # float32 -> float16 rounds to nearest even in both.
        np.testing.assert_array_equal(k_pool[page, :, slot], k[t].astype(np.float16))
        np.testing.assert_array_equal(v_pool[page, :, slot], v[t].astype(np.float16))
    assert np.count_nonzero(k_pool) == np.count_nonzero(k.astype(np.float16))


def test_plan_runs_every_layer_and_replans():
    rng = np.random.default_rng(6)
    b0 = random_batch(rng, q_lens=[1, 3], kv_lens=[25, 11], hq=8, hk=2, d=64, page_size=16)
    # Layers: the same batch metadata, each its own q and pools.
    layers = [dataclasses.replace(b0, q=rng.standard_normal(b0.q.shape).astype(np.float32),
                                  k_pool=rng.standard_normal(b0.k_pool.shape).astype(np.float32),
                                  v_pool=rng.standard_normal(b0.k_pool.shape).astype(np.float32))
              for _ in range(3)]
    plan = pagedattn.AttentionPlan(b0.q, b0.k_pool, b0.block_table, b0.kv_len, b0.q_indptr)
    assert plan.num_seqs == 2 and plan.num_tokens == 4 and plan.device == "cpu"
    for b in layers:
        out = plan.run(b.q, b.k_pool, b.v_pool)
        _check(b, out)
    # The next step: other lengths, same plan object.
    b = random_batch(rng, q_lens=[1, 1, 1], kv_lens=[5, 6, 7], hq=8, hk=2, d=64, page_size=16)
    plan.plan(b.q, b.k_pool, b.block_table, b.kv_len, b.q_indptr)
    _check(b, plan.run(b.q, b.k_pool, b.v_pool))
    with pytest.raises(ValueError, match="q .* differs from the planned q"):
        plan.run(b0.q, b.k_pool, b.v_pool)


def test_cache_pools_end_to_end():
    """K/V written through write_kv into a KvCache's pools, attention over its block tables."""
    rng = np.random.default_rng(8)
    cache = pagedattn.KvCache(num_layers=2, num_kv_heads=2, head_dim=32, num_pages=16,
                              page_size=4)
    lens = [9, 3]
    seqs = [cache.create_sequence() for _ in lens]
    for s, n in zip(seqs, lens):
        slots = cache.append(s, list(range(n)))
        for layer in range(2):
            k = rng.standard_normal((n, 2, 32)).astype(np.float32)
            v = rng.standard_normal((n, 2, 32)).astype(np.float32)
            pagedattn.write_kv(cache.k_pool(layer), cache.v_pool(layer), slots, k, v)
        cache.commit(s)
    block_table, kv_len, q_indptr = cache.batch(seqs, [2, 1])
    np.testing.assert_array_equal(kv_len, lens)
    q = rng.standard_normal((3, 4, 32)).astype(np.float32)
    for layer in range(2):
        out = pagedattn.paged_attention(q, cache.k_pool(layer), cache.v_pool(layer), block_table,
                                        kv_len, q_indptr)
        want = attention_oracle(q, cache.k_pool(layer), cache.v_pool(layer), block_table, kv_len,
                                q_indptr)
        np.testing.assert_allclose(out, want, atol=2e-5, rtol=2e-5)
