"""Bad arguments raise TypeError or ValueError naming the argument, and change nothing."""

import numpy as np
import pytest

import pagedattn
from attention_oracle import random_batch


@pytest.fixture
def b():
    return random_batch(np.random.default_rng(0), q_lens=[2, 1], kv_lens=[10, 20], hq=4, hk=2,
                        d=16, page_size=8)


def call(b, **over):
    args = dict(q=b.q, k_pool=b.k_pool, v_pool=b.v_pool, block_table=b.block_table,
                kv_len=b.kv_len, q_indptr=b.q_indptr)
    opts = {k: over.pop(k) for k in list(over) if k not in args}
    args.update(over)
    return pagedattn.paged_attention(*args.values(), **opts)


@pytest.mark.parametrize("over,exc,pattern", [
    (dict(q=[[1.0]]), TypeError, r"paged_attention: q must be a numpy array or a torch tensor"),
    (dict(q="q"), TypeError, r"q must be a numpy array"),
    (dict(k_pool=None), TypeError, r"k_pool must be a numpy array"),
    (dict(q=np.zeros((3, 4, 16), dtype=np.int64)), TypeError, r"q must be float32"),
    (dict(q=np.zeros((3, 64), dtype=np.float32)), ValueError, r"q must have 3 dimensions"),
    (dict(k_pool=np.zeros((4, 2, 16), dtype=np.float32)), ValueError,
     r"k_pool must have 4 dimensions"),
    (dict(v_pool=np.zeros((5, 2, 8, 16), dtype=np.float32)), ValueError,
     r"v_pool's shape .* differs from k_pool's"),
    (dict(v_pool=np.zeros((5, 2, 8, 16), dtype=np.float16)), TypeError, r"v_pool's dtype"),
    (dict(block_table=np.zeros((2, 3), dtype=np.int64)), TypeError, r"block_table must be int32"),
    (dict(block_table=np.zeros(6, dtype=np.int32)), ValueError,
     r"block_table must have 2 dimensions"),
    (dict(kv_len=np.array([10], dtype=np.int32)), ValueError, r"kv_len has 1 entries"),
    (dict(q_indptr=np.array([0, 3], dtype=np.int32)), ValueError, r"q_indptr has 2 entries"),
    (dict(q_indptr=np.array([0, 2, 2], dtype=np.int32)), ValueError, r"q_indptr\[2\]"),
    (dict(kv_len=np.array([10, 99], dtype=np.int32)), ValueError, r"kv_len\[1\] = 99 exceeds"),
    (dict(kv_len=np.array([1, 20], dtype=np.int32)), ValueError, r"q_len of sequence 0"),
    (dict(block_table=np.array([[0, 1, 2], [3, 4, 99]], dtype=np.int32)), ValueError,
     r"block_table\[1\]\[2\]"),
    (dict(q=np.zeros((3, 3, 16), dtype=np.float32)), ValueError, r"num_q_heads \(3\)"),
    (dict(q=np.zeros((3, 4, 8), dtype=np.float32)), ValueError, r"q.head_dim"),
    (dict(causal="yes"), TypeError, r"causal must be a bool"),
    (dict(window=-1), ValueError, r"window must be >= 0"),
    (dict(window=1.5), TypeError, r"window must be an int"),
    (dict(scale="x"), TypeError, r"scale must be a float"),
    (dict(softcap=-1.0), ValueError, r"softcap"),
    (dict(scale=float("inf")), ValueError, r"scale must be finite"),
    (dict(out=np.zeros((3, 4, 16), dtype=np.float16)), TypeError, r"out's dtype"),
    (dict(out=np.zeros((2, 4, 16), dtype=np.float32)), ValueError, r"out's shape"),
    (dict(k_scale=np.ones(2, dtype=np.float32)), ValueError, r"k_scale and v_scale apply to fp8"),
])
def test_bad_arguments_name_the_argument(b, over, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call(b, **over)


def test_non_contiguous_arrays_are_refused(b):
    q = np.ascontiguousarray(b.q.transpose(1, 0, 2)).transpose(1, 0, 2)  # same shape, strided
    with pytest.raises(ValueError, match=r"q must be contiguous"):
        call(b, q=q)
    with pytest.raises(ValueError, match=r"block_table must be contiguous"):
        call(b, block_table=np.asfortranarray(np.zeros((2, 3), dtype=np.int32)).T.copy().T)


def test_library_errors_are_pagedattn_errors(b):
    assert issubclass(pagedattn.Error, ValueError)
    with pytest.raises(pagedattn.Error, match=r"paged_attention: kv_len\[1\]"):
        call(b, kv_len=np.array([10, 99], dtype=np.int32))


def test_fp8_pools_need_scales():
    k_pool = np.zeros((2, 1, 4, 8), dtype=np.uint8)
    q = np.zeros((1, 1, 8), dtype=np.float32)
    args = (q, k_pool, k_pool.copy(), np.array([[0]], np.int32), np.array([1], np.int32),
            np.array([0, 1], np.int32))
    with pytest.raises(ValueError, match=r"k_scale and v_scale are required"):
        pagedattn.paged_attention(*args)
    with pytest.raises(ValueError, match=r"k_scale must have shape \(1,\)"):
        pagedattn.paged_attention(*args, k_scale=np.ones(2, np.float32),
                                  v_scale=np.ones(1, np.float32))
    with pytest.raises(ValueError, match=r"k_scale\[0\]"):
        pagedattn.paged_attention(*args, k_scale=np.zeros(1, np.float32),
                                  v_scale=np.ones(1, np.float32))
    out = pagedattn.paged_attention(*args, k_scale=np.ones(1, np.float32),
                                    v_scale=np.ones(1, np.float32))
    np.testing.assert_array_equal(out, 0)


def test_write_kv_validates_every_slot_before_writing():
    k_pool = np.zeros((2, 1, 4, 8), dtype=np.float32)
    v_pool = np.zeros_like(k_pool)
    k = np.ones((2, 1, 8), dtype=np.float32)
    with pytest.raises(ValueError, match=r"write_kv: slots\[1\]"):
        pagedattn.write_kv(k_pool, v_pool, np.array([0, 8], np.int32), k, k)
    assert not k_pool.any() and not v_pool.any()  # nothing written, not even slot 0
    with pytest.raises(ValueError, match=r"write_kv: k's shape"):
        pagedattn.write_kv(k_pool, v_pool, np.array([0], np.int32),
                           np.ones((1, 2, 8), np.float32), np.ones((1, 2, 8), np.float32))
    with pytest.raises(ValueError, match=r"slots has 1 entries but k has 2 tokens"):
        pagedattn.write_kv(k_pool, v_pool, np.array([0], np.int32), k, k)
    with pytest.raises(TypeError, match=r"slots must be int32"):
        pagedattn.write_kv(k_pool, v_pool, np.array([0, 1], np.int64), k, k)
    with pytest.raises(TypeError, match=r"k must be float32"):
        pagedattn.write_kv(k_pool, v_pool, np.array([0, 1], np.int32), k.astype(np.int32), k)


def test_plan_errors_name_the_argument(b):
    with pytest.raises(TypeError, match=r"AttentionPlan: kv_len must be int32"):
        pagedattn.AttentionPlan(b.q, b.k_pool, b.block_table, b.kv_len.astype(np.int64),
                                b.q_indptr)
    plan = pagedattn.AttentionPlan(b.q, b.k_pool, b.block_table, b.kv_len, b.q_indptr)
    with pytest.raises(ValueError, match=r"AttentionPlan.run: k_pool .* differs from the planned"):
        plan.run(b.q, b.k_pool[:3], b.v_pool[:3])
    with pytest.raises(ValueError, match=r"paged_attention: kv_len\[1\] = 99 exceeds"):
        plan.plan(b.q, b.k_pool, b.block_table, np.array([10, 99], np.int32), b.q_indptr)
    with pytest.raises(ValueError, match=r"the last plan\(\) failed"):
        plan.run(b.q, b.k_pool, b.v_pool)


def test_cuda_requests_without_a_device_fail_clearly():
    if pagedattn.cuda_device_count() > 0:
        pytest.skip("a CUDA device is present")
    with pytest.raises(ValueError, match=r"KvCache: device cuda:0 is not available"):
        pagedattn.KvCache(1, 1, 64, 4, device="cuda")
