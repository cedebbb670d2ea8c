// Helpers shared by the kv tests: deterministic K/V values, the write path, and a dense read-back
// through the block table (the independent view a test compares with its own model).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "pagedattn/attention.h"
#include "pagedattn/error.h"
#include "pagedattn/kv_cache.h"

namespace pagedattn::testing_kv {

inline uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline uint64_t salt_key(const std::string& salt) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : salt) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Keys of the token prefixes: key[p] identifies (salt, tokens[0..p]). A real model's K/V at p is a
// function of exactly that, so a prefix-cache hit must return the values of the same key.
inline std::vector<uint64_t> prefix_keys(const std::string& salt, std::span<const int32_t> tokens) {
  std::vector<uint64_t> keys(tokens.size());
  uint64_t h = salt_key(salt);
  for (size_t p = 0; p < tokens.size(); ++p) {
    h = mix64(h ^ (uint64_t(uint32_t(tokens[p])) * 0x2545f4914f6cdd1dull));
    keys[p] = h;
  }
  return keys;
}

// The K (which = 0) or V (which = 1) value of element (layer, head, d) of the token with `key`,
// in [-2, 2) with 2^-20 resolution (exact in f32).
inline float kv_value(uint64_t key, int32_t layer, int32_t head, int32_t d, int which) {
  const uint64_t r = mix64(key ^ mix64((uint64_t(layer) << 40) ^ (uint64_t(head) << 20) ^
                                       (uint64_t(d) << 2) ^ uint64_t(which)));
  return float(int64_t(r >> 42) - (int64_t(1) << 21)) / float(1 << 20);
}

// Writes the K/V of tokens with prefix `keys` into `slots` (from append_slots) in every layer.
inline void write_positions(KvCache& cache, std::span<const int32_t> slots,
                            std::span<const uint64_t> keys) {
  const KvCacheConfig& c = cache.config();
  const size_t n = slots.size();
  std::vector<float> k(n * size_t(c.num_kv_heads * c.head_dim)), v(k.size());
  for (int32_t l = 0; l < c.num_layers; ++l) {
    for (size_t t = 0; t < n; ++t) {
      for (int32_t h = 0; h < c.num_kv_heads; ++h) {
        for (int32_t d = 0; d < c.head_dim; ++d) {
          const size_t i =
              (t * size_t(c.num_kv_heads) + size_t(h)) * size_t(c.head_dim) + size_t(d);
          k[i] = kv_value(keys[t], l, h, d, 0);
          v[i] = kv_value(keys[t], l, h, d, 1);
        }
      }
    }
    write_kv_cpu(cache.layer_view(l), slots.data(), int32_t(n), k.data(), v.data(), DType::f32);
  }
}

// Appends `tokens` to seq, writes their K/V (keys from the sequence's whole token list) and
// returns the slots.
inline std::vector<int32_t> append_and_write(KvCache& cache, SeqId seq,
                                             std::span<const int32_t> tokens) {
  const std::vector<int32_t> slots = cache.append_slots(seq, tokens);
  const std::span<const int32_t> all = cache.tokens(seq);
  const std::vector<uint64_t> keys = prefix_keys(cache.cache_salt(seq), all);
  write_positions(cache, slots, std::span(keys).subspan(all.size() - tokens.size(), tokens.size()));
  return slots;
}

// The value stored for (layer, position, head, d) as read through the block table, scale applied.
inline float read_kv(const KvCache& cache, SeqId seq, int32_t layer, int32_t pos, int32_t head,
                     int32_t d, int which) {
  const PagedKVView v = cache.layer_view(layer);
  const std::span<const int32_t> table = cache.block_table(seq);
  const int32_t page = table[size_t(pos / v.page_size)];
  const int64_t off = v.offset(page, head, pos % v.page_size) + d;
  const float raw = load_as_f32(which ? v.v_pages : v.k_pages, v.dtype, off);
  if (v.dtype != DType::fp8_e4m3) return raw;
  return raw * (which ? v.v_scale : v.k_scale)[head];
}

// The value read back after the write path stores x in a pool of `dtype` (fp8: x / scale rounded
// to e4m3, times scale).
inline float stored_value(float x, DType dtype, float scale = 1.f) {
  if (dtype == DType::fp8_e4m3) return fp8e4m3_to_f32(f32_to_fp8e4m3(x * (1.f / scale))) * scale;
  uint8_t buf[4];
  store_from_f32(buf, dtype, 0, x);
  return load_as_f32(buf, dtype, 0);
}

// Checks every K/V element of seq against kv_value of the prefix keys of (salt, tokens); for
// non-f32 pools against the rounded value. Returns false (with a gtest failure) on the first miss.
inline bool kv_matches(const KvCache& cache, SeqId seq, const std::string& salt,
                       std::span<const int32_t> tokens) {
  const KvCacheConfig& c = cache.config();
  if (cache.kv_len(seq) != int32_t(tokens.size())) {
    ADD_FAILURE() << "kv_len " << cache.kv_len(seq) << " != " << tokens.size();
    return false;
  }
  const size_t pages = (tokens.size() + size_t(c.page_size) - 1) / size_t(c.page_size);
  if (cache.block_table(seq).size() != pages) {
    ADD_FAILURE() << "block table has " << cache.block_table(seq).size() << " pages, expected "
                  << pages;
    return false;
  }
  const std::vector<uint64_t> keys = prefix_keys(salt, tokens);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const PagedKVView view = cache.layer_view(l);
    for (int32_t p = 0; p < int32_t(tokens.size()); ++p) {
      for (int32_t h = 0; h < c.num_kv_heads; ++h) {
        for (int32_t d = 0; d < c.head_dim; ++d) {
          for (int which : {0, 1}) {
            const float scale =
                c.dtype == DType::fp8_e4m3 ? (which ? view.v_scale : view.k_scale)[h] : 1.f;
            const float want =
                stored_value(kv_value(keys[size_t(p)], l, h, d, which), c.dtype, scale);
            const float got = read_kv(cache, seq, l, p, h, d, which);
            if (got != want) {
              ADD_FAILURE() << "seq " << seq << " layer " << l << " pos " << p << " head " << h
                            << " d " << d << (which ? " V " : " K ") << got << " != " << want;
              return false;
            }
          }
        }
      }
    }
  }
  return true;
}

// Everything observable about the cache's bookkeeping, for "a failed call changes nothing".
struct Snapshot {
  KvCacheStats stats;
  std::vector<std::vector<int32_t>> tables, tokens;
  std::vector<int32_t> refcounts;
  std::vector<int32_t> lru;

  static Snapshot take(const KvCache& cache, std::span<const SeqId> seqs) {
    Snapshot s;
    s.stats = cache.stats();
    for (SeqId q : seqs) {
      if (!cache.has_sequence(q)) continue;
      s.tables.emplace_back(cache.block_table(q).begin(), cache.block_table(q).end());
      s.tokens.emplace_back(cache.tokens(q).begin(), cache.tokens(q).end());
    }
    for (int32_t p = 0; p < cache.config().num_pages; ++p) s.refcounts.push_back(cache.refcount(p));
    s.lru = cache.allocator().lru_order();
    return s;
  }
  bool operator==(const Snapshot& o) const {
    const KvCacheStats& a = stats;
    const KvCacheStats& b = o.stats;
    return a.num_pages == b.num_pages && a.pages_used == b.pages_used &&
           a.pages_free == b.pages_free && a.pages_cached == b.pages_cached &&
           a.tail_slots_wasted == b.tail_slots_wasted && a.prefix_queries == b.prefix_queries &&
           a.prefix_hits == b.prefix_hits && a.evictions == b.evictions &&
           a.num_sequences == b.num_sequences && tables == o.tables && tokens == o.tokens &&
           refcounts == o.refcounts && lru == o.lru;
  }
};

}  // namespace pagedattn::testing_kv
