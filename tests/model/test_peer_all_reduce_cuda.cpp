// The peer-memory all-reduce of tensor-parallel decode steps (model/cuda/peer_all_reduce.h), two
// ranks as threads of one process on GPUs 0 and 1: against a double-precision sum on the host,
// for row counts below and above its grid, with and without the residual and the norm, over many
// calls in a row (its flags count calls), and both ranks with the same bits.
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
#include "tp_ranks.h"
#endif

namespace {

#ifdef PAGEDATTN_HAVE_CUDA

using namespace pagedattn;
using pagedattn::testing::on_two_ranks;

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
  PA_SKIP_WITHOUT_GPU();
  {
    std::string why;
    if (!cuda::nccl_available(&why)) GTEST_SKIP() << why;
  }
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
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

#else

TEST(PeerAllReduceCuda, KernelUsesNoLocalMemory) { GTEST_SKIP() << "built without CUDA"; }
TEST(PeerAllReduceCuda, SumsResidualAndNormMatchTheHost) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
