// Swap: a sequence's pages copied to host memory and back (see kv_cache.h). The engine swaps a
// preempted sequence out when that is cheaper than computing its tokens again.
#include <chrono>
#include <utility>

#include "host_copy.h"
#include "kv_cache_impl.h"

namespace pagedattn {

size_t KvCache::swap_bytes(int32_t kv_len) const {
  PA_CHECK(kv_len >= 0, "swap_bytes: kv_len must be >= 0, got ", kv_len);
  const Impl& m = *impl_;
  const size_t pages = (size_t(kv_len) + size_t(m.cfg.page_size) - 1) / size_t(m.cfg.page_size);
  return pages * size_t(m.cfg.num_layers) * 2 * m.page_bytes();
}

size_t KvCache::reserve_swap_space(size_t bytes) { return impl_->host_pool->reserve(bytes); }

SwappedKv KvCache::swap_out(SeqId seq) {
  Impl& m = *impl_;
  const SeqPages& s = m.find(seq, "swap_out");
  SwappedKv out;
  out.bytes = swap_bytes(m.kv_len(s));
  const auto t0 = std::chrono::steady_clock::now();
  out.pages = kv::HostPool::take(m.host_pool, s.block_table.size());  // may throw: nothing changed
  out.pin_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<void*> pool, host;
  for (size_t i = 0; i < s.block_table.size(); ++i)
    m.page_blocks(s.block_table[i], (*out.pages)[i], pool, host);
  kv::copy_blocks(m.cfg.device, {pool.data(), pool.size()}, host, m.page_bytes());
  out.salt = s.salt;
  out.tokens = s.tokens;
  free_sequence(seq);
  return out;
}

int32_t KvCache::swap_in_pages(const SwappedKv& kv) const {
  const Impl& m = *impl_;
  const size_t ps = size_t(m.cfg.page_size);
  const size_t total = (kv.tokens.size() + ps - 1) / ps;
  std::vector<PageHash> chain;
  std::vector<int32_t> pages;
  if (m.cfg.enable_prefix_cache)
    m.cached_prefix(kv.tokens, kv.salt, kv.tokens.size() / ps, chain, pages);
  size_t live = 0;  // attached pages that cost nothing: a live sequence holds them already
  for (int32_t p : pages) live += !m.alloc.is_cached(p);
  return int32_t(total - live);
}

SeqId KvCache::swap_in(const SwappedKv& kv) {
  Impl& m = *impl_;
  const size_t ps = size_t(m.cfg.page_size);
  const size_t total = (kv.tokens.size() + ps - 1) / ps;
  PA_CHECK(kv.bytes == swap_bytes(kv.kv_len()) && kv.pages && kv.pages->size() == total,
           "swap_in: the swapped sequence holds ", kv.bytes, " bytes in ",
           kv.pages ? kv.pages->size() : 0, " pages, this cache expects ",
           swap_bytes(kv.kv_len()), " in ", total, " for its ", kv.kv_len(), " tokens");
  PA_CHECK(int64_t(kv.kv_len()) <= int64_t(m.cfg.num_pages) * m.cfg.page_size, "swap_in: ",
           kv.kv_len(), " tokens exceed the pool's ", int64_t(m.cfg.num_pages) * m.cfg.page_size,
           " slots");
  const int32_t need = swap_in_pages(kv);
  PA_CHECK(need <= m.alloc.num_available(), "swap_in: ", kv.kv_len(), " tokens need ", need,
           " pages but only ", m.alloc.num_available(), " are available");
  SeqPages s;
  s.salt = kv.salt;
  std::vector<int32_t> pages;
  if (m.cfg.enable_prefix_cache)
    m.cached_prefix(kv.tokens, kv.salt, kv.tokens.size() / ps, s.hashes, pages);
  // The attached pages first: reviving them takes them out of reach of the allocations below.
  for (int32_t p : pages) {
    if (m.alloc.is_cached(p))
      m.alloc.revive(p);
    else
      m.alloc.incref(p);
  }
  const size_t attached = pages.size();
  while (pages.size() < total) pages.push_back(m.alloc_page());
  std::vector<void*> pool, host;
  for (size_t i = attached; i < total; ++i) m.page_blocks(pages[i], (*kv.pages)[i], pool, host);
  try {
    kv::copy_blocks(m.cfg.device, {host.data(), host.size()}, pool, m.page_bytes());
  } catch (...) {
    for (auto it = pages.rbegin(); it != pages.rend(); ++it) m.release(*it);
    throw;
  }
  s.block_table = std::move(pages);
  s.tokens = kv.tokens;
  m.resume_hits += int64_t(attached * ps);
  const SeqId id = m.next_id++;
  m.seqs.emplace(id, std::move(s));
  commit(id);  // hashes the full pages that came back from host memory
  return id;
}

}  // namespace pagedattn
