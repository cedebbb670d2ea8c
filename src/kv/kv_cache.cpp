#include "pagedattn/kv_cache.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <unordered_map>
#include <utility>

#include "kv_cache_impl.h"
#include "pagedattn/error.h"

namespace pagedattn {

KvCache::KvCache(const KvCacheConfig& c) {
  PA_CHECK(c.num_layers > 0, "KvCache: num_layers must be > 0, got ", c.num_layers);
  PA_CHECK(c.num_kv_heads > 0, "KvCache: num_kv_heads must be > 0, got ", c.num_kv_heads);
  PA_CHECK(c.head_dim > 0, "KvCache: head_dim must be > 0, got ", c.head_dim);
  PA_CHECK(c.page_size > 0, "KvCache: page_size must be > 0, got ", c.page_size);
  PA_CHECK(c.num_pages > 0, "KvCache: num_pages must be > 0, got ", c.num_pages);
  // NOTE: slot ids (page * page_size + slot) are int32 in the write path.
  PA_CHECK(int64_t(c.num_pages) * c.page_size <= INT32_MAX,
           "KvCache: num_pages * page_size = ", int64_t(c.num_pages) * c.page_size,
           " exceeds the int32 slot range");
  auto impl = std::make_unique<Impl>(c);
  const std::vector<int64_t> shape = {c.num_pages, c.num_kv_heads, c.page_size, c.head_dim};
  for (int32_t l = 0; l < c.num_layers; ++l) {
    impl->k_pools.push_back(Tensor::zeros(shape, c.dtype, c.device));
    impl->v_pools.push_back(Tensor::zeros(shape, c.dtype, c.device));
  }
  impl->k_scales.resize(size_t(c.num_layers));
  impl->v_scales.resize(size_t(c.num_layers));
  impl->page_hash.resize(size_t(c.num_pages));
  impl->has_hash.assign(size_t(c.num_pages), 0);
  impl_ = std::move(impl);
}

KvCache::~KvCache() = default;

const KvCacheConfig& KvCache::config() const { return impl_->cfg; }

SeqId KvCache::create_sequence(const std::string& cache_salt) {
  const SeqId id = impl_->next_id;
  impl_->seqs.emplace(id, SeqPages{cache_salt, {}, {}, {}});
  ++impl_->next_id;
  return id;
}

int32_t KvCache::attach_prefix(SeqId seq, std::span<const int32_t> tokens,
                               int32_t resumed_computed) {
  Impl& m = *impl_;
  SeqPages& s = m.find(seq, "attach_prefix");
  PA_CHECK(resumed_computed >= 0, "attach_prefix: resumed_computed must be >= 0, got ",
           resumed_computed);
  PA_CHECK(s.tokens.empty(), "attach_prefix: seq ", seq, " must be empty, has kv_len ",
           s.tokens.size());
  if (!m.cfg.enable_prefix_cache) return 0;
  const size_t ps = size_t(m.cfg.page_size);
  // At most tokens.size() - 1 tokens reused, so the last token is always computed.
  const size_t max_pages = tokens.empty() ? 0 : (tokens.size() - 1) / ps;
  std::vector<PageHash> chain;
  std::vector<int32_t> pages;
  m.cached_prefix(tokens, s.salt, max_pages, chain, pages);
  for (int32_t p : pages) {
    if (m.alloc.is_cached(p)) {
      m.alloc.revive(p);
    } else {
      m.alloc.incref(p);
    }
  }
  const size_t reused = pages.size() * ps;
  s.block_table = std::move(pages);
  s.tokens.assign(tokens.begin(), tokens.begin() + ptrdiff_t(reused));
  s.hashes = std::move(chain);
  if (resumed_computed > 0) {
    s.counted_resume = std::min<int64_t>(int64_t(reused), resumed_computed);
  } else {
    s.counted_queries = int64_t(tokens.size());
    s.counted_hits = int64_t(reused);
  }
  m.resume_hits += s.counted_resume;
  m.prefix_queries += s.counted_queries;
  m.prefix_hits += s.counted_hits;
  return int32_t(reused);
}

int32_t KvCache::pages_needed(SeqId seq, int32_t n) const {
  const SeqPages& s = impl_->find(seq, "pages_needed");
  PA_CHECK(n >= 0, "pages_needed: n must be >= 0, got ", n);
  return int32_t(std::min<int64_t>(impl_->pages_needed(s, n), INT32_MAX));
}

int32_t KvCache::num_available_pages() const { return impl_->alloc.num_available(); }

bool KvCache::can_append(SeqId seq, int32_t n) const {
  const SeqPages& s = impl_->find(seq, "can_append");
  PA_CHECK(n >= 0, "can_append: n must be >= 0, got ", n);
  return impl_->pages_needed(s, n) <= impl_->alloc.num_available();
}

std::vector<int32_t> KvCache::append_slots(SeqId seq, std::span<const int32_t> tokens) {
  Impl& m = *impl_;
  SeqPages& s = m.find(seq, "append_slots");
  const int32_t unscaled = m.first_unscaled_layer();
  PA_CHECK(unscaled < 0, "append_slots: the fp8 cache has no scales for layer ", unscaled,
           " (call set_scales for every layer before any write)");
  const int64_t ps = m.cfg.page_size, len = m.kv_len(s);
  const int64_t n = int64_t(tokens.size());
  PA_CHECK(len + n <= int64_t(m.cfg.num_pages) * ps, "append_slots: tokens (", n,
           ") would take seq ", seq, " beyond the pool's ", int64_t(m.cfg.num_pages) * ps,
           " slots");
  const int64_t need = m.pages_needed(s, n);
  PA_CHECK(need <= m.alloc.num_available(), "append_slots: seq ", seq, " needs ", need,
           " pages for ", n, " tokens but only ", m.alloc.num_available(), " are available");
  std::vector<int32_t> slots;
  if (n == 0) return slots;
  s.counted_queries = s.counted_hits = s.counted_resume = 0;  // it grows: its lookup stands
  slots.reserve(size_t(n));
  const int32_t filled = int32_t(len % ps);
  if (filled != 0 && m.alloc.refcount(s.block_table.back()) > 1) {
    const int32_t shared = s.block_table.back();
    const int32_t fresh = m.alloc_page();
    m.copy_slots(fresh, shared, filled);
    if (m.cfg.record_page_copies) m.page_copies.push_back(PageCopy{fresh, shared, filled});
    m.release(shared);
    s.block_table.back() = fresh;
  }
  for (int64_t pos = len; pos < len + n; ++pos) {
    if (pos % ps == 0) s.block_table.push_back(m.alloc_page());
    slots.push_back(int32_t(s.block_table[size_t(pos / ps)] * ps + pos % ps));
  }
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  return slots;
}

void KvCache::commit(SeqId seq, int32_t written) {
  Impl& m = *impl_;
  SeqPages& s = m.find(seq, "commit");
  PA_CHECK(written >= -1 && written <= int32_t(s.tokens.size()), "commit: written (", written,
           ") is outside [-1, kv_len = ", s.tokens.size(), "] of seq ", seq);
  if (!m.cfg.enable_prefix_cache) return;
  const size_t ps = size_t(m.cfg.page_size);
  const size_t full = (written < 0 ? s.tokens.size() : size_t(written)) / ps;
  // Hash first (may throw), then register.
  std::vector<PageHash> fresh;
  for (size_t i = s.hashes.size(); i < full; ++i) {
    const PageHash& parent = fresh.empty() ? (i ? s.hashes[i - 1] : kv::kRootHash) : fresh.back();
    fresh.push_back(kv::page_hash(parent, std::span(s.tokens).subspan(i * ps, ps), s.salt));
    const int32_t page = s.block_table[i];
    PA_ASSERT(!m.has_hash[size_t(page)] || m.page_hash[size_t(page)] == fresh.back());
  }
  for (size_t j = 0; j < fresh.size(); ++j) {
    const int32_t page = s.block_table[s.hashes.size() + j];
    // NOTE: an identical page already registered keeps its mapping; this copy stays unhashed and
    // returns to the free list when released.
    if (!m.has_hash[size_t(page)] && m.hash_to_page.emplace(fresh[j], page).second) {
      m.page_hash[size_t(page)] = fresh[j];
      m.has_hash[size_t(page)] = 1;
    }
  }
  s.hashes.insert(s.hashes.end(), fresh.begin(), fresh.end());
}

void KvCache::set_token(SeqId seq, int32_t position, int32_t token) {
  Impl& m = *impl_;
  SeqPages& s = m.find(seq, "set_token");
  PA_CHECK(position >= 0 && position < int32_t(s.tokens.size()), "set_token: position ", position,
           " is not reserved in seq ", seq, " (kv_len ", s.tokens.size(), ")");
  PA_CHECK(size_t(position) >= s.hashes.size() * size_t(m.cfg.page_size), "set_token: position ",
           position, " of seq ", seq, " is in a page that already has its hash");
  s.tokens[size_t(position)] = token;
}

SeqId KvCache::fork(SeqId parent) {
  Impl& m = *impl_;
  const SeqPages& p = m.find(parent, "fork");
  SeqPages child = p;
  child.counted_queries = child.counted_hits = child.counted_resume = 0;  // the parent's lookup
  for (int32_t page : child.block_table) m.alloc.incref(page);
  const SeqId id = m.next_id++;
  m.seqs.emplace(id, std::move(child));
  return id;
}

void KvCache::free_sequence(SeqId seq) {
  Impl& m = *impl_;
  SeqPages& s = m.find(seq, "free_sequence");
  // Deepest page first: it reaches the LRU list before its parents and is evicted before them.
  for (auto it = s.block_table.rbegin(); it != s.block_table.rend(); ++it) m.release(*it);
  m.prefix_queries -= s.counted_queries;
  m.prefix_hits -= s.counted_hits;
  m.resume_hits -= s.counted_resume;
  m.seqs.erase(seq);
}

bool KvCache::has_sequence(SeqId seq) const { return impl_->seqs.count(seq) != 0; }

int32_t KvCache::kv_len(SeqId seq) const { return impl_->kv_len(impl_->find(seq, "kv_len")); }

std::span<const int32_t> KvCache::block_table(SeqId seq) const {
  return impl_->find(seq, "block_table").block_table;
}

std::span<const int32_t> KvCache::tokens(SeqId seq) const {
  return impl_->find(seq, "tokens").tokens;
}

const std::string& KvCache::cache_salt(SeqId seq) const {
  return impl_->find(seq, "cache_salt").salt;
}

PagedKVView KvCache::layer_view(int32_t layer) const {
  const Impl& m = *impl_;
  PA_CHECK(layer >= 0 && layer < m.cfg.num_layers, "layer_view: layer ", layer, " is outside [0, ",
           m.cfg.num_layers, ")");
  PagedKVView v = m.view_shape();
  v.k_pages = const_cast<void*>(m.k_pools[size_t(layer)].data());
  v.v_pages = const_cast<void*>(m.v_pools[size_t(layer)].data());
  if (m.has_scales(layer)) {
    v.k_scale = m.k_scales[size_t(layer)].data_as<float>();
    v.v_scale = m.v_scales[size_t(layer)].data_as<float>();
  }
  return v;
}

void KvCache::set_scales(int32_t layer, std::span<const float> k_scale,
                         std::span<const float> v_scale) {
  Impl& m = *impl_;
  PA_CHECK(m.cfg.dtype == DType::fp8_e4m3, "set_scales: the cache dtype is ",
           dtype_name(m.cfg.dtype), "; scales apply to fp8_e4m3 caches only");
  PA_CHECK(layer >= 0 && layer < m.cfg.num_layers, "set_scales: layer ", layer, " is outside [0, ",
           m.cfg.num_layers, ")");
  PA_CHECK(!m.has_scales(layer), "set_scales: layer ", layer,
           " already has its scales (they never change)");
  const size_t H = size_t(m.cfg.num_kv_heads);
  PA_CHECK(k_scale.size() == H, "set_scales: k_scale has ", k_scale.size(), " values, expected ",
           H);
  PA_CHECK(v_scale.size() == H, "set_scales: v_scale has ", v_scale.size(), " values, expected ",
           H);
  for (size_t h = 0; h < H; ++h) {
    PA_CHECK(std::isfinite(k_scale[h]) && k_scale[h] > 0.f, "set_scales: k_scale[", h,
             "] = ", k_scale[h], " must be finite and > 0");
    PA_CHECK(std::isfinite(v_scale[h]) && v_scale[h] > 0.f, "set_scales: v_scale[", h,
             "] = ", v_scale[h], " must be finite and > 0");
  }
  Tensor k = Tensor::empty({int64_t(H)}, DType::f32), v = Tensor::empty({int64_t(H)}, DType::f32);
  std::copy(k_scale.begin(), k_scale.end(), k.data_as<float>());
  std::copy(v_scale.begin(), v_scale.end(), v.data_as<float>());
  Tensor kd = k.to(m.cfg.device), vd = v.to(m.cfg.device);
  m.k_scales[size_t(layer)] = std::move(kd);
  m.v_scales[size_t(layer)] = std::move(vd);
}

bool KvCache::scales_set() const { return impl_->first_unscaled_layer() < 0; }

std::vector<PageCopy> KvCache::take_page_copies() { return std::exchange(impl_->page_copies, {}); }

void KvCache::copy_page_prefix(const PageCopy& c) {
  Impl& m = *impl_;
  PA_CHECK(c.dst >= 0 && c.dst < m.cfg.num_pages && c.src >= 0 && c.src < m.cfg.num_pages,
           "copy_page_prefix: pages ", c.src, " -> ", c.dst, " are not both in the pool of ",
           m.cfg.num_pages);
  PA_CHECK(c.filled >= 0 && c.filled <= m.cfg.page_size, "copy_page_prefix: filled ", c.filled,
           " is not in [0, ", m.cfg.page_size, "]");
  m.copy_slots(c.dst, c.src, c.filled);
}

KvCacheStats KvCache::stats() const {
  const Impl& m = *impl_;
  KvCacheStats st;
  st.num_pages = m.cfg.num_pages;
  st.pages_used = m.alloc.num_used();
  st.pages_free = m.alloc.num_free();
  st.pages_cached = m.alloc.num_cached();
  for (const auto& [id, s] : m.seqs) {
    st.tail_slots_wasted +=
        int64_t(s.block_table.size()) * m.cfg.page_size - int64_t(s.tokens.size());
  }
  st.prefix_queries = m.prefix_queries;
  st.prefix_hits = m.prefix_hits;
  st.resume_hits = m.resume_hits;
  st.evictions = m.evictions;
  st.num_sequences = int32_t(m.seqs.size());
  return st;
}

int32_t KvCache::refcount(int32_t page) const {
  PA_CHECK(page >= 0 && page < impl_->cfg.num_pages, "refcount: page ", page, " is outside [0, ",
           impl_->cfg.num_pages, ")");
  return impl_->alloc.refcount(page);
}

bool KvCache::page_has_hash(int32_t page) const {
  PA_CHECK(page >= 0 && page < impl_->cfg.num_pages, "page_has_hash: page ", page,
           " is outside [0, ", impl_->cfg.num_pages, ")");
  return impl_->has_hash[size_t(page)] != 0;
}

const BlockAllocator& KvCache::allocator() const { return impl_->alloc; }

}  // namespace pagedattn
