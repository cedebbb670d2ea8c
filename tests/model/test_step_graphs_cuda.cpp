// StepGraphs (src/model/cuda/step_graphs.h): a signature is captured the second time in a row it
// comes, replayed after that, and a launch sequence that cannot be captured runs as plain launches
// every time, with the right results.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "gpu_skip.h"
#include "pagedattn/error.h"

#if PAGEDATTN_HAVE_CUDA
#include <cuda_runtime.h>

#include "model/cuda/step_graphs.h"

using namespace pagedattn;

namespace {

struct Buffer {
  uint8_t* p = nullptr;
  Buffer() { EXPECT_EQ(cudaMalloc(&p, 256), cudaSuccess); }
  ~Buffer() { cudaFree(p); }
  uint8_t first() const {
    uint8_t v = 0;
    EXPECT_EQ(cudaMemcpy(&v, p, 1, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

}  // namespace

TEST(StepGraphs, CapturesOnRepeatAndReplays) {
  PA_SKIP_WITHOUT_GPU();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  Buffer buf;
  cuda::StepGraphs graphs(2);
  int value = 0;  // read when the launch is recorded: a replay repeats the captured value
  auto launch = [&] { ASSERT_EQ(cudaMemsetAsync(buf.p, value, 256, s), cudaSuccess); };
  value = 1;
  graphs.run("a", s, launch);  // first sight: plain launch
  EXPECT_EQ(buf.first(), 1);
  EXPECT_EQ(graphs.captures(), 0u);
  value = 2;
  graphs.run("a", s, launch);  // second in a row: captured (with 2), then launched
  EXPECT_EQ(buf.first(), 2);
  EXPECT_EQ(graphs.captures(), 1u);
  value = 3;
  graphs.run("a", s, launch);  // replayed: the captured 2, not 3
  EXPECT_EQ(buf.first(), 2);
  EXPECT_EQ(graphs.replays(), 1u);
  graphs.run("b", s, launch);  // another signature: plain launch with 3
  EXPECT_EQ(buf.first(), 3);
  EXPECT_EQ(graphs.captures(), 1u);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST(StepGraphs, UncapturableLaunchesRunPlain) {
  PA_SKIP_WITHOUT_GPU();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  Buffer buf;
  cuda::StepGraphs graphs;
  int value = 0, calls = 0;
  // A stream synchronisation is not allowed while the stream is captured: the launch throws there.
  auto launch = [&] {
    ++calls;
    PA_CHECK(cudaMemsetAsync(buf.p, value, 256, s) == cudaSuccess, "memset");
    const cudaError_t e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) fail("synchronise: ", cudaGetErrorString(e));
  };
  for (int i = 1; i <= 4; ++i) {
    value = i;
    graphs.run("x", s, launch);
    EXPECT_EQ(buf.first(), i) << "step " << i;
  }
  EXPECT_EQ(graphs.captures(), 0u);
  EXPECT_EQ(graphs.replays(), 0u);
  // 4 plain runs, plus the one attempt under capture (step 2) that threw and was not tried again.
  EXPECT_EQ(calls, 5);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

#endif  // PAGEDATTN_HAVE_CUDA
