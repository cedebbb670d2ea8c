"""A decode step of one attention layer written in torch over pagedattn's paged KV cache,
checked against torch.nn.functional.scaled_dot_product_attention on the dense history.

    python examples/decode_layer.py [--device cpu|cuda] [--steps 8]

Sequences of different lengths are prefilled into the cache (write_kv into its pools, no
copies), then each decode step projects the new token, appends its slot, writes its K/V into
the pools and runs pagedattn.paged_attention over the block tables; the output is compared with
SDPA over the same K/V kept densely on the side.
"""

import argparse
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit("decode_layer.py needs torch (pip install torch)")

import pagedattn


class PagedAttentionLayer(torch.nn.Module):
    def __init__(self, hidden, num_q_heads, num_kv_heads, head_dim):
        super().__init__()
        self.hq, self.hk, self.d = num_q_heads, num_kv_heads, head_dim
        self.wq = torch.nn.Linear(hidden, num_q_heads * head_dim, bias=False)
        self.wk = torch.nn.Linear(hidden, num_kv_heads * head_dim, bias=False)
        self.wv = torch.nn.Linear(hidden, num_kv_heads * head_dim, bias=False)
        self.wo = torch.nn.Linear(num_q_heads * head_dim, hidden, bias=False)

    def forward(self, x, cache, layer, slots, block_table, kv_len, q_indptr):
        """x [num_tokens, hidden]: the new tokens of every sequence, packed."""
        n = x.shape[0]
        q = self.wq(x).view(n, self.hq, self.d)
        k = self.wk(x).view(n, self.hk, self.d)
        v = self.wv(x).view(n, self.hk, self.d)
        k_pool, v_pool = cache.k_pool(layer, "torch"), cache.v_pool(layer, "torch")
        pagedattn.write_kv(k_pool, v_pool, slots, k, v)
        out = pagedattn.paged_attention(q, k_pool, v_pool, block_table, kv_len, q_indptr)
        return self.wo(out.reshape(n, -1)), k, v


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() and
                    pagedattn.built_with_cuda else "cpu")
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    dev = torch.device(args.device)
    # The CUDA kernels take float16/bfloat16; the CPU kernel float32 too.
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    hidden, hq, hk, d = 512, 8, 2, 64
    torch.manual_seed(0)
    layer = PagedAttentionLayer(hidden, hq, hk, d).to(dev, dtype)
    cache = pagedattn.KvCache(num_layers=1, num_kv_heads=hk, head_dim=d, num_pages=64,
                              page_size=16, dtype=str(dtype).replace("torch.", ""),
                              device=str(dev))
    prompt_lens = [5, 37, 18]
    seqs = [cache.create_sequence() for _ in prompt_lens]
    dense_k = [[] for _ in seqs]  # the history, dense, for the SDPA reference
    dense_v = [[] for _ in seqs]
    worst = 0.0
    with torch.no_grad():
        # Prefill: every prompt token's K/V into the pools (one packed batch).
        x = torch.randn(sum(prompt_lens), hidden, device=dev, dtype=dtype)
        slots = torch.cat([torch.from_numpy(cache.append(s, [0] * n))
                           for s, n in zip(seqs, prompt_lens)]).to(dev)
        bt, kv_len, q_indptr = cache.batch(seqs, prompt_lens)
        _, k, v = layer(x, cache, 0, slots, bt, kv_len, q_indptr)
        for b, (lo, hi) in enumerate(zip(q_indptr[:-1], q_indptr[1:])):
            dense_k[b].append(k[lo:hi])
            dense_v[b].append(v[lo:hi])
        for step in range(args.steps):
            x = torch.randn(len(seqs), hidden, device=dev, dtype=dtype)
            slots = torch.cat([torch.from_numpy(cache.append(s, [0])) for s in seqs]).to(dev)
            bt, kv_len, q_indptr = cache.batch(seqs, [1] * len(seqs))
            y, k, v = layer(x, cache, 0, slots, bt, kv_len, q_indptr)
            # The reference: SDPA over each sequence's dense K/V (GQA by repeating KV heads).
            q = layer.wq(x).view(len(seqs), hq, d)
            ref = []
            for b in range(len(seqs)):
                dense_k[b].append(k[b:b + 1])
                dense_v[b].append(v[b:b + 1])
                kb = torch.cat(dense_k[b]).repeat_interleave(hq // hk, 1).transpose(0, 1)
                vb = torch.cat(dense_v[b]).repeat_interleave(hq // hk, 1).transpose(0, 1)
                o = F.scaled_dot_product_attention(q[b:b + 1].transpose(0, 1).float(),
                                                   kb.float(), vb.float())
                ref.append(o.transpose(0, 1).reshape(1, -1))
            want = layer.wo(torch.cat(ref).to(dtype))
            err = (y.float() - want.float()).abs().max().item()
            worst = max(worst, err)
            print(f"step {step}: kv_len {kv_len.tolist()}  max |paged - sdpa| = {err:.2e}")
    tol = 5e-2 if dtype != torch.float32 else 1e-4
    print(f"cache: {cache.stats()}")
    if worst > tol:
        sys.exit(f"FAIL: max difference {worst:.2e} > {tol:.0e}")
    print(f"OK: paged attention matches SDPA (max difference {worst:.2e}, tolerance {tol:.0e})")


if __name__ == "__main__":
    main()
