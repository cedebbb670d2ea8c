// Bad arguments: every one raises Error naming it, from every host backend, and nothing is written.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "pagedattn/error.h"
#include "problem.h"

using namespace pagedattn;
using namespace pagedattn::testing;

namespace {

// A small valid problem: 3 sequences, page size 4, 4 query heads over 2 KV heads.
ProblemSpec base_spec(DType kv = DType::f32) {
  ProblemSpec s;
  s.num_q_heads = 4, s.num_kv_heads = 2, s.head_dim = 8, s.page_size = 4;
  s.kv_dtype = kv;
  s.q_len = {1, 5, 2}, s.kv_len = {9, 5, 7};
  return s;
}

// The arguments of one call, all editable by a test.
struct Call {
  Problem pr;
  QKVTensor q;
  PagedKVView kv;
  BatchLayout batch;
  AttentionOptions opt;
  OutBuffer out;
  explicit Call(const ProblemSpec& s = base_spec())
      : pr(s, 1),
        q(pr.q_tensor()),
        kv(pr.view()),
        batch(pr.batch()),
        opt(s.opt),
        out(pr, DType::f32) {}
  Call(const Call&) = delete;  // the views point into pr and out
  Call& operator=(const Call&) = delete;
};

using Mutation = std::function<void(Call&)>;

// Every backend rejects the mutated call with a message containing `needle`, and the output
// buffer (NaN-poisoned) is left exactly as it was.
void expect_rejected(const Mutation& mutate, const std::string& needle,
                     const ProblemSpec& spec = base_spec()) {
  using Backend = std::function<void(Call&)>;
  const Backend backends[] = {
      [](Call& c) { validate_paged_attention(c.q, c.kv, c.batch, c.opt, c.out.t); },
      [](Call& c) { paged_attention_reference(c.q, c.kv, c.batch, c.opt, c.out.t); },
      [](Call& c) { paged_attention_cpu(c.q, c.kv, c.batch, c.opt, c.out.t); },
  };
  for (const Backend& run : backends) {
    Call c(spec);
    mutate(c);
    const std::vector<uint8_t> before = c.out.bytes;
    try {
      run(c);
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("paged_attention: ", 0), 0u) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos)
          << "message '" << msg << "' lacks '" << needle << "'";
    }
    EXPECT_EQ(c.out.bytes, before) << "a rejected call wrote to out (" << needle << ")";
  }
}

TEST(ValidatePagedAttention, AcceptsAValidCall) {
  Call c;
  EXPECT_NO_THROW(validate_paged_attention(c.q, c.kv, c.batch, c.opt, c.out.t));
}

TEST(ValidatePagedAttention, ShapesThatDisagree) {
  expect_rejected([](Call& c) { c.q.head_dim = 16; },
                  "q.head_dim (16) does not match kv.head_dim (8)");
  expect_rejected([](Call& c) { c.out.t.head_dim = 4; },
                  "out.head_dim (4) does not match kv.head_dim");
  expect_rejected([](Call& c) { c.out.t.num_tokens -= 1; },
                  "out.num_tokens (7) does not match q.num_tokens (8)");
  expect_rejected([](Call& c) { c.out.t.num_heads = 2; },
                  "out.num_heads (2) does not match q.num_heads (4)");
  expect_rejected([](Call& c) { c.q.num_heads = 3, c.out.t.num_heads = 3; },
                  "num_q_heads (3) is not a multiple of kv.num_kv_heads (2)");
  expect_rejected([](Call& c) { c.kv.num_kv_heads = 0; }, "kv.num_kv_heads must be > 0");
  expect_rejected([](Call& c) { c.kv.page_size = 0; }, "kv.page_size must be > 0");
  expect_rejected([](Call& c) { c.q.num_tokens = -1; }, "q.num_tokens must be >= 0");
  expect_rejected([](Call& c) { c.q.data = nullptr; }, "q.data is null");
  expect_rejected([](Call& c) { c.kv.v_pages = nullptr; }, "kv.k_pages or kv.v_pages is null");
}

TEST(ValidatePagedAttention, QIndptr) {
  expect_rejected(
      [](Call& c) {
        static const int32_t indptr[] = {1, 1, 6, 8};
        c.batch.q_indptr = indptr;
      },
      "q_indptr[0] must be 0, got 1");
  expect_rejected(
      [](Call& c) {
        static const int32_t indptr[] = {0, 4, 2, 8};
        static const int32_t kv_len[] = {9, 5, 7};
        c.batch.q_indptr = indptr, c.batch.kv_len = kv_len;
      },
      "q_indptr must be non-decreasing, but q_indptr[2] = 2 < q_indptr[1] = 4");
  expect_rejected(
      [](Call& c) {
        static const int32_t indptr[] = {0, 1, 6, 7};
        c.batch.q_indptr = indptr;
      },
      "q_indptr[3] = 7 must equal q.num_tokens (8)");
  expect_rejected([](Call& c) { c.batch.q_indptr = nullptr; }, "batch.q_indptr is null");
}

TEST(ValidatePagedAttention, KvLen) {
  expect_rejected(
      [](Call& c) {
        c.pr.kv_len[1] = 4;
        c.batch.kv_len = c.pr.kv_len.data();
      },
      "q_len of sequence 1 (5) exceeds kv_len[1] = 4");
  expect_rejected(
      [](Call& c) {
        c.pr.kv_len[2] = -1;
        c.batch.kv_len = c.pr.kv_len.data();
      },
      "kv_len[2] must be >= 0, got -1");
  // max_pages_per_seq is 3 (+1 spare column) pages of 4 tokens: 17 tokens do not fit.
  expect_rejected(
      [](Call& c) {
        c.pr.kv_len[0] = 17;
        c.batch.kv_len = c.pr.kv_len.data();
      },
      "kv_len[0] = 17 exceeds the block table (4 pages x 4 tokens)");
  expect_rejected([](Call& c) { c.batch.kv_len = nullptr; }, "batch.kv_len is null");
}

TEST(ValidatePagedAttention, PageIdOutsideThePool) {
  expect_rejected([](Call& c) { c.pr.block_table[1 * c.pr.max_pages_per_seq + 1] = 70000; },
                  "block_table[1][1] = 70000 is outside the pool of 10 pages");
  expect_rejected([](Call& c) { c.pr.block_table[2 * c.pr.max_pages_per_seq + 0] = -1; },
                  "block_table[2][0] = -1 is outside the pool");
  // Entries past a sequence's used pages are never read, so garbage there is accepted.
  Call c;
  c.pr.block_table[0 * c.pr.max_pages_per_seq + 3] = 70000;
  EXPECT_NO_THROW(validate_paged_attention(c.q, c.kv, c.batch, c.opt, c.out.t));
}

TEST(ValidatePagedAttention, Dtypes) {
  expect_rejected([](Call& c) { c.q.dtype = DType::fp8_e4m3; },
                  "q.dtype must be f32, f16 or bf16, got fp8_e4m3");
  expect_rejected([](Call& c) { c.out.t.dtype = DType::fp8_e4m3; },
                  "out.dtype must be f32, f16 or bf16");
}

TEST(ValidatePagedAttention, Fp8PoolsNeedScales) {
  const ProblemSpec fp8 = base_spec(DType::fp8_e4m3);
  expect_rejected([](Call& c) { c.kv.k_scale = nullptr; },
                  "kv.k_scale is null but the pools are fp8_e4m3", fp8);
  expect_rejected([](Call& c) { c.kv.v_scale = nullptr; },
                  "kv.v_scale is null but the pools are fp8_e4m3", fp8);
}

TEST(ValidatePagedAttention, Options) {
  expect_rejected([](Call& c) { c.opt.window = -1; }, "opt.window must be >= 0");
  expect_rejected([](Call& c) { c.opt.softcap = -2.f; }, "opt.softcap must be finite and >= 0");
  expect_rejected([](Call& c) { c.opt.softcap = INFINITY; }, "opt.softcap must be finite");
  expect_rejected([](Call& c) { c.opt.scale = NAN; }, "opt.scale must be finite");
  expect_rejected([](Call& c) { c.opt.scale = INFINITY; }, "opt.scale must be finite");
}

// Host backends also read fp8 scales: a zero, negative or NaN scale is refused.
TEST(ValidatePagedAttention, Fp8ScaleValuesOnHostBackends) {
  for (float bad : {0.f, -1.f, NAN}) {
    Call c(base_spec(DType::fp8_e4m3));
    c.pr.v_scale[1] = bad;
    const std::vector<uint8_t> before = c.out.bytes;
    try {
      paged_attention_cpu(c.q, c.kv, c.batch, c.opt, c.out.t);
      ADD_FAILURE() << "scale " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("kv.v_scale[1]"), std::string::npos) << e.what();
    }
    EXPECT_EQ(c.out.bytes, before);
  }
}

}  // namespace
