// write_kv_cuda against write_kv_cpu: the same bytes in every pool dtype, from every source dtype.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "cuda_problem.h"
#include "pagedattn/error.h"

using namespace pagedattn;
using namespace pagedattn::gputest;

TEST(CudaWriteKv, BitIdenticalToCpu) {
  PA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.f, 2.f);
  for (DType pool : {DType::bf16, DType::f16, DType::fp8_e4m3}) {
    for (DType src : {DType::f32, DType::f16, DType::bf16}) {
      const int32_t pages = 40, Hk = 3, P = 16, D = 64, T = 123;
      const int64_t pool_elems = int64_t(pages) * Hk * P * D;
      std::vector<uint8_t> k_pool(size_t(pool_elems) * dtype_size(pool)), v_pool(k_pool.size());
      for (auto& b : k_pool) b = uint8_t(rng());
      for (auto& b : v_pool) b = uint8_t(rng());
      // Distinct random slots; values include some far beyond fp8's range (saturation).
      std::vector<int32_t> slots(size_t(pages) * P);
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), rng);
      slots.resize(T);
      const int64_t n = int64_t(T) * Hk * D;
      std::vector<uint8_t> k(size_t(n) * dtype_size(src)), v(k.size());
      for (int64_t i = 0; i < n; ++i) {
        const float big = i % 97 == 0 ? 1e4f : 1.f;
        store_from_f32(k.data(), src, i, normal(rng) * big);
        store_from_f32(v.data(), src, i, normal(rng) * big);
      }
      std::vector<float> ks = {0.01f, 0.03f, 0.2f}, vs = {0.02f, 0.05f, 0.7f};

      PagedKVView host{k_pool.data(), v_pool.data(), pool, pages, Hk, P, D, ks.data(), vs.data()};
      Tensor dk = Problem::to_device(k_pool.data(), k_pool.size());
      Tensor dv = Problem::to_device(v_pool.data(), v_pool.size());
      Tensor dks = Problem::to_device(ks.data(), 12), dvs = Problem::to_device(vs.data(), 12);
      Tensor dslots = Problem::to_device(slots.data(), slots.size() * 4);
      Tensor dsk = Problem::to_device(k.data(), k.size()),
             dsv = Problem::to_device(v.data(), v.size());
      PagedKVView dev{dk.data(),           dv.data(), pool, pages, Hk, P, D, dks.data_as<float>(),
                      dvs.data_as<float>()};

      write_kv_cpu(host, slots.data(), T, k.data(), v.data(), src);
      write_kv_cuda(dev, dslots.data_as<int32_t>(), T, dsk.data(), dsv.data(), src, nullptr,
                    slots.data());
      std::vector<uint8_t> got_k(k_pool.size()), got_v(v_pool.size());
      copy_bytes(got_k.data(), Device::cpu, dk.data(), Device::cuda, got_k.size());
      copy_bytes(got_v.data(), Device::cpu, dv.data(), Device::cuda, got_v.size());
      EXPECT_EQ(got_k, k_pool) << "pool " << dtype_name(pool) << " src " << dtype_name(src);
      EXPECT_EQ(got_v, v_pool) << "pool " << dtype_name(pool) << " src " << dtype_name(src);
    }
  }
}

TEST(CudaWriteKv, BadSlotThrowsAndWritesNothing) {
  PA_SKIP_WITHOUT_GPU();
  const int32_t pages = 4, Hk = 1, P = 16, D = 64;
  std::vector<uint8_t> pool(size_t(pages) * Hk * P * D * 2, 0x5a);
  Tensor dk = Problem::to_device(pool.data(), pool.size()),
         dv = Problem::to_device(pool.data(), pool.size());
  PagedKVView dev{dk.data(), dv.data(), DType::bf16, pages, Hk, P, D, nullptr, nullptr};
  std::vector<int32_t> slots = {3, pages * P};  // the second is one past the pool
  std::vector<uint16_t> kv(size_t(2) * D, 0x3f80);
  Tensor ds = Problem::to_device(slots.data(), 8),
         dsrc = Problem::to_device(kv.data(), kv.size() * 2);
  try {
    write_kv_cuda(dev, ds.data_as<int32_t>(), 2, dsrc.data(), dsrc.data(), DType::bf16, nullptr,
                  slots.data());
    ADD_FAILURE() << "no error for a slot outside the pool";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("write_kv: slots[1]"), std::string::npos) << e.what();
  }
  // Without host slots the kernel skips the bad one and writes the good one.
  std::vector<uint8_t> got(pool.size());
  copy_bytes(got.data(), Device::cpu, dk.data(), Device::cuda, got.size());
  EXPECT_EQ(got, pool);
  write_kv_cuda(dev, ds.data_as<int32_t>(), 2, dsrc.data(), dsrc.data(), DType::bf16);
  copy_bytes(got.data(), Device::cpu, dk.data(), Device::cuda, got.size());
  for (size_t i = 0; i < got.size(); i += 2) {
    const bool written = i / 2 >= 3 * size_t(D) && i / 2 < 4 * size_t(D);
    EXPECT_EQ(got[i] == 0x80 && got[i + 1] == 0x3f, written) << i;
    if (HasFailure()) break;
  }
}
