#include "pagedattn/block_allocator.h"

namespace pagedattn {

BlockAllocator::BlockAllocator(int32_t num_pages) : num_pages_(num_pages) {
  PA_CHECK(num_pages > 0, "BlockAllocator: num_pages must be > 0, got ", num_pages);
  PA_CHECK(num_pages <= INT32_MAX - 2, "BlockAllocator: num_pages too large: ", num_pages);
  refcount_.assign(size_t(num_pages), 0);
  state_.assign(size_t(num_pages), State::free);
  prev_.resize(size_t(num_pages) + 2);
  next_.resize(size_t(num_pages) + 2);
  for (int list : {kFree, kCached}) {
    prev_[size_t(sentinel(list))] = next_[size_t(sentinel(list))] = sentinel(list);
  }
  for (int32_t p = 0; p < num_pages; ++p) push_back(kFree, p);
}

void BlockAllocator::check_page(int32_t page, const char* op) const {
  PA_CHECK(page >= 0 && page < num_pages_, "BlockAllocator::", op, ": page ", page,
           " is outside [0, ", num_pages_, ")");
}

void BlockAllocator::push_back(int list, int32_t page) {
  const int32_t s = sentinel(list);
  const int32_t last = prev_[size_t(s)];
  next_[size_t(last)] = page;
  prev_[size_t(page)] = last;
  next_[size_t(page)] = s;
  prev_[size_t(s)] = page;
  ++list_size_[list];
  state_[size_t(page)] = list == kFree ? State::free : State::cached;
}

void BlockAllocator::unlink(int list, int32_t page) {
  const int32_t p = prev_[size_t(page)], n = next_[size_t(page)];
  next_[size_t(p)] = n;
  prev_[size_t(n)] = p;
  prev_[size_t(page)] = next_[size_t(page)] = -1;
  --list_size_[list];
}

void BlockAllocator::incref(int32_t page) {
  check_page(page, "incref");
  PA_CHECK(state_[size_t(page)] == State::used, "BlockAllocator::incref: page ", page,
           " is not in use (revive a cached page instead)");
  PA_CHECK(refcount_[size_t(page)] < INT32_MAX, "BlockAllocator::incref: page ", page,
           " refcount overflow");
  ++refcount_[size_t(page)];
}

int32_t BlockAllocator::decref(int32_t page, bool has_hash) {
  check_page(page, "decref");
  PA_CHECK(state_[size_t(page)] == State::used, "BlockAllocator::decref: page ", page,
           " is not in use");
  const int32_t rc = --refcount_[size_t(page)];
  if (rc == 0) push_back(has_hash ? kCached : kFree, page);
  return rc;
}

int32_t BlockAllocator::refcount(int32_t page) const {
  check_page(page, "refcount");
  return refcount_[size_t(page)];
}

void BlockAllocator::revive(int32_t page) {
  check_page(page, "revive");
  PA_CHECK(state_[size_t(page)] == State::cached, "BlockAllocator::revive: page ", page,
           " is not cached");
  unlink(kCached, page);
  state_[size_t(page)] = State::used;
  refcount_[size_t(page)] = 1;
}

void BlockAllocator::uncache(int32_t page) {
  check_page(page, "uncache");
  PA_CHECK(state_[size_t(page)] == State::cached, "BlockAllocator::uncache: page ", page,
           " is not cached");
  unlink(kCached, page);
  push_back(kFree, page);
}

bool BlockAllocator::is_free(int32_t page) const {
  check_page(page, "is_free");
  return state_[size_t(page)] == State::free;
}

bool BlockAllocator::is_cached(int32_t page) const {
  check_page(page, "is_cached");
  return state_[size_t(page)] == State::cached;
}

std::vector<int32_t> BlockAllocator::lru_order() const {
  std::vector<int32_t> out;
  out.reserve(size_t(num_cached()));
  for (int32_t p = front(kCached); p != sentinel(kCached); p = next_[size_t(p)]) out.push_back(p);
  return out;
}

}  // namespace pagedattn
