// KvCache: bad input for every method raises Error naming the operation and the argument, and
// leaves the cache exactly as it was.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "kv_test_util.h"

using namespace pagedattn;
using namespace pagedattn::testing_kv;

namespace {

// Runs f, expects an Error whose message starts with `op` + ":" and contains `arg`.
template <class F>
void expect_error(F&& f, const std::string& op, const std::string& arg) {
  try {
    f();
    ADD_FAILURE() << "no Error from " << op;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(op + ":", 0), 0u) << msg;
    EXPECT_NE(msg.find(arg), std::string::npos) << "'" << arg << "' not named in: " << msg;
  }
}

KvCacheConfig config(int32_t num_pages, int32_t page_size) {
  KvCacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.head_dim = 4;
  c.page_size = page_size;
  c.num_pages = num_pages;
  return c;
}

}  // namespace

TEST(KvCacheErrors, ConstructorRejectsBadConfig) {
  auto with = [](auto edit) {
    KvCacheConfig c = config(4, 4);
    edit(c);
    return c;
  };
  expect_error([&] { KvCache k(with([](KvCacheConfig& c) { c.num_layers = 0; })); }, "KvCache",
               "num_layers");
  expect_error([&] { KvCache k(with([](KvCacheConfig& c) { c.num_kv_heads = -1; })); }, "KvCache",
               "num_kv_heads");
  expect_error([&] { KvCache k(with([](KvCacheConfig& c) { c.head_dim = 0; })); }, "KvCache",
               "head_dim");
  expect_error([&] { KvCache k(with([](KvCacheConfig& c) { c.page_size = 0; })); }, "KvCache",
               "page_size");
  expect_error([&] { KvCache k(with([](KvCacheConfig& c) { c.num_pages = 0; })); }, "KvCache",
               "num_pages");
  expect_error(
      [&] {
        KvCache k(with([](KvCacheConfig& c) {
          c.num_pages = 1 << 20;
          c.page_size = 1 << 12;
        }));
      },
      "KvCache", "num_pages * page_size");
}

TEST(KvCacheErrors, EveryMethodRejectsBadInputAndChangesNothing) {
  KvCache cache(config(6, 4));
  const SeqId a = cache.create_sequence();
  append_and_write(cache, a, std::vector<int32_t>{1, 2, 3, 4, 5});
  cache.commit(a);
  const SeqId b = cache.fork(a);
  const SeqId gone = cache.create_sequence();
  cache.free_sequence(gone);
  const std::vector<SeqId> seqs = {a, b};
  const Snapshot before = Snapshot::take(cache, seqs);
  const std::vector<int32_t> toks = {1, 2};

  for (SeqId bad : {gone, SeqId(-1), SeqId(12345)}) {
    expect_error([&] { cache.attach_prefix(bad, toks); }, "attach_prefix", "seq");
    expect_error([&] { (void)cache.pages_needed(bad, 1); }, "pages_needed", "seq");
    expect_error([&] { (void)cache.can_append(bad, 1); }, "can_append", "seq");
    expect_error([&] { cache.append_slots(bad, toks); }, "append_slots", "seq");
    expect_error([&] { cache.commit(bad); }, "commit", "seq");
    expect_error([&] { cache.fork(bad); }, "fork", "seq");
    expect_error([&] { cache.free_sequence(bad); }, "free_sequence", "seq");
    expect_error([&] { (void)cache.kv_len(bad); }, "kv_len", "seq");
    expect_error([&] { (void)cache.block_table(bad); }, "block_table", "seq");
    expect_error([&] { (void)cache.tokens(bad); }, "tokens", "seq");
    expect_error([&] { (void)cache.cache_salt(bad); }, "cache_salt", "seq");
    EXPECT_FALSE(cache.has_sequence(bad));
  }
  expect_error([&] { (void)cache.pages_needed(a, -1); }, "pages_needed", "n");
  expect_error([&] { (void)cache.can_append(a, -5); }, "can_append", "n");
  expect_error([&] { cache.attach_prefix(a, toks); }, "attach_prefix", "must be empty");
  // 6 pages: a and b share 2; 4 free. b needs 1 (CoW) + ceil((5 + n) / 4) - 2 pages.
  EXPECT_EQ(cache.pages_needed(b, 15), 4);
  EXPECT_TRUE(cache.can_append(b, 15));
  EXPECT_EQ(cache.pages_needed(b, 16), 5);
  EXPECT_FALSE(cache.can_append(b, 16));
  expect_error([&] { cache.append_slots(b, std::vector<int32_t>(16, 7)); }, "append_slots",
               "pages");
  expect_error([&] { cache.append_slots(b, std::vector<int32_t>(100, 7)); }, "append_slots",
               "tokens");
  for (int32_t layer : {-1, 2}) {
    expect_error([&] { (void)cache.layer_view(layer); }, "layer_view", "layer");
  }
  for (int32_t page : {-1, 6}) {
    expect_error([&] { (void)cache.refcount(page); }, "refcount", "page");
    expect_error([&] { (void)cache.page_has_hash(page); }, "page_has_hash", "page");
  }
  const std::vector<float> ones(2, 1.f);
  expect_error([&] { cache.set_scales(0, ones, ones); }, "set_scales", "dtype");
  EXPECT_TRUE(Snapshot::take(cache, seqs) == before);
  // Still fully usable.
  EXPECT_TRUE(kv_matches(cache, a, "", std::vector<int32_t>{1, 2, 3, 4, 5}));
  append_and_write(cache, b, std::vector<int32_t>(15, 7));
  EXPECT_EQ(cache.stats().pages_free + cache.stats().pages_cached, 0);
}

TEST(KvCacheErrors, FailedCopyOnWriteAppendChangesNothing) {
  // A shared partial tail needs a page for its copy even for one token; with none left the
  // append must fail before anything moves.
  KvCache cache(config(2, 4));
  const SeqId a = cache.create_sequence();
  append_and_write(cache, a, std::vector<int32_t>{1, 2, 3, 4, 5, 6});
  const SeqId b = cache.fork(a);
  EXPECT_EQ(cache.pages_needed(b, 1), 1);
  EXPECT_FALSE(cache.can_append(b, 1));
  const std::vector<SeqId> seqs = {a, b};
  const Snapshot before = Snapshot::take(cache, seqs);
  expect_error([&] { cache.append_slots(b, std::vector<int32_t>{7}); }, "append_slots", "pages");
  EXPECT_TRUE(Snapshot::take(cache, seqs) == before);
  // Freeing the parent makes the tail b's alone: it now appends in place.
  cache.free_sequence(a);
  EXPECT_EQ(cache.pages_needed(b, 1), 0);
  std::vector<int32_t> all = {1, 2, 3, 4, 5, 6, 7};
  append_and_write(cache, b, std::vector<int32_t>{7});
  EXPECT_TRUE(kv_matches(cache, b, "", all));
}
