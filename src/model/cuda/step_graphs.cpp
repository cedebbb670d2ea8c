// StepGraphs (step_graphs.h): capture on the second sight of a signature, replay afterwards.
#include "step_graphs.h"

#include <algorithm>

#include "pagedattn/error.h"

namespace pagedattn::cuda {

void StepGraphs::clear() {
  for (Entry& e : entries_) cudaGraphExecDestroy(e.exec);
  entries_.clear();
  previous_.clear();
  failed_.clear();
}

void StepGraphs::run(const std::string& signature, cudaStream_t stream,
                     const std::function<void()>& launch) {
  ++clock_;
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const Entry& e) { return e.signature == signature; });
  if (it == entries_.end()) {
    const bool repeated = signature == previous_;
    previous_ = signature;
    if (!repeated || failed_.count(signature)) return launch();
    // Capture. NOTE: thread-local mode: other threads' CUDA calls (a server's other work) are not
    // affected; this thread's launch() may only enqueue on `stream`.
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    bool ok = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    if (ok) {
      try {
        launch();
      } catch (...) {
        ok = false;  // a launch refused under capture; the capture is ended below
      }
      ok = cudaStreamEndCapture(stream, &graph) == cudaSuccess && ok;
    }
    if (ok) ok = cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    if (graph) cudaGraphDestroy(graph);
    if (!ok) {
      // NOTE: nothing captured has run; the step runs as plain launches.
      if (exec) cudaGraphExecDestroy(exec);
      (void)cudaGetLastError();
      failed_.insert(signature);  // not tried again
      return launch();
    }
    if (entries_.size() >= capacity_) {
      auto lru = std::min_element(
          entries_.begin(), entries_.end(),
          [](const Entry& a, const Entry& b) { return a.last_used < b.last_used; });
      cudaGraphExecDestroy(lru->exec);
      entries_.erase(lru);
    }
    entries_.push_back(Entry{signature, exec, clock_});
    it = entries_.end() - 1;
    ++captures_;
  } else {
    ++replays_;
  }
  previous_ = signature;
  it->last_used = clock_;
  const cudaError_t e = cudaGraphLaunch(it->exec, stream);
  if (e != cudaSuccess) fail("LlamaModelCuda: CUDA graph launch: ", cudaGetErrorString(e));
}

}  // namespace pagedattn::cuda
