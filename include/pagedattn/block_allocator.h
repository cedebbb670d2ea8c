// BlockAllocator: page ids with reference counts, a free list and an LRU list of cached pages.
//
// Pages are int32 ids in [0, num_pages). Every page is in exactly one state:
//   free    : refcount 0, no prefix hash, in the free list;
//   cached  : refcount 0, holds a prefix hash, in the LRU list (evictable);
//   in use  : refcount >= 1 (maybe also holding a hash).
// Both lists are index-linked doubly linked lists (prev/next arrays), so alloc, free, and reviving
// a cached page from the middle of the LRU list are O(1).
//
// The free list is FIFO (a freed page goes to the tail, alloc takes the head). The LRU list's head
// is the least recently released cached page: alloc evicts it when the free list is empty.
// Bad page ids and calls in the wrong state (incref of an unreferenced page, revive of a page that
// is not cached, ...) raise Error and change nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "pagedattn/error.h"

namespace pagedattn {

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_pages);

  int32_t num_pages() const { return num_pages_; }
  int32_t num_free() const { return list_size_[kFree]; }      // in the free list
  int32_t num_cached() const { return list_size_[kCached]; }  // unreferenced, holding a prefix hash
  int32_t num_used() const { return num_pages_ - num_free() - num_cached(); }  // refcount >= 1
  // Pages an allocation can take right now: free + cached.
  int32_t num_available() const { return num_free() + num_cached(); }

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

  bool is_free(int32_t page) const;
  bool is_cached(int32_t page) const;
  // The cached pages from least to most recently released (O(num_cached); for tests and debugging).
  std::vector<int32_t> lru_order() const;

 private:
  static constexpr int kFree = 0, kCached = 1;
  enum class State : uint8_t { free, cached, used };

  void check_page(int32_t page, const char* op) const;
  // List `list` has its sentinel node at index num_pages_ + list.
  int32_t sentinel(int list) const { return num_pages_ + list; }
  void push_back(int list, int32_t page);
  void unlink(int list, int32_t page);
  int32_t front(int list) const { return next_[size_t(sentinel(list))]; }

  int32_t num_pages_ = 0;
  std::vector<int32_t> refcount_;  // [num_pages]
  std::vector<State> state_;       // [num_pages]
  std::vector<int32_t> prev_;      // [num_pages + 2]: the two sentinels at the end
  std::vector<int32_t> next_;      // [num_pages + 2]
  int32_t list_size_[2] = {0, 0};
};

template <class OnEvict>
int32_t BlockAllocator::alloc(OnEvict&& on_evict) {
  PA_CHECK(num_available() > 0, "BlockAllocator::alloc: no page available (all ", num_pages_,
           " pages in use)");
  int32_t page;
  if (num_free() > 0) {
    page = front(kFree);
    unlink(kFree, page);
  } else {
    page = front(kCached);
    on_evict(page);
    unlink(kCached, page);
  }
  state_[size_t(page)] = State::used;
  refcount_[size_t(page)] = 1;
  return page;
}

}  // namespace pagedattn
