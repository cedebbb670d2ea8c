// BlockAllocator: page ids with reference counts, a free list and an LRU list of cached pages.
//
// Pages are int32 ids in [0, num_pages). Every page is in exactly one state:
//   free    : refcount 0, no prefix hash, in the free list;
//   cached  : refcount 0, holds a prefix hash, in the LRU list (evictable);
//   in use  : refcount >= 1 (maybe also holding a hash).
// Both lists are index-linked doubly linked lists (prev/next arrays), so alloc, free, and reviving a
// cached page from the middle of the LRU list are O(1).
#pragma once

#include <cstdint>
#include <vector>

namespace pagedattn {

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_pages);

  int32_t num_pages() const;
  int32_t num_free() const;     // in the free list
  int32_t num_cached() const;   // unreferenced but holding a prefix hash (evictable)
  int32_t num_used() const;     // refcount >= 1
  // Pages an allocation can take right now: free + cached.
  int32_t num_available() const;

  // Takes a page from the free list, else evicts the least recently used cached page (calling
  // on_evict(page) first so the owner can drop its hash). Throws Error when none is available.
  // The new page has refcount 1.
  template <class OnEvict>
  int32_t alloc(OnEvict&& on_evict);

  void incref(int32_t page);
  // Drops one reference; at zero the page goes to the LRU tail if cached (has_hash) else to the
  // free list. Returns the new count.
  int32_t decref(int32_t page, bool has_hash);
  int32_t refcount(int32_t page) const;
  // A cached page (refcount 0, in the LRU list) taken back into use: refcount becomes 1.
  void revive(int32_t page);
  // A cached unreferenced page that lost its hash goes to the free list.
  void uncache(int32_t page);
};

}  // namespace pagedattn
