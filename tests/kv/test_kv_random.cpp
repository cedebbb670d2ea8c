// A randomised differential test: thousands of random operation sequences (create + prefix attach,
// append + write, fork, write after fork, commit, free, bad calls) against a dense model of the
// cache (per sequence: its salt and tokens; the K/V of a position is a function of the salt and the
// tokens up to it). Every invariant is checked after every operation.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kv_test_util.h"

using namespace pagedattn;
using namespace pagedattn::testing_kv;

namespace {

// What the random runs exercised, so the test can insist each path was taken.
struct Coverage {
  int64_t prefix_hits = 0, cow_copies = 0, evictions = 0, full_appends = 0, bad_calls = 0;
  int64_t shared_writes = 0;
};

struct ModelSeq {
  std::string salt;
  std::vector<int32_t> tokens;
};

class Harness {
 public:
  Harness(const KvCacheConfig& c, uint64_t seed, Coverage& cov)
      : cache_(c), cfg_(c), rng_(seed), cov_(cov) {}

  void step() {
    const int r = uniform(0, 99);
    if (model_.empty() || r < 18) {
      op_create();
    } else if (r < 55) {
      op_append();
    } else if (r < 65) {
      op_fork();
    } else if (r < 78) {
      op_commit();
    } else if (r < 93) {
      op_free();
    } else {
      op_bad_call();
    }
  }

  // Every invariant, against the model.
  void check() {
    const int32_t ps = cfg_.page_size;
    const KvCacheStats st = cache_.stats();
    ASSERT_EQ(st.pages_used + st.pages_free + st.pages_cached, cfg_.num_pages);
    ASSERT_EQ(st.num_sequences, int32_t(model_.size()));
    std::vector<int32_t> count(size_t(cfg_.num_pages), 0);
    std::vector<std::vector<std::pair<SeqId, int32_t>>> holders(size_t(cfg_.num_pages));
    int64_t wasted = 0;
    for (const auto& [id, m] : model_) {
      ASSERT_TRUE(cache_.has_sequence(id));
      ASSERT_EQ(cache_.kv_len(id), int32_t(m.tokens.size()));
      ASSERT_TRUE(std::equal(m.tokens.begin(), m.tokens.end(), cache_.tokens(id).begin(),
                             cache_.tokens(id).end()));
      const std::span<const int32_t> table = cache_.block_table(id);
      ASSERT_EQ(table.size(), (m.tokens.size() + size_t(ps) - 1) / size_t(ps));
      wasted += int64_t(table.size()) * ps - int64_t(m.tokens.size());
      for (size_t i = 0; i < table.size(); ++i) {
        ASSERT_GE(table[i], 0);
        ASSERT_LT(table[i], cfg_.num_pages);
        ++count[size_t(table[i])];
        holders[size_t(table[i])].push_back({id, int32_t(i)});
      }
      check_data(id, m);
      if (testing::Test::HasFatalFailure()) return;
    }
    ASSERT_EQ(st.tail_slots_wasted, wasted);
    int32_t used = 0;
    for (int32_t p = 0; p < cfg_.num_pages; ++p) {
      ASSERT_EQ(cache_.refcount(p), count[size_t(p)]) << "page " << p;
      used += count[size_t(p)] > 0;
      if (count[size_t(p)] == 0) {
        // Unreferenced: cached exactly when it holds a hash, free otherwise.
        ASSERT_EQ(cache_.allocator().is_cached(p), cache_.page_has_hash(p)) << "page " << p;
        ASSERT_EQ(cache_.allocator().is_free(p), !cache_.page_has_hash(p)) << "page " << p;
      }
      check_sharing(p, holders[size_t(p)]);
      if (testing::Test::HasFatalFailure()) return;
    }
    ASSERT_EQ(st.pages_used, used);
    ASSERT_EQ(int32_t(cache_.allocator().lru_order().size()), st.pages_cached);
  }

 private:
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  SeqId pick() {
    auto it = model_.begin();
    std::advance(it, uniform(0, int(model_.size()) - 1));
    return it->first;
  }

  std::vector<int32_t> random_tokens(int n) {
    std::vector<int32_t> t(size_t(std::max(n, 0)));
    for (auto& x : t) x = uniform(0, 3);  // a tiny vocabulary: identical pages arise by chance
    return t;
  }

  std::vector<SeqId> live() const {
    std::vector<SeqId> ids;
    for (const auto& [id, m] : model_) ids.push_back(id);
    return ids;
  }

  // Appends and writes `tokens` if they fit (checking the page count against the model's
  // prediction), else checks that append_slots fails and changes nothing.
  void append(SeqId id, const std::vector<int32_t>& tokens) {
    ModelSeq& m = model_.at(id);
    const int32_t ps = cfg_.page_size, len = int32_t(m.tokens.size()), n = int32_t(tokens.size());
    const std::span<const int32_t> table = cache_.block_table(id);
    const bool shared_tail = len % ps != 0 && cache_.refcount(table.back()) > 1;
    // A page is taken only when the tail overflows (plus one copy of a shared partial tail).
    const int32_t predicted =
        n == 0 ? 0 : (len + n + ps - 1) / ps - (len + ps - 1) / ps + (shared_tail ? 1 : 0);
    ASSERT_EQ(cache_.pages_needed(id, n), predicted);
    const KvCacheStats before = cache_.stats();
    if (predicted > before.pages_free + before.pages_cached) {
      ASSERT_FALSE(cache_.can_append(id, n));
      const std::vector<SeqId> ids = live();
      const Snapshot snap = Snapshot::take(cache_, ids);
      ASSERT_THROW(cache_.append_slots(id, tokens), Error);
      ASSERT_TRUE(Snapshot::take(cache_, ids) == snap);
      ++cov_.full_appends;
      return;
    }
    ASSERT_TRUE(cache_.can_append(id, n));
    std::vector<int32_t> used_before;
    for (int32_t p = 0; p < cfg_.num_pages; ++p) {
      if (cache_.refcount(p) > 0) used_before.push_back(p);
    }
    const std::vector<int32_t> old_table(table.begin(), table.end());
    append_and_write(cache_, id, tokens);
    m.tokens.insert(m.tokens.end(), tokens.begin(), tokens.end());
    const KvCacheStats after = cache_.stats();
    ASSERT_EQ(after.pages_used - before.pages_used, predicted);
    const int32_t evicted = int32_t(after.evictions - before.evictions);
    ASSERT_EQ(evicted, std::max(0, predicted - before.pages_free))
        << "evicts only when free is empty";
    cov_.evictions += evicted;
    cov_.cow_copies += shared_tail && n > 0;
    // New pages were never pages in use by anyone.
    const std::span<const int32_t> now = cache_.block_table(id);
    for (size_t i = 0; i < now.size(); ++i) {
      if (i < old_table.size() && now[i] == old_table[i]) continue;
      ASSERT_FALSE(std::binary_search(used_before.begin(), used_before.end(), now[i]))
          << "page " << now[i] << " was in use";
    }
  }

  void op_create() {
    static const char* salts[] = {"", "", "t1", "t2"};
    const std::string salt = salts[uniform(0, 3)];
    std::vector<int32_t> tokens;
    if (!history_.empty() && uniform(0, 2) > 0) {
      // Revisit a committed prompt: a prefix of it, then something new.
      const auto& [hsalt, htoks] = history_[size_t(uniform(0, int(history_.size()) - 1))];
      tokens.assign(htoks.begin(), htoks.begin() + uniform(0, int(htoks.size())));
      const auto tail = random_tokens(uniform(0, cfg_.page_size * 2));
      tokens.insert(tokens.end(), tail.begin(), tail.end());
      if (uniform(0, 3) > 0) {
        create_with(hsalt, tokens);
        return;
      }
    } else {
      tokens = random_tokens(uniform(0, cfg_.page_size * 4));
    }
    create_with(salt, tokens);
  }

  void create_with(const std::string& salt, const std::vector<int32_t>& tokens) {
    const SeqId id = cache_.create_sequence(salt);
    ASSERT_TRUE(model_.emplace(id, ModelSeq{salt, {}}).second) << "sequence id reused";
    std::vector<bool> was_free(size_t(cfg_.num_pages));
    for (int32_t p = 0; p < cfg_.num_pages; ++p)
      was_free[size_t(p)] = cache_.allocator().is_free(p);
    const KvCacheStats before = cache_.stats();
    const int32_t reused = cache_.attach_prefix(id, tokens);
    const KvCacheStats after = cache_.stats();
    const int32_t ps = cfg_.page_size;
    ASSERT_EQ(reused % ps, 0);
    ASSERT_LE(reused, std::max<int32_t>(0, int32_t(tokens.size()) - 1));
    if (cfg_.enable_prefix_cache) {
      ASSERT_EQ(after.prefix_queries - before.prefix_queries, int64_t(tokens.size()));
      ASSERT_EQ(after.prefix_hits - before.prefix_hits, reused);
    } else {
      ASSERT_EQ(reused, 0);
    }
    ASSERT_EQ(after.evictions, before.evictions) << "attaching never evicts";
    for (int32_t p : cache_.block_table(id)) {
      ASSERT_FALSE(was_free[size_t(p)]) << "a prefix page must come from the cache";
      ASSERT_TRUE(cache_.page_has_hash(p));
    }
    ModelSeq& m = model_.at(id);
    m.tokens.assign(tokens.begin(), tokens.begin() + reused);
    cov_.prefix_hits += reused > 0;
    check_data(id, m);  // the reused K/V is exactly the K/V of these tokens under this salt
    if (testing::Test::HasFatalFailure()) return;
    append(id, std::vector<int32_t>(tokens.begin() + reused, tokens.end()));
  }

  void op_append() {
    const SeqId id = pick();
    append(id, random_tokens(uniform(1, 2 * cfg_.page_size + 1)));
  }

  void op_fork() {
    const SeqId parent = pick();
    const SeqId child = cache_.fork(parent);
    ASSERT_TRUE(model_.emplace(child, model_.at(parent)).second) << "sequence id reused";
    // Often write straight after the fork, into either side.
    if (uniform(0, 1)) {
      ++cov_.shared_writes;
      append(uniform(0, 1) ? child : parent, random_tokens(uniform(1, 3)));
    }
  }

  void op_commit() {
    const SeqId id = pick();
    cache_.commit(id);
    const ModelSeq& m = model_.at(id);
    if (m.tokens.size() >= size_t(cfg_.page_size)) history_.push_back({m.salt, m.tokens});
    if (history_.size() > 32) history_.erase(history_.begin());
  }

  void op_free() {
    const SeqId id = pick();
    cache_.free_sequence(id);
    model_.erase(id);
    ASSERT_FALSE(cache_.has_sequence(id));
  }

  void op_bad_call() {
    const std::vector<SeqId> ids = live();
    const Snapshot snap = Snapshot::take(cache_, ids);
    const SeqId unknown = 1'000'000 + uniform(0, 100);
    const std::vector<int32_t> t = {1};
    switch (uniform(0, 5)) {
      case 0:
        ASSERT_THROW(cache_.append_slots(unknown, t), Error);
        break;
      case 1:
        ASSERT_THROW(cache_.fork(unknown), Error);
        break;
      case 2:
        ASSERT_THROW(cache_.free_sequence(unknown), Error);
        break;
      case 3:
        ASSERT_THROW(cache_.commit(unknown), Error);
        break;
      case 4:
        ASSERT_THROW((void)cache_.pages_needed(pick(), -1), Error);
        break;
      default: {
        const SeqId id = pick();
        if (model_.at(id).tokens.empty()) return;
        ASSERT_THROW(cache_.attach_prefix(id, t), Error);
      }
    }
    ASSERT_TRUE(Snapshot::take(cache_, ids) == snap);
    ++cov_.bad_calls;
  }

  // The K/V read through the block table equals the values of (salt, tokens), fast path.
  void check_data(SeqId id, const ModelSeq& m) {
    const std::vector<uint64_t> keys = prefix_keys(m.salt, m.tokens);
    const std::span<const int32_t> table = cache_.block_table(id);
    ASSERT_EQ(table.size(),
              (m.tokens.size() + size_t(cfg_.page_size) - 1) / size_t(cfg_.page_size));
    for (int32_t l = 0; l < cfg_.num_layers; ++l) {
      const PagedKVView v = cache_.layer_view(l);
      for (size_t pos = 0; pos < m.tokens.size(); ++pos) {
        const int32_t page = table[pos / size_t(v.page_size)];
        for (int32_t h = 0; h < v.num_kv_heads; ++h) {
          const int64_t off = v.offset(page, h, int32_t(pos % size_t(v.page_size)));
          for (int32_t d = 0; d < v.head_dim; ++d) {
            for (int which : {0, 1}) {
              const float got = load_as_f32(which ? v.v_pages : v.k_pages, v.dtype, off + d);
              const float want = stored_value(kv_value(keys[pos], l, h, d, which), v.dtype);
              ASSERT_EQ(got, want) << "seq " << id << " layer " << l << " pos " << pos;
            }
          }
        }
      }
    }
  }

  // A page held by several sequences: same logical index, same salt, same tokens up to the end
  // of the page (a chained hash or a fork), and a partial page only between equal lengths.
  void check_sharing(int32_t page, const std::vector<std::pair<SeqId, int32_t>>& holders) {
    if (holders.size() < 2) return;
    const size_t ps = size_t(cfg_.page_size);
    const auto& [id0, idx0] = holders[0];
    const ModelSeq& m0 = model_.at(id0);
    for (size_t k = 1; k < holders.size(); ++k) {
      const auto& [id, idx] = holders[k];
      const ModelSeq& m = model_.at(id);
      ASSERT_EQ(idx, idx0) << "page " << page << " at different positions";
      ASSERT_EQ(m.salt, m0.salt) << "page " << page << " shared across salts";
      const size_t end = std::min({m.tokens.size(), m0.tokens.size(), (size_t(idx) + 1) * ps});
      ASSERT_TRUE(
          std::equal(m.tokens.begin(), m.tokens.begin() + ptrdiff_t(end), m0.tokens.begin()))
          << "page " << page << " shared by sequences with different prefixes";
      const bool partial = std::min(m.tokens.size(), m0.tokens.size()) < (size_t(idx) + 1) * ps;
      if (partial) {
        ASSERT_EQ(m.tokens.size(), m0.tokens.size()) << "partial page " << page;
      }
    }
  }

  KvCache cache_;
  KvCacheConfig cfg_;
  std::mt19937_64 rng_;
  std::map<SeqId, ModelSeq> model_;
  std::vector<std::pair<std::string, std::vector<int32_t>>> history_;
  Coverage& cov_;
};

void run_one(uint64_t seed, Coverage& cov) {
  std::mt19937_64 rng(seed);
  auto pick = [&](std::initializer_list<int32_t> xs) {
    return *(xs.begin() + std::uniform_int_distribution<size_t>(0, xs.size() - 1)(rng));
  };
  KvCacheConfig c;
  c.num_layers = pick({1, 2});
  c.num_kv_heads = pick({1, 2});
  c.head_dim = pick({1, 2, 3});
  c.page_size = pick({1, 2, 3, 4, 5, 8});
  c.num_pages = pick({3, 6, 10, 16, 24, 40});
  c.dtype = pick({0, 0, 0, 1}) ? DType::bf16 : DType::f32;
  c.enable_prefix_cache = pick({1, 1, 1, 1, 1, 1, 1, 1, 1, 0}) != 0;
  Harness h(c, seed * 7919 + 1, cov);
  for (int op = 0; op < 60; ++op) {
    h.step();
    if (testing::Test::HasFatalFailure()) {
      ADD_FAILURE() << "seed " << seed << " op " << op << " page_size " << c.page_size
                    << " num_pages " << c.num_pages;
      return;
    }
    h.check();
    if (testing::Test::HasFatalFailure()) {
      ADD_FAILURE() << "seed " << seed << " after op " << op << " page_size " << c.page_size
                    << " num_pages " << c.num_pages;
      return;
    }
  }
}

}  // namespace

TEST(KvCacheRandom, DifferentialAgainstDenseModel) {
  Coverage cov;
  for (uint64_t seed = 1; seed <= 3000; ++seed) {
    run_one(seed, cov);
    if (testing::Test::HasFailure()) return;
  }
  // Every path of interest was exercised many times.
  EXPECT_GT(cov.prefix_hits, 1000);
  EXPECT_GT(cov.cow_copies, 1000);
  EXPECT_GT(cov.evictions, 1000);
  EXPECT_GT(cov.full_appends, 1000);
  EXPECT_GT(cov.bad_calls, 1000);
  EXPECT_GT(cov.shared_writes, 1000);
  std::cout << "  prefix hits " << cov.prefix_hits << ", CoW copies " << cov.cow_copies
            << ", evictions " << cov.evictions << ", appends refused " << cov.full_appends
            << ", bad calls " << cov.bad_calls << "\n";
}
