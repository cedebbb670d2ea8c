// The cache's state behind KvCache (internal to src/kv: kv_cache.cpp and kv_swap.cpp share it).
#pragma once

#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "host_copy.h"
#include "page_hash.h"
#include "pagedattn/error.h"
#include "pagedattn/kv_cache.h"

namespace pagedattn {

// One sequence as the cache sees it: its pages, token ids and prefix hashes (the engine's
// Sequence, request.h, is the request's view).
struct SeqPages {
  std::string salt;
  std::vector<int32_t> block_table;  // [ceil(kv_len / page_size)] physical page ids
  std::vector<int32_t> tokens;       // [kv_len] token ids of the reserved positions
  std::vector<PageHash> hashes;      // chain hashes of the first hashes.size() (full) pages
  // What attach_prefix counted for this sequence, taken back if it is freed before it grows (an
  // admission that did not go ahead: the scheduler looks the same tokens up again later).
  int64_t counted_queries = 0, counted_hits = 0, counted_resume = 0;
};

struct KvCache::Impl {
  KvCacheConfig cfg;
  BlockAllocator alloc;
  std::vector<Tensor> k_pools, v_pools;    // [num_layers] of [num_pages][H][page_size][D]
  std::vector<Tensor> k_scales, v_scales;  // [num_layers] of [H] f32 on the pools' device (fp8)
  std::unordered_map<SeqId, SeqPages> seqs;
  SeqId next_id = 0;
  std::vector<PageHash> page_hash;  // [num_pages], valid where has_hash
  std::vector<uint8_t> has_hash;    // [num_pages]
  std::unordered_map<PageHash, int32_t, kv::PageHashHasher> hash_to_page;
  int64_t prefix_queries = 0, prefix_hits = 0, resume_hits = 0, evictions = 0;
  std::vector<PageCopy> page_copies;  // since take_page_copies (record_page_copies)
  std::shared_ptr<kv::HostPool> host_pool;  // swap_out's host memory

  explicit Impl(const KvCacheConfig& c)
      : cfg(c),
        alloc(c.num_pages),
        host_pool(std::make_shared<kv::HostPool>(
            c.device, size_t(c.num_layers) * 2 * size_t(c.num_kv_heads) * size_t(c.page_size) *
                          size_t(c.head_dim) * dtype_size(c.dtype))) {}

  SeqPages& find(SeqId seq, const char* op) {
    auto it = seqs.find(seq);
    PA_CHECK(it != seqs.end(), op, ": unknown seq ", seq);
    return it->second;
  }
  const SeqPages& find(SeqId seq, const char* op) const {
    auto it = seqs.find(seq);
    PA_CHECK(it != seqs.end(), op, ": unknown seq ", seq);
    return it->second;
  }

  // The longest chain of cached full pages matching the start of `tokens` under `salt`, at most
  // max_pages of them: their hashes and page ids.
  void cached_prefix(std::span<const int32_t> tokens, const std::string& salt, size_t max_pages,
                     std::vector<PageHash>& chain, std::vector<int32_t>& pages) const {
    const size_t ps = size_t(cfg.page_size);
    for (size_t i = 0; i < max_pages; ++i) {
      const PageHash h =
          kv::page_hash(i ? chain.back() : kv::kRootHash, tokens.subspan(i * ps, ps), salt);
      auto it = hash_to_page.find(h);
      if (it == hash_to_page.end()) break;
      chain.push_back(h);
      pages.push_back(it->second);
    }
  }

  // Bytes of one page of one layer's K (or V) pool: [H][page_size][D].
  size_t page_bytes() const {
    return size_t(cfg.num_kv_heads) * size_t(cfg.page_size) * size_t(cfg.head_dim) *
           dtype_size(cfg.dtype);
  }

  // The blocks of pool page `page` (every layer's K, then V) and where each lies in the host page
  // `host` (swap): [layer][K, V][H][page_size][D].
  void page_blocks(int32_t page, uint8_t* host, std::vector<void*>& pool,
                   std::vector<void*>& on_host) const {
    const size_t pb = page_bytes();
    for (size_t l = 0; l < size_t(cfg.num_layers); ++l) {
      const Tensor* pools[2] = {&k_pools[l], &v_pools[l]};
      for (size_t kv = 0; kv < 2; ++kv) {
        pool.push_back(static_cast<uint8_t*>(const_cast<void*>(pools[kv]->data())) +
                       size_t(page) * pb);
        on_host.push_back(host + (l * 2 + kv) * pb);
      }
    }
  }

  int32_t kv_len(const SeqPages& s) const { return int32_t(s.tokens.size()); }

  int64_t pages_needed(const SeqPages& s, int64_t n) const {
    if (n == 0) return 0;
    const int64_t ps = cfg.page_size, len = kv_len(s);
    int64_t need = (len + n + ps - 1) / ps - int64_t(s.block_table.size());
    // NOTE: a partial tail page shared with another sequence is copied before it is written.
    if (len % ps != 0 && alloc.refcount(s.block_table.back()) > 1) ++need;
    return need;
  }

  int32_t alloc_page() {
    return alloc.alloc([this](int32_t page) {
      hash_to_page.erase(page_hash[size_t(page)]);
      has_hash[size_t(page)] = 0;
      ++evictions;
    });
  }

  void release(int32_t page) { alloc.decref(page, has_hash[size_t(page)] != 0); }

  // Copies slots [0, filled) of every head of page src into page dst, in every layer's K and V.
  void copy_slots(int32_t dst, int32_t src, int32_t filled) {
    const size_t elem = dtype_size(cfg.dtype);
    const size_t head_bytes = size_t(filled) * size_t(cfg.head_dim) * elem;
    const PagedKVView shape = view_shape();
    for (int32_t l = 0; l < cfg.num_layers; ++l) {
      for (Tensor* pool : {&k_pools[size_t(l)], &v_pools[size_t(l)]}) {
        auto* base = static_cast<uint8_t*>(pool->data());
        for (int32_t h = 0; h < cfg.num_kv_heads; ++h) {
          copy_bytes(base + size_t(shape.offset(dst, h, 0)) * elem, cfg.device,
                     base + size_t(shape.offset(src, h, 0)) * elem, cfg.device, head_bytes);
        }
      }
    }
  }

  PagedKVView view_shape() const {
    PagedKVView v;
    v.dtype = cfg.dtype;
    v.num_pages = cfg.num_pages;
    v.num_kv_heads = cfg.num_kv_heads;
    v.page_size = cfg.page_size;
    v.head_dim = cfg.head_dim;
    return v;
  }

  bool has_scales(int32_t layer) const { return k_scales[size_t(layer)].data() != nullptr; }

  int32_t first_unscaled_layer() const {
    if (cfg.dtype != DType::fp8_e4m3) return -1;
    for (int32_t l = 0; l < cfg.num_layers; ++l) {
      if (!has_scales(l)) return l;
    }
    return -1;
  }
};

}  // namespace pagedattn
