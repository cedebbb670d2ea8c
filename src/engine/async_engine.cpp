// AsyncEngine: the engine's loop on a background thread, fed through a locked
// queue.
#include "pagedattn/async_engine.h"

#include <cstdio>

#include "pagedattn/error.h"

namespace pagedattn {

AsyncEngine::AsyncEngine(std::unique_ptr<Engine> engine) : engine_(std::move(engine)) {
  PA_CHECK(engine_ != nullptr, "AsyncEngine: engine is null");
  snapshot_ = engine_->metrics();
  thread_ = std::thread([this] { loop(); });
}

AsyncEngine::~AsyncEngine() { stop(); }

RequestId AsyncEngine::submit(Request req, OutputCallback on_output) {
  engine_->validate(req);  // the engine's door, on the caller's thread: nothing queued on error
  const RequestId id = engine_->new_request_id();
  {
    std::lock_guard<std::mutex> lk(mu_);
    PA_CHECK(!stopping_, "submit: the engine is shutting down");
    adds_.emplace_back(std::move(req), id);
    new_callbacks_[id] = std::move(on_output);
  }
  cv_.notify_one();
  return id;
}

void AsyncEngine::cancel(RequestId id) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    cancels_.push_back(id);
  }
  cv_.notify_one();
}

void AsyncEngine::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

EngineMetrics AsyncEngine::metrics() const {
  std::lock_guard<std::mutex> lk(mu_);
  return snapshot_;
}

void AsyncEngine::loop() {
  bool cancelled_all = false;
  for (;;) {
    std::deque<std::pair<Request, RequestId>> adds;
    std::vector<RequestId> cancels;
    bool stop = false;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] {
        return stopping_ || !adds_.empty() || !cancels_.empty() || engine_->has_work();
      });
      adds.swap(adds_);
      cancels.swap(cancels_);
      for (auto &[id, cb] : new_callbacks_) callbacks_[id] = std::move(cb);
      new_callbacks_.clear();
      stop = stopping_;
    }
    std::vector<RequestOutput> outs;
    for (auto &[req, id] : adds) {
      try {
        engine_->enqueue(std::move(req), id);  // validated in submit()
      } catch (const std::exception &e) {
        RequestOutput o;
        o.id = id;
        o.finished = true;
        o.error = e.what();
        outs.push_back(std::move(o));
      }
    }
    for (RequestId id : cancels) engine_->cancel(id);
    if (stop && !cancelled_all) {
      for (auto &[id, cb] : callbacks_) engine_->cancel(id, "the engine is shutting down");
      cancelled_all = true;
    }
    if (engine_->has_work()) {
      try {
        std::vector<RequestOutput> step_outs = engine_->step();
        for (auto &o : step_outs) outs.push_back(std::move(o));
      } catch (const std::exception &e) {
        // NOTE: a failed step leaves the engine's state unknown; fail every
        // request rather than hang its client.
        std::fprintf(stderr, "pagedattn: engine step failed: %s\n", e.what());
        for (auto &[id, cb] : callbacks_)
          engine_->cancel(id, std::string("engine step failed: ") + e.what());
      }
    }
    for (RequestOutput &o : outs) {
      auto it = callbacks_.find(o.id);
      if (it == callbacks_.end()) continue;
      try {
        if (it->second) it->second(o);
      } catch (const std::exception &e) {
        std::fprintf(stderr, "pagedattn: output callback of request %lld threw: %s\n",
                     (long long)o.id, e.what());
        if (!o.finished) engine_->cancel(o.id);
      }
      if (o.finished) callbacks_.erase(it);
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      snapshot_ = engine_->metrics();
    }
    if (stop && callbacks_.empty() && !engine_->has_work()) break;
  }
}

}  // namespace pagedattn
