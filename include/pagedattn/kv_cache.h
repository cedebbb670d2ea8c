// KvCache: the paged KV cache of a whole model.
//
// One K pool and one V pool per layer, each allocated once at construction:
//   [num_pages][num_kv_heads][page_size][head_dim] of the cache dtype, on the CPU or a CUDA device.
// One block table per sequence, shared by all layers. Pages come from a BlockAllocator; fork shares
// pages (refcount) and a shared partial tail page is copied before it is written (copy-on-write,
// only its filled slots). Full pages get a prefix hash h = SHA-256(parent_h, token ids, cache salt)
// once committed; a new sequence can attach the longest chain of cached pages matching its tokens.
//
// Every mutating call validates first and changes nothing when it throws. Unknown sequence ids,
// out-of-range layers or pages, and negative counts raise Error naming the argument.
//
// kv_len(seq) is the number of reserved positions (append_slots reserves, the caller writes the K/V
// of those positions through layer_view() before commit). Sequence ids are never reused.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pagedattn/block_allocator.h"
#include "pagedattn/dtype.h"
#include "pagedattn/paged_kv.h"
#include "pagedattn/tensor.h"

namespace pagedattn {

struct KvCacheConfig {
  int32_t num_layers = 1;
  int32_t num_kv_heads = 1;
  int32_t head_dim = 64;
  int32_t page_size = 16;
  int32_t num_pages = 0;
  DType dtype = DType::f32;  // f32 | f16 | bf16 | fp8_e4m3
  Device device = Device::cpu;
  bool enable_prefix_cache = true;
  // Keep a log of the copy-on-write page copies (take_page_copies): a tensor-parallel leader
  // replays them on the other ranks' pools.
  bool record_page_copies = false;
};

// Slots [0, filled) of every head of page src copied into page dst, in every layer's K and V.
struct PageCopy {
  int32_t dst = 0, src = 0, filled = 0;
};

struct KvCacheStats {
  int32_t num_pages = 0;
  int32_t pages_used = 0;         // referenced by at least one sequence
  int32_t pages_free = 0;         // in the free list
  int32_t pages_cached = 0;       // unreferenced, kept for prefix reuse (evictable)
  int64_t tail_slots_wasted = 0;  // empty slots in the tail pages of live sequences
  int64_t prefix_queries = 0;     // tokens looked up by attach_prefix for new requests
  int64_t prefix_hits = 0;        // of those, tokens reused
  int64_t resume_hits = 0;        // tokens a preempted sequence found again when it came back
  int64_t evictions = 0;
  int32_t num_sequences = 0;
};

using SeqId = int64_t;
using PageHash = std::array<uint8_t, 32>;

// A sequence's cache state moved out of the pools by KvCache::swap_out, for swap_in to put back:
// its salt, its token ids and the K/V of its pages in host memory (page-locked when the pools are
// on a CUDA device). Page i of its block table is at pages[i], laid out
// [layer][K, V][num_kv_heads][page_size][head_dim] in the cache dtype; the host pages go back to
// the cache's pool when the last copy of this goes.
struct SwappedKv {
  std::string salt;
  std::vector<int32_t> tokens;  // [kv_len]
  std::shared_ptr<const std::vector<uint8_t*>> pages;
  size_t bytes = 0;  // host bytes held: pages x one page of every layer's K and V
  // Of swap_out's time, seconds spent getting page-locked host memory (first uses of the swap
  // space: the driver pins its pages, slower than the copy itself); the rest is the copy.
  double pin_seconds = 0;
  int32_t kv_len() const { return int32_t(tokens.size()); }
};

class KvCache {
 public:
  explicit KvCache(const KvCacheConfig& config);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheConfig& config() const;

  // ---- sequences ----
  // A new, empty sequence. Requests with different salts never share pages.
  SeqId create_sequence(const std::string& cache_salt = "");
  // Reuses the longest chain of cached full pages matching the start of `tokens` (same salt).
  // The sequence must be empty. At most tokens.size() - 1 tokens are reused so that at least one
  // token is computed. Returns the number of tokens reused (a multiple of page_size).
  // Counted in stats() (the engine's one count of prefix reuse): a request's lookup
  // (resumed_computed 0) in prefix_queries / prefix_hits; a preempted sequence coming back, which
  // had computed resumed_computed tokens, in resume_hits (the part of those it finds again). A
  // sequence freed before append_slots gave it a token takes its lookup back (an admission that
  // did not go ahead).
  int32_t attach_prefix(SeqId seq, std::span<const int32_t> tokens, int32_t resumed_computed = 0);
  // Pages that append_slots(seq, n) would need to take from the allocator (CoW included).
  int32_t pages_needed(SeqId seq, int32_t n) const;
  bool can_append(SeqId seq, int32_t n) const;
  // Pages an allocation can take now: the free ones and the cached ones it may evict.
  int32_t num_available_pages() const;
  // Reserves slots for n new tokens at positions kv_len .. kv_len + n - 1, taking pages only when
  // the tail page overflows and copying a shared tail page first. `tokens` are their ids (n of
  // them), kept for prefix hashing. Returns the n slot ids. Throws Error (nothing changed) if the
  // pages do not fit.
  std::vector<int32_t> append_slots(SeqId seq, std::span<const int32_t> tokens);
  // Declares the K/V of the first `written` reserved positions written (-1: every reserved one):
  // the full pages among them get their hash and become reusable by attach_prefix. Error when
  // `written` is past kv_len.
  void commit(SeqId seq, int32_t written = -1);
  // Replaces the id recorded for reserved position `position` (append_slots took a stand-in: the
  // token was not known yet). Error when the position is not reserved or its page already has its
  // hash.
  void set_token(SeqId seq, int32_t position, int32_t token);
  // A child sharing all the parent's pages (refcounts raised); the salt is inherited.
  SeqId fork(SeqId parent);
  // Releases the sequence's pages (deepest first, so LRU evicts chain tails before parents).
  void free_sequence(SeqId seq);
  bool has_sequence(SeqId seq) const;

  int32_t kv_len(SeqId seq) const;
  std::span<const int32_t> block_table(SeqId seq) const;
  std::span<const int32_t> tokens(SeqId seq) const;

  // ---- swap ----
  // Host bytes that swap_out of a sequence of kv_len positions takes (its pages, whole).
  size_t swap_bytes(int32_t kv_len) const;
  // Takes host memory for swap_out ahead of need until about `bytes` are held (on a CUDA device,
  // page-locked: the driver pins it at a few GB/s, slower than the copies, which would otherwise
  // wait for it at the first swaps); less where the memory cannot be had. Returns the bytes held.
  size_t reserve_swap_space(size_t bytes);
  // Copies the K/V of every page of `seq` to host memory, then frees the sequence as
  // free_sequence does (its full pages stay in the prefix cache until evicted). Throws Error
  // (nothing changed) when the host memory cannot be had.
  SwappedKv swap_out(SeqId seq);
  // How many pages swap_in(kv) takes from what num_available_pages() counts: every page of kv but
  // those of its prefix that a live sequence still references (cached pages it revives count).
  int32_t swap_in_pages(const SwappedKv& kv) const;
  // A new sequence holding kv's tokens and K/V, ready to append: the longest prefix of its full
  // pages still in the prefix cache is attached (counted in resume_hits), the other pages are
  // taken from the allocator and copied back. Throws Error (nothing changed) when they do not fit
  // or kv does not match this cache's shape.
  SeqId swap_in(const SwappedKv& kv);

  // ---- pools ----
  // The view of one layer's pools (for the attention kernels and the write path).
  PagedKVView layer_view(int32_t layer) const;
  // fp8 caches: per-head scales of one layer (host values; copied to the pools' device). Must be
  // set for every layer before any write; they never change afterwards (setting a layer twice,
  // scales that are not finite and > 0, or scales for a non-fp8 cache raise Error). append_slots on
  // an fp8 cache raises Error until every layer has its scales.
  void set_scales(int32_t layer, std::span<const float> k_scale, std::span<const float> v_scale);
  // True when writes are allowed: a non-fp8 cache, or an fp8 cache with every layer's scales set.
  bool scales_set() const;
  // The copy-on-write copies made since the last call (config.record_page_copies; else empty).
  std::vector<PageCopy> take_page_copies();
  // Makes one such copy in the pools (a follower's cache, which has no sequences). Error for pages
  // outside the pool or filled outside [0, page_size].
  void copy_page_prefix(const PageCopy& copy);

  KvCacheStats stats() const;
  int32_t refcount(int32_t page) const;
  // Whether a page holds a prefix hash (registered in the hash -> page map).
  bool page_has_hash(int32_t page) const;
  const std::string& cache_salt(SeqId seq) const;
  // The page allocator, read-only (free list, LRU order of cached pages), for tests of the cache's
  // invariants; callers ask the cache itself (can_append, num_available_pages, pages_needed).
  const BlockAllocator& allocator() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagedattn
