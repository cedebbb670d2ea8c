"""torch tensors: the operator against torch's scaled_dot_product_attention, the custom op and
torch.compile, and the CUDA backend on torch's current stream (where built with CUDA and a GPU
is present). Skipped without torch (CI does not install it: its wheel pulls gigabytes)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (CI does not install it)")
import torch.nn.functional as F  # noqa: E402

import pagedattn  # noqa: E402
from attention_oracle import random_batch  # noqa: E402

HAS_CUDA = pagedattn.built_with_cuda and torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs pagedattn built with CUDA and a GPU")


def sdpa_reference(q, k_pool, v_pool, block_table, kv_len, q_indptr, *, causal=True):
    """Each sequence's K/V gathered to dense and run through SDPA (float32), GQA by repeat."""
    num_tokens, hq, d = q.shape
    _, hk, page_size, _ = k_pool.shape
    out = torch.zeros(num_tokens, hq, d, dtype=torch.float32, device=q.device)
    for b in range(len(kv_len)):
        lo, hi, n = int(q_indptr[b]), int(q_indptr[b + 1]), int(kv_len[b])
        pos = torch.arange(n, device=q.device)
        pages = block_table[b].to(q.device).long()[pos // page_size]
        k = k_pool[pages, :, pos % page_size].float().repeat_interleave(hq // hk, dim=1)
        v = v_pool[pages, :, pos % page_size].float().repeat_interleave(hq // hk, dim=1)
        qb = q[lo:hi].float()
        mask = None
        if causal:
            qpos = torch.arange(n - (hi - lo), n, device=q.device)
            mask = pos[None, :] <= qpos[:, None]
        out[lo:hi] = F.scaled_dot_product_attention(
            qb.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
            attn_mask=mask).transpose(0, 1)
    return out


def torch_batch(seed, device="cpu", dtype=torch.float32, **kw):
    b = random_batch(np.random.default_rng(seed), **kw)
    t = lambda a: torch.from_numpy(a).to(device=device, dtype=dtype)  # noqa: E731
    meta = [torch.from_numpy(x) for x in (b.block_table, b.kv_len, b.q_indptr)]
    return t(b.q), t(b.k_pool), t(b.v_pool), *meta


SHAPES = [dict(q_lens=[1, 1, 1], kv_lens=[1, 17, 300]), dict(q_lens=[5, 1, 16], kv_lens=[21, 33, 16]),
          dict(q_lens=[40], kv_lens=[130])]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("hq,hk", [(4, 4), (8, 2), (8, 1)])
def test_cpu_tensors_match_sdpa(shape, hq, hk):
    q, k_pool, v_pool, bt, kl, qi = torch_batch(1, hq=hq, hk=hk, d=64, page_size=16, **shape)
    out = pagedattn.paged_attention(q, k_pool, v_pool, bt, kl, qi)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape
    torch.testing.assert_close(out, sdpa_reference(q, k_pool, v_pool, bt, kl, qi),
                               atol=2e-5, rtol=2e-5)


def test_custom_op_is_registered_and_compiles():
    assert hasattr(torch.ops.pagedattn, "paged_attention")
    q, k_pool, v_pool, bt, kl, qi = torch_batch(2, hq=4, hk=2, d=64, page_size=16,
                                                q_lens=[2, 1], kv_lens=[9, 20])
    torch.library.opcheck(torch.ops.pagedattn.paged_attention.default,
                          (q, k_pool, v_pool, bt, kl, qi, True, None, 0, 0.0, None, None),
                          test_utils=("test_schema", "test_faketensor"))

    def layer(q):
        return pagedattn.paged_attention(q * 2, k_pool, v_pool, bt, kl, qi) + 1

    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(q), layer(q))


def test_requires_grad_inputs_are_read_without_copies():
    q, k_pool, v_pool, bt, kl, qi = torch_batch(3, hq=4, hk=4, d=64, page_size=16,
                                                q_lens=[1], kv_lens=[5])
    out = torch.empty_like(q)
    got = pagedattn.paged_attention(q.requires_grad_(), k_pool, v_pool, bt, kl, qi, out=out)
    assert got is out
    torch.testing.assert_close(out, sdpa_reference(q.detach(), k_pool, v_pool, bt, kl, qi),
                               atol=2e-5, rtol=2e-5)


@needs_cuda
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("hq,hk,d", [(8, 8, 128), (32, 8, 128), (8, 1, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_tensors_match_sdpa(shape, hq, hk, d, dtype):
    q, k_pool, v_pool, bt, kl, qi = torch_batch(4, "cuda", dtype, hq=hq, hk=hk, d=d,
                                                page_size=16, **shape)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # runs on torch's current stream, not the default one
        out = pagedattn.paged_attention(q, k_pool, v_pool, bt, kl, qi)
    stream.synchronize()
    want = sdpa_reference(q, k_pool, v_pool, bt, kl, qi)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)


@needs_cuda
def test_cuda_write_kv_and_cache_pools():
    cache = pagedattn.KvCache(num_layers=1, num_kv_heads=2, head_dim=64, num_pages=8,
                              dtype="bf16", device="cuda")
    k_pool, v_pool = cache.k_pool(0), cache.v_pool(0)
    assert k_pool.is_cuda and k_pool.data_ptr() == cache.pool_ptr(0)
    s = cache.create_sequence()
    slots = cache.append(s, list(range(20)))
    k = torch.randn(20, 2, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(20, 2, 64, device="cuda", dtype=torch.bfloat16)
    pagedattn.write_kv(k_pool, v_pool, slots, k, v)
    bt, kl, qi = cache.batch([s], [1])
    q = torch.randn(1, 8, 64, device="cuda", dtype=torch.bfloat16)
    out = pagedattn.paged_attention(q, k_pool, v_pool, bt, kl, qi)
    want = F.scaled_dot_product_attention(
        q.float().transpose(0, 1), k.float().repeat_interleave(4, 1).transpose(0, 1),
        v.float().repeat_interleave(4, 1).transpose(0, 1)).transpose(0, 1)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)


@needs_cuda
def test_cuda_plan_captured_in_a_graph():
    q, k_pool, v_pool, bt, kl, qi = torch_batch(5, "cuda", torch.bfloat16, hq=8, hk=2, d=128,
                                                page_size=16, q_lens=[1, 1], kv_lens=[100, 700])
    plan = pagedattn.AttentionPlan(q, k_pool, bt, kl, qi)
    out = torch.empty_like(q)
    plan.run(q, k_pool, v_pool, out=out)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, k_pool, v_pool, out=out)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), sdpa_reference(q, k_pool, v_pool, bt, kl, qi),
                               atol=2e-2, rtol=2e-2)
