// The KV write path: values land in their slots converted to the pool dtype (fp8 divided by the
// head's scale), nothing else changes, and a bad slot anywhere in the list writes nothing.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "pagedattn/attention.h"
#include "pagedattn/error.h"
#include "problem.h"

using namespace pagedattn;
using namespace pagedattn::testing;

namespace {

struct Pools {
  int32_t num_pages = 6, heads = 2, page = 4, dim = 8;
  DType dtype;
  std::vector<uint8_t> k, v;
  std::vector<float> k_scale{0.5f, 0.25f}, v_scale{2.f, 0.125f};
  explicit Pools(DType t) : dtype(t) {
    k = nan_buffer(t, int64_t(num_pages) * heads * page * dim);
    v = k;
  }
  PagedKVView view() {
    return PagedKVView{k.data(), v.data(), dtype,          num_pages,     heads,
                       page,     dim,      k_scale.data(), v_scale.data()};
  }
};

TEST(WriteKvCpu, StoresConvertedValuesInTheirSlotsOnly) {
  for (DType pool : {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3}) {
    for (DType src : {DType::f32, DType::bf16}) {
      Pools p(pool);
      const PagedKVView kv = p.view();
      const std::vector<int32_t> slots = {13, 0, 23, 5};  // page 3 slot 1, page 0 slot 0, ...
      const int32_t n = int32_t(slots.size());
      std::mt19937 rng(1);
      std::normal_distribution<float> normal;
      const int64_t elems = int64_t(n) * p.heads * p.dim;
      std::vector<uint8_t> k(size_t(elems) * dtype_size(src)), v = k;
      for (int64_t i = 0; i < elems; ++i) {
        store_from_f32(k.data(), src, i, normal(rng));
        store_from_f32(v.data(), src, i, normal(rng));
      }
      write_kv_cpu(kv, slots.data(), n, k.data(), v.data(), src);
      std::vector<bool> written(size_t(p.num_pages) * p.heads * p.page * p.dim, false);
      for (int32_t t = 0; t < n; ++t)
        for (int32_t h = 0; h < p.heads; ++h)
          for (int32_t d = 0; d < p.dim; ++d) {
            const int64_t dst =
                kv.offset(slots[size_t(t)] / p.page, h, slots[size_t(t)] % p.page) + d;
            const int64_t s = (int64_t(t) * p.heads + h) * p.dim + d;
            const bool fp8 = pool == DType::fp8_e4m3;
            const float ks = fp8 ? p.k_scale[size_t(h)] : 1.f,
                        vs = fp8 ? p.v_scale[size_t(h)] : 1.f;
            // The stored value is the source converted to the pool dtype, once.
            std::vector<uint8_t> one(dtype_size(pool));
            store_from_f32(one.data(), pool, 0, load_as_f32(k.data(), src, s) / ks);
            EXPECT_EQ(f32_bits(load_as_f32(p.k.data(), pool, dst)),
                      f32_bits(load_as_f32(one.data(), pool, 0)));
            store_from_f32(one.data(), pool, 0, load_as_f32(v.data(), src, s) / vs);
            EXPECT_EQ(f32_bits(load_as_f32(p.v.data(), pool, dst)),
                      f32_bits(load_as_f32(one.data(), pool, 0)));
            written[size_t(dst)] = true;
          }
      for (size_t i = 0; i < written.size(); ++i) {
        if (!written[i]) {
          ASSERT_TRUE(std::isnan(load_as_f32(p.k.data(), pool, int64_t(i)))) << i;
        }
      }
    }
  }
}

TEST(WriteKvCpu, BadSlotWritesNothing) {
  Pools p(DType::bf16);
  const PagedKVView kv = p.view();
  std::vector<float> k(size_t(4) * p.heads * p.dim, 1.f), v = k;
  const std::vector<uint8_t> k_before = p.k, v_before = p.v;
  for (int32_t bad : {-1, 24, 1 << 30}) {  // the pool has 6 pages x 4 slots
    const std::vector<int32_t> slots = {3, 7, bad, 9};
    try {
      write_kv_cpu(kv, slots.data(), 4, k.data(), v.data(), DType::f32);
      ADD_FAILURE() << "slot " << bad << " accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("write_kv: ", 0), 0u) << msg;
      EXPECT_NE(msg.find("slots[2] = " + std::to_string(bad)), std::string::npos) << msg;
    }
    EXPECT_EQ(p.k, k_before);
    EXPECT_EQ(p.v, v_before);
  }
}

TEST(WriteKvCpu, Fp8WithoutScalesIsRefused) {
  Pools p(DType::fp8_e4m3);
  PagedKVView kv = p.view();
  kv.v_scale = nullptr;
  const int32_t slot = 0;
  std::vector<float> k(size_t(p.heads) * p.dim, 1.f), v = k;
  EXPECT_THROW(write_kv_cpu(kv, &slot, 1, k.data(), v.data(), DType::f32), Error);
  EXPECT_TRUE(std::isnan(load_as_f32(p.k.data(), DType::fp8_e4m3, 0)));
}

}  // namespace
