// AsyncEngine: the thread-safe front of an Engine for the server (submit and cancel from any
// thread, outputs through per-request callbacks on the loop thread).
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pagedattn/engine.h"

namespace pagedattn {

// The thread-safe front: a background loop thread stepping an Engine.
class AsyncEngine {
 public:
  explicit AsyncEngine(std::unique_ptr<Engine> engine);
  ~AsyncEngine();  // stop()
  // Validates (throws Error, nothing queued) and queues the request; on_output
  // is called on the loop thread with each output, the last one with finished =
  // true (also on cancel or stop).
  RequestId submit(Request req, OutputCallback on_output);
  void cancel(RequestId id);
  // Cancels everything still running, delivers the final outputs and joins the
  // loop.
  void stop();
  EngineMetrics metrics() const;
  // Fixed configuration (safe from any thread).
  const Engine& engine() const { return *engine_; }

 private:
  void loop();

  std::unique_ptr<Engine> engine_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<Request, RequestId>> adds_;
  std::vector<RequestId> cancels_;
  std::unordered_map<RequestId, OutputCallback> callbacks_;      // touched on the loop thread only
  std::unordered_map<RequestId, OutputCallback> new_callbacks_;  // guarded by mu_
  EngineMetrics snapshot_;                                       // guarded by mu_
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace pagedattn
