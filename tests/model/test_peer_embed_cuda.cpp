// The start of a tensor-parallel decode step on one host (model/cuda/peer_embed.h): every token's
// embedding row read from the rank that holds it, through the slices each rank mapped
// (PeerAllReduce::map_peer_buffers), and the first norm; two ranks as threads of one process on
// GPUs 0 and 1, against the host in double precision, both ranks with the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>

#include "gpu_skip.h"
#include "pagedattn/dtype.h"
#include "pagedattn/error.h"
#ifdef PAGEDATTN_HAVE_CUDA
#include <cuda_runtime.h>

#include "model/cuda/nccl_comm.h"
#include "model/cuda/peer_all_reduce.h"
#include "model/cuda/peer_embed.h"
#include "tp_ranks.h"
#endif

namespace {

#ifdef PAGEDATTN_HAVE_CUDA

using namespace pagedattn;
using pagedattn::testing::on_two_ranks;

template <class T>
T* upload(const std::vector<T>& h) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), std::max<size_t>(1, h.size()) * sizeof(T)),
            cudaSuccess);
  if (!h.empty()) {
    EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  return d;
}
template <class T>
std::vector<T> download(const T* d, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

TEST(PeerEmbedCuda, RowsFromTheirRanksAndTheNormMatchTheHost) {
  PA_SKIP_WITHOUT_GPU();
  {
    std::string why;
    if (!cuda::nccl_available(&why)) GTEST_SKIP() << why;
  }
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  const cuda::NcclId id = cuda::nccl_unique_id();
  std::unique_ptr<cuda::NcclComm> comm[2];
  std::unique_ptr<cuda::PeerAllReduce> peer[2];
  on_two_ranks(comm, [&](int r) {
    comm[r] = std::make_unique<cuda::NcclComm>(id, 2, r);
    peer[r] = cuda::PeerAllReduce::create(*comm[r], 64, 4096);
  });
  ASSERT_TRUE(peer[0] && peer[1]) << "no peer access between GPUs 0 and 1";
  std::mt19937 g(3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int32_t hidden : {576, 4096, 8192}) {
    SCOPED_TRACE(hidden);
    constexpr int32_t kVocab = 301, kStride = 151;  // rank 1 holds 150 rows
    constexpr float kEps = 1e-5f;
    // The whole table on the host; each rank's device slice.
    std::vector<uint16_t> table(size_t(kVocab) * size_t(hidden));
    for (uint16_t& v : table) v = f32_to_bf16(u(g));
    std::vector<float> w(static_cast<size_t>(hidden));
    for (float& v : w) v = 0.5f + 0.5f * std::abs(u(g));
    // Tokens of both slices, their edges, a stand-in for a chained id (the pass before's row 1:
    // 299) and one outside the vocabulary (a row of zeros).
    const std::vector<int32_t> tokens = {0, 150, 151, 300, 7, 200, -2, kVocab, 151, 42};
    const std::vector<int32_t> chained = {5, 299};
    const int32_t T = int32_t(tokens.size());
    std::vector<float> x_got[2];
    std::vector<uint16_t> h_got[2];
    std::string why[2];
    on_two_ranks(comm, [&](int r) {
      const int32_t rows = r == 0 ? kStride : kVocab - kStride;
      std::vector<uint16_t> mine(table.begin() + int64_t(r) * kStride * hidden,
                                 table.begin() + (int64_t(r) * kStride + rows) * hidden);
      uint16_t* slice = upload(mine);
      const std::vector<const void*> slices =
          peer[r]->map_peer_buffers(*comm[r], slice, true, &why[r]);
      ASSERT_EQ(slices.size(), 2u) << why[r];
      EXPECT_EQ(slices[size_t(r)], slice);
      cuda::PeerEmbedTable t;
      for (int q = 0; q < 2; ++q) t.slice[q] = static_cast<const uint16_t*>(slices[size_t(q)]);
      t.world = 2;
      t.stride = kStride;
      t.vocab = kVocab;
      int32_t* d_tokens = upload(tokens);
      int32_t* d_chained = upload(chained);
      float* d_w = upload(w);
      float* x = nullptr;
      uint16_t* h = nullptr;
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&x), size_t(T) * hidden * 4), cudaSuccess);
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&h), size_t(T) * hidden * 2), cudaSuccess);
      cuda::embed_norm_peers(t, d_tokens, d_chained, T, hidden, d_w, kEps, x, h, {}, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      x_got[r] = download(x, size_t(T) * hidden);
      h_got[r] = download(h, size_t(T) * hidden);
      // Both ranks are done reading each other's slice before either frees its own.
      comm[r]->all_gather_host("", 1);
      for (void* p : {static_cast<void*>(slice), static_cast<void*>(d_tokens),
                      static_cast<void*>(d_chained), static_cast<void*>(d_w),
                      static_cast<void*>(x), static_cast<void*>(h)})
        cudaFree(p);
    });
    EXPECT_EQ(x_got[0], x_got[1]);
    EXPECT_EQ(h_got[0], h_got[1]);
    for (int32_t t = 0; t < T; ++t) {
      int32_t token = tokens[size_t(t)];
      if (token < 0) token = chained[size_t(-token - 1)];
      const bool known = token < kVocab;
      double ss = 0;
      for (int32_t i = 0; i < hidden; ++i) {
        const double v = known ? bf16_to_f32(table[size_t(token) * hidden + size_t(i)]) : 0.0;
        ss += v * v;
        ASSERT_EQ(x_got[0][size_t(t) * hidden + size_t(i)], float(v))
            << "token " << token << " value " << i;
      }
      const double inv = 1.0 / std::sqrt(ss / hidden + kEps);
      for (int32_t i = 0; i < hidden; ++i) {
        const double v = known ? bf16_to_f32(table[size_t(token) * hidden + size_t(i)]) : 0.0;
        const double want = v * inv * w[size_t(i)];
        const double got = bf16_to_f32(h_got[0][size_t(t) * hidden + size_t(i)]);
        EXPECT_NEAR(got, want, std::abs(want) * (1.0 / 128) + 1e-30)
            << "token " << token << " value " << i;
      }
    }
  }
  // A rank that does not take part: no rank gets a mapping, and each says why.
  std::vector<const void*> got[2];
  std::string why[2];
  on_two_ranks(comm, [&](int r) {
    void* buf = nullptr;
    ASSERT_EQ(cudaMalloc(&buf, 256), cudaSuccess);
    got[r] = peer[r]->map_peer_buffers(*comm[r], buf, r == 0, &why[r]);
    cudaFree(buf);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(got[r].empty()) << "rank " << r;
    EXPECT_NE(why[r].find("rank 1"), std::string::npos) << why[r];
  }
}

#else

TEST(PeerEmbedCuda, RowsFromTheirRanksAndTheNormMatchTheHost) {
  GTEST_SKIP() << "built without CUDA";
}

#endif

}  // namespace
