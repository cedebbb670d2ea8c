// Peer memory between tensor-parallel ranks, two ranks as threads of one process on GPUs 0 and 1.
// The all-reduce of decode steps (model/cuda/peer_all_reduce.h): against a double-precision sum
// on the host, for row counts below and above its grid, with and without the residual and the
// norm, over many calls in a row (its flags count calls), and both ranks with the same bits. The
// start of a step (model/cuda/peer_embed.h): every token's embedding row read from the rank that
// holds it, through the slices each rank mapped (PeerAllReduce::map_peer_buffers), and the first
// norm, against the host in double precision.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>

#include "gpu_skip.h"
#include "pagedattn/dtype.h"
#include "pagedattn/error.h"
#ifdef PAGEDATTN_HAVE_CUDA
#include <cuda_runtime.h>

#include "model/cuda/llama_kernels.h"  // ArgmaxPair
#include "model/cuda/nccl_comm.h"
#include "model/cuda/peer_all_reduce.h"
#include "model/cuda/peer_embed.h"
#include "tp_ranks.h"
#endif

namespace {

#ifdef PAGEDATTN_HAVE_CUDA

using namespace pagedattn;
using pagedattn::testing::on_two_ranks;

// Two ranks need two devices and NCCL (which joins them and carries the mapping's handles).
#define SKIP_WITHOUT_TWO_RANKS()                                              \
  do {                                                                        \
    PA_SKIP_WITHOUT_GPU();                                                    \
    std::string why;                                                          \
    if (!cuda::nccl_available(&why)) GTEST_SKIP() << why;                     \
    if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";      \
  } while (0)

template <class T>
std::vector<T> download(const T* d, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// The kernel keeps nothing on the stack: its arguments' pointer arrays are read with constant
// indices only (a run-time index copies them to every thread's stack, 9% of a batch-32 step).
TEST(PeerAllReduceCuda, KernelUsesNoLocalMemory) {
  PA_SKIP_WITHOUT_GPU();
  if (cuda::PeerAllReduce::kernel_local_bytes(2) < 0)
    GTEST_SKIP() << "the runtime gives no attributes of the kernel on this device (built for "
                    "another architecture?)";
  for (int32_t world = 2; world <= 8; ++world)
    EXPECT_EQ(cuda::PeerAllReduce::kernel_local_bytes(world), 0) << "world " << world;
  EXPECT_EQ(cuda::PeerAllReduce::kernel_local_bytes(9), -1);
}

TEST(PeerAllReduceCuda, SumsResidualAndNormMatchTheHost) {
  SKIP_WITHOUT_TWO_RANKS();
  const cuda::NcclId id = cuda::nccl_unique_id();
  std::unique_ptr<cuda::NcclComm> comm[2];
  std::unique_ptr<cuda::PeerAllReduce> peer[2];
  constexpr int32_t kMaxRows = 300;
  for (int32_t hidden : {576, 4096, 8192}) {
    SCOPED_TRACE(hidden);
    on_two_ranks(comm, [&](int r) {
      if (!comm[r]) comm[r] = std::make_unique<cuda::NcclComm>(id, 2, r);
      std::string why;
      peer[r] = cuda::PeerAllReduce::create(*comm[r], kMaxRows, hidden, &why);
      if (!peer[r]) throw std::runtime_error("no peer all-reduce: " + why);
    });
    std::mt19937 g{uint32_t(hidden)};
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> w(static_cast<size_t>(hidden));
    for (float& v : w) v = 0.5f + 0.1f * nd(g);
    // Calls of many sizes in a row, as a step makes them (the flags' counts carry over).
    int calls = 0;
    for (int32_t rows : {1, 7, 128, 129, 300, 32, 1, 255}) {
      for (int variant = 0; variant < 3; ++variant, ++calls) {
        const bool add_x = variant != 1, norm = variant != 2;
        const size_t n = size_t(rows) * size_t(hidden);
        std::vector<float> part[2], x0(n);
        for (auto& p : part) {
          p.resize(n);
          for (float& v : p) v = nd(g);
        }
        for (float& v : x0) v = nd(g);
        std::vector<float> got_x[2];
        std::vector<uint16_t> got_h[2];
        on_two_ranks(comm, [&](int r) {
          float *x = nullptr, *wd = nullptr;
          uint16_t* h = nullptr;
          ASSERT_EQ(cudaMalloc(&x, n * 4), cudaSuccess);
          ASSERT_EQ(cudaMalloc(&wd, size_t(hidden) * 4), cudaSuccess);
          ASSERT_EQ(cudaMalloc(&h, n * 2), cudaSuccess);
          cudaMemcpy(x, x0.data(), n * 4, cudaMemcpyHostToDevice);
          cudaMemcpy(wd, w.data(), size_t(hidden) * 4, cudaMemcpyHostToDevice);
          cudaMemset(h, 0xff, n * 2);  // poisoned: every value must be written
          const int32_t slot = calls % cuda::PeerAllReduce::kSlots;
          cudaMemcpy(peer[r]->input(slot), part[r].data(), n * 4, cudaMemcpyHostToDevice);
          peer[r]->reduce(slot, x, add_x, rows, norm ? wd : nullptr, 1e-5f, h, nullptr);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          got_x[r] = download(x, n);
          got_h[r] = download(h, n);
          cudaFree(x);
          cudaFree(wd);
          cudaFree(h);
        });
        if (::testing::Test::HasFatalFailure()) return;
        SCOPED_TRACE(::testing::Message() << "rows " << rows << " add_x " << add_x << " norm "
                                          << norm);
        EXPECT_EQ(got_x[0], got_x[1]) << "the ranks' residual streams differ";
        EXPECT_EQ(got_h[0], got_h[1]) << "the ranks' normalised rows differ";
        int bad = 0;
        for (int32_t row = 0; row < rows; ++row) {
          double ss = 0;
          std::vector<double> want(static_cast<size_t>(hidden));
          for (int32_t i = 0; i < hidden; ++i) {
            const size_t k = size_t(row) * size_t(hidden) + size_t(i);
            const double sum = (add_x ? double(x0[k]) : 0.0) + double(part[0][k]) + part[1][k];
            want[size_t(i)] = sum;
            ss += sum * sum;
            if (!(std::abs(got_x[0][k] - sum) <= 1e-5 * (1 + std::abs(sum)))) ++bad;
          }
          const double inv = 1.0 / std::sqrt(ss / hidden + 1e-5);
          for (int32_t i = 0; i < hidden && norm; ++i) {
            const size_t k = size_t(row) * size_t(hidden) + size_t(i);
            const double hw = want[size_t(i)] * inv * w[size_t(i)];
            // bf16 keeps 8 bits: half a step of rounding, plus the f32 sums' error.
            if (!(std::abs(double(bf16_to_f32(got_h[0][k])) - hw) <= 4e-3 * std::abs(hw) + 1e-4))
              ++bad;  // also a value never written (the poison is NaN)
          }
        }
        EXPECT_EQ(bad, 0);
      }
    }
    EXPECT_EQ(calls, 24);
    // Refused by name, nothing enqueued: more rows than a slot holds; the slot of the previous
    // call (its peers may still be reading it).
    on_two_ranks(comm, [&](int r) {
      const int32_t next = calls % cuda::PeerAllReduce::kSlots;
      try {
        peer[r]->reduce(next, nullptr, true, kMaxRows + 1, nullptr, 1e-5f, nullptr, nullptr);
        ADD_FAILURE() << "accepted " << kMaxRows + 1 << " rows";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("rows"), std::string::npos) << e.what();
      }
      const int32_t last = (calls - 1) % cuda::PeerAllReduce::kSlots;
      try {
        peer[r]->reduce(last, nullptr, true, 1, nullptr, 1e-5f, nullptr, nullptr);
        ADD_FAILURE() << "accepted slot " << last << " twice in a row";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("twice"), std::string::npos) << e.what();
      }
    });
    on_two_ranks(comm, [&](int r) { peer[r].reset(); });
  }
}

// A greedy step's ids from both ranks' pairs (PeerAllReduce::argmax_ids) against the host's fold
// of the same pairs by argmax_combine's rules: rank 0's (NaN, 0) takes the row, else the largest
// value and its lowest id; ties across the ranks, slices of NaNs only (-inf, INT32_MAX), calls of
// many sizes back to back between all-reduces, as steps make them; refused: more rows than the
// buffer holds.
TEST(PeerAllReduceCuda, ArgmaxIdsFoldEveryRanksPairs) {
  SKIP_WITHOUT_TWO_RANKS();
  const cuda::NcclId id = cuda::nccl_unique_id();
  std::unique_ptr<cuda::NcclComm> comm[2];
  std::unique_ptr<cuda::PeerAllReduce> peer[2];
  constexpr int32_t kMaxRows = 300, kHidden = 64;
  on_two_ranks(comm, [&](int r) {
    comm[r] = std::make_unique<cuda::NcclComm>(id, 2, r);
    std::string why;
    peer[r] = cuda::PeerAllReduce::create(*comm[r], kMaxRows, kHidden, &why);
    if (!peer[r]) throw std::runtime_error("no peer all-reduce: " + why);
  });
  std::mt19937 g(41);
  int calls = 0;
  for (int32_t rows : {1, 32, 300, 7, 32, 256, 1}) {
    SCOPED_TRACE(rows);
    std::vector<cuda::ArgmaxPair> pairs[2];
    const int32_t vocab0[2] = {0, 1000};
    for (int r = 0; r < 2; ++r) {
      pairs[r].resize(size_t(rows));
      for (auto& p : pairs[r]) {
        const int kind = int(g() % 8);
        p.value = kind == 0 ? -INFINITY : float(int(g() % 5)) * 0.5f;  // ties are frequent
        p.index = kind == 0 ? INT32_MAX : vocab0[r] + int32_t(g() % 1000);
        if (r == 0 && kind == 1) p = {NAN, 0};  // a NaN logit 0
      }
    }
    std::vector<int32_t> got[2];
    on_two_ranks(comm, [&](int r) {
      int32_t* ids = nullptr;
      float* x = nullptr;
      ASSERT_EQ(cudaMalloc(&ids, size_t(rows) * 4), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&x, size_t(rows) * kHidden * 4), cudaSuccess);
      cudaMemset(ids, 0xff, size_t(rows) * 4);
      cudaMemset(x, 0, size_t(rows) * kHidden * 4);
      // An all-reduce between two calls, as a step's layers put one there.
      const int32_t slot = calls % cuda::PeerAllReduce::kSlots;
      peer[r]->reduce(slot, x, true, rows, nullptr, 1e-5f, nullptr, nullptr);
      cudaMemcpy(peer[r]->pairs(), pairs[r].data(), size_t(rows) * sizeof(cuda::ArgmaxPair),
                 cudaMemcpyHostToDevice);
      peer[r]->argmax_ids(rows, ids, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      got[r] = download(ids, size_t(rows));
      cudaFree(ids);
      cudaFree(x);
    });
    ++calls;
    if (::testing::Test::HasFatalFailure()) return;
    std::vector<int32_t> want(static_cast<size_t>(rows));
    for (int32_t i = 0; i < rows; ++i) {
      if (std::isnan(pairs[0][size_t(i)].value)) {
        want[size_t(i)] = 0;
        continue;
      }
      float best = -INFINITY;
      int32_t idx = INT32_MAX;
      for (int r = 0; r < 2; ++r) {
        const cuda::ArgmaxPair p = pairs[r][size_t(i)];
        if (p.value > best || (p.value == best && p.index < idx)) best = p.value, idx = p.index;
      }
      want[size_t(i)] = idx;
    }
    EXPECT_EQ(got[0], want);
    EXPECT_EQ(got[1], want);
  }
  on_two_ranks(comm, [&](int r) {
    try {
      peer[r]->argmax_ids(kMaxRows + 1, nullptr, nullptr);
      ADD_FAILURE() << "accepted " << kMaxRows + 1 << " rows";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rows"), std::string::npos) << e.what();
    }
    peer[r].reset();
  });
}

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

TEST(PeerEmbedCuda, RowsFromTheirRanksAndTheNormMatchTheHost) {
  SKIP_WITHOUT_TWO_RANKS();
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

TEST(PeerAllReduceCuda, KernelUsesNoLocalMemory) { GTEST_SKIP() << "built without CUDA"; }
TEST(PeerAllReduceCuda, SumsResidualAndNormMatchTheHost) { GTEST_SKIP() << "built without CUDA"; }
TEST(PeerAllReduceCuda, ArgmaxIdsFoldEveryRanksPairs) { GTEST_SKIP() << "built without CUDA"; }
TEST(PeerEmbedCuda, RowsFromTheirRanksAndTheNormMatchTheHost) {
  GTEST_SKIP() << "built without CUDA";
}

#endif

}  // namespace
