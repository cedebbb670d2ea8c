// CUDA graphs of decode steps. A step launches about 10 kernels per layer; for a small model the
// host's launch calls, not the GPU, set the step time. StepGraphs captures a step's launches once
// into a graph and replays it for later steps whose launches are the same, given as a signature:
// the scratch pointers, the token and row counts and the attention plan's launch_signature (the
// plan's metadata values change every step but are uploaded before the replay, into the same
// workspace). A signature is captured when it repeats (two steps in a row), so batches that change
// every step (continuous batching with arrivals) do not pay a capture per step. Compiled as C++17
// (nvcc may include it), so no C++20 headers here.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace pagedattn::cuda {

class StepGraphs {
 public:
  explicit StepGraphs(size_t capacity = 8) : capacity_(capacity) {}
  ~StepGraphs() { clear(); }
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // Runs launch()'s kernels on `stream` (which must not be the legacy default stream): replays the
  // graph of `signature` when there is one; captures one when the previous run had the same
  // signature (evicting the least recently used beyond capacity), then replays it; otherwise calls
  // launch() directly. launch() must only enqueue work on `stream` (no allocation, no
  // synchronisation). If the capture fails (an unsupported call), launch() runs directly, the
  // error is cleared and that signature is not captured again. Throws Error when a replay fails.
  void run(const std::string& signature, cudaStream_t stream, const std::function<void()>& launch);
  void clear();

  size_t captures() const { return captures_; }
  size_t replays() const { return replays_; }

 private:
  struct Entry {
    std::string signature;
    cudaGraphExec_t exec = nullptr;
    uint64_t last_used = 0;
  };
  size_t capacity_;
  std::vector<Entry> entries_;
  std::string previous_;
  std::set<std::string> failed_;  // signatures whose capture failed: run as plain launches
  uint64_t clock_ = 0;
  size_t captures_ = 0, replays_ = 0;
};

}  // namespace pagedattn::cuda
