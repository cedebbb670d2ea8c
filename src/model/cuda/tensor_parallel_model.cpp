// Tensor parallelism across processes: rank 0's runner (TensorParallelModel, which the engine
// drives) and the other ranks' loop (run_tensor_parallel_worker). tensor_parallel.h has the
// picture; tp_link.h the control link; nccl_comm.h the collectives.
#include <cuda_runtime.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <type_traits>

#include "kv_calibration.h"
#include "nccl_comm.h"
#include "pagedattn/error.h"
#include "pagedattn/llama_cuda.h"
#include "pagedattn/sampling.h"
#include "pagedattn/synthetic_model.h"
#include "pagedattn/tensor_parallel.h"
#include "tp_link.h"
#include "tp_step.h"

extern char** environ;

namespace pagedattn {

namespace {

constexpr const char* kOp = "tensor parallel";
constexpr double kExitGraceSeconds = 5;  // a failed group's rank 0 exits this long after

void set_device(int32_t rank, int32_t wanted) {
  int count = 0;
  PA_CHECK(cudaGetDeviceCount(&count) == cudaSuccess && count > 0, kOp, ": rank ", rank,
           " sees no CUDA device");
  const int dev = wanted >= 0 ? wanted : rank % count;
  PA_CHECK(dev < count, kOp, ": rank ", rank, " was given CUDA device ", dev, " of ", count);
  PA_CHECK(cudaSetDevice(dev) == cudaSuccess, kOp, ": cudaSetDevice(", dev, ") failed");
}

// Rank `rank`'s shard of `model`, joined to comm.
std::unique_ptr<LlamaModelCuda> load_shard(const std::string& model, TpShard shard,
                                           cuda::NcclComm* comm) {
  if (is_synthetic_model(model)) {
    return std::make_unique<LlamaModelCuda>(synthetic_model_config(model), kSyntheticSeed, shard,
                                            comm);
  }
  ModelFile file = load_model_file(model, weight_format_for(Device::cuda));
  return std::make_unique<LlamaModelCuda>(file, shard, comm);
}

cuda::NcclId to_id(const std::vector<char>& v) {
  cuda::NcclId id{};
  PA_CHECK(v.size() == id.size(), kOp, ": the NCCL id has ", v.size(), " bytes");
  std::copy(v.begin(), v.end(), id.begin());
  return id;
}

class Leader final : public TensorParallelModel {
 public:
  Leader(const std::string& model, const TensorParallelOptions& o) : world_(o.world_size) {
    PA_CHECK(o.world_size >= 1 && o.rank == 0, kOp, ": rank 0 builds the group (got rank ",
             o.rank, " of ", o.world_size, ")");
    std::string why;
    PA_CHECK(cuda::nccl_available(&why), kOp, ": ", why);
    if (is_synthetic_model(model)) tp_slices(synthetic_model_config(model), TpShard{0, world_});
    if (!o.worker_argv.empty()) {  // every rank on this host: one GPU each
      int count = 0;
      if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
      PA_CHECK(count >= world_, kOp, ": ", world_, " ranks on this host need ", world_,
               " CUDA devices, ", count, " visible");
    }
    const std::string addr = o.init_addr.empty() ? "127.0.0.1:0" : o.init_addr;
    link_ = std::make_unique<tp::LeaderLink>(addr);
    const std::string worker_addr =
        (o.init_addr.empty() ? std::string("127.0.0.1") : tp::parse_addr(o.init_addr).first) +
        ":" + std::to_string(link_->port());
    try {
      if (!o.worker_argv.empty()) {
        for (int32_t r = 1; r < world_; ++r) spawn(o.worker_argv, r, worker_addr);
      }
      link_->accept_ranks(world_, o.connect_timeout_s);
      link_->watch([this](const std::string& why) { fail_group(why); });
      const cuda::NcclId id = cuda::nccl_unique_id();
      link_->send_all(tp::FrameType::init,
                      tp::encode_init(tp::InitMessage{model, world_, {id.begin(), id.end()}}));
      set_device(0, o.cuda_device);
      comm_ = std::make_unique<cuda::NcclComm>(id, world_, 0);
      shard_ = load_shard(model, TpShard{0, world_}, comm_.get());
    } catch (...) {
      link_->close();  // the ranks that joined are told to stop
      reap_children(2.0);
      throw;
    }
  }

  ~Leader() override {
    link_->close();  // shutdown to every rank
    if (!health().empty()) {
      // NOTE: a collective of a failed group may never finish; freeing device memory would wait
      // for it. The process's CUDA context goes with the process.
      (void)shard_.release();
      (void)comm_.release();
    }
    shard_.reset();
    comm_.reset();
    reap_children(5.0);
  }

  const ModelConfig& config() const override { return shard_->config(); }
  Device device() const override { return Device::cuda; }
  int32_t world_size() const override { return world_; }
  LlamaModelCuda& shard() override { return *shard_; }

  void adapt_cache_config(KvCacheConfig& kc) const override {
    kc.num_kv_heads = shard_->num_local_kv_heads();
    kc.record_page_copies = true;
  }

  std::string health() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }

  Tensor forward(const ForwardBatch& batch, KvCache& cache) override {
    send_step(batch, cache);
    return guarded([&] {
      const float* dl = run_step(batch, cache);
      return shard_->download_logits(dl, int64_t(batch.logit_rows.size()));
    });
  }

  std::vector<int32_t> forward_greedy(const ForwardBatch& batch, KvCache& cache) override {
    send_step(batch, cache, /*greedy=*/true);
    return guarded([&] {
      const float* dl = run_step(batch, cache, /*greedy=*/true);
      return shard_->download_greedy(dl, int32_t(batch.logit_rows.size()));
    });
  }

  std::vector<TokenLogprobs> forward_sample(const ForwardBatch& batch, KvCache& cache,
                                            const SamplePlan& plan) override {
    check_sample_plan(plan, int64_t(batch.logit_rows.size()), config().vocab_size, kOp);
    send_step(batch, cache);
    return guarded([&] {
      const float* dl = run_step(batch, cache);
      return shard_->download_sampled(dl, plan);
    });
  }

  // Scheduling ahead: every rank begins the same passes; rank 0's waits poll the group (a
  // collective whose peer has died never finishes). A sampled pass's tokens are picked on rank 0
  // alone, so no pass may name them (chains_after_sampled).
  void begin_greedy(const ForwardBatch& batch, KvCache& cache) override {
    begin_open(batch, cache, true);
  }
  void begin_sample(const ForwardBatch& batch, KvCache& cache) override {
    begin_open(batch, cache, false);
  }
  std::vector<int32_t> finish_greedy() override {
    return guarded([&] {
      wait_oldest();
      return shard_->finish_greedy();
    });
  }
  void pick_sampled(const SamplePlan& plan) override {
    // NOTE: checked before anything runs, so a bad plan fails this call alone, not the group.
    check_sample_plan(plan, int64_t(plan.rows.size()), config().vocab_size, kOp);
    guarded([&] {
      shard_->pick_sampled(plan);
      return 0;
    });
  }
  std::vector<TokenLogprobs> take_sampled() override {
    return guarded([&] {
      wait_oldest();
      return shard_->take_sampled();
    });
  }
  bool overlaps_passes() const override { return shard_->overlaps_passes(); }
  bool chains_after_sampled() const override { return false; }

  double device_busy_seconds() const override { return shard_->device_busy_seconds(); }
  GraphStats cuda_graph_stats() const override { return shard_->cuda_graph_stats(); }

  // The fp8 calibration on every rank at once: rank 0's maxima (its KV heads) come back for its
  // cache; the others keep theirs until kv_scales_calibrated says how to scale them.
  KvAbsMax kv_absmax(const std::vector<int32_t>& tokens) override {
    throw_if_failed();
    // NOTE: checked before anything is sent, as send_step's batches are.
    PA_CHECK(!tokens.empty(), "kv_absmax: tokens are empty");
    for (int32_t t : tokens) {
      PA_CHECK(t >= 0 && t < config().vocab_size, "kv_absmax: token ", t, " is outside the ",
               "vocabulary [0, ", config().vocab_size, ")");
    }
    tp::StepMessage m;
    m.calibrate = tokens;
    send_frame(m);
    return guarded([&] {
      return shard_->kv_absmax(tokens, [this] {
        throw_if_failed();
        std::this_thread::yield();
      });
    });
  }
  void kv_scales_calibrated(float headroom) override {
    throw_if_failed();
    PA_CHECK(std::isfinite(headroom) && headroom >= 1.f, kOp, ": KV headroom ", headroom);
    tp::StepMessage m;
    m.kv_headroom = headroom;
    send_frame(m);
  }

  double collective_seconds(int32_t tokens, int32_t logit_rows, int32_t reps) override {
    throw_if_failed();
    tp::StepMessage m;
    m.time_tokens = tokens;
    m.time_rows = logit_rows;
    m.time_reps = reps;
    link_->send_all(tp::FrameType::step, tp::encode_step(m));
    return guarded([&] { return shard_->time_collectives(tokens, logit_rows, reps); });
  }

 private:
  void spawn(const std::vector<std::string>& argv0, int32_t rank, const std::string& addr) {
    std::vector<std::string> args = argv0;
    for (const std::string& a : {std::string("--rank"), std::to_string(rank),
                                 std::string("--world-size"), std::to_string(world_),
                                 std::string("--init-addr"), addr})
      args.push_back(a);
    std::vector<char*> cargv;
    for (std::string& a : args) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, cargv[0], nullptr, nullptr, cargv.data(), environ);
    PA_CHECK(rc == 0, kOp, ": cannot start rank ", rank, " (", argv0[0], "): ", std::strerror(rc));
    children_.push_back(pid);
  }

  // Waits up to `seconds` for the spawned ranks to exit, then kills what is left.
  void reap_children(double seconds) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    for (pid_t pid : children_) {
      int status = 0;
      while (waitpid(pid, &status, WNOHANG) == 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (waitpid(pid, &status, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
      }
    }
    children_.clear();
  }

  void throw_if_failed() const {
    const std::string f = health();
    PA_CHECK(f.empty(), kOp, ": the group has failed: ", f);
  }

  // Ends the group: the step in progress gives up (run_step polls), every later one throws, and
  // the other ranks are told to stop when this runner goes.
  // NOTE: no ncclCommAbort here: it can block while a collective waits for a dead peer, and this
  // runs on the link's watcher thread, which close() joins.
  void fail_group(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failure_.empty()) return;
      failure_ = why;
    }
    std::fprintf(stderr, "pagedattn: tensor parallel: %s; the group is stopped\n", why.c_str());
    // NOTE: a collective waiting for a dead peer never finishes, and every later CUDA call that
    // synchronizes (freeing the cache's pools, for one) would wait for it: the process cannot
    // outlive the group cleanly. It reports the failure (Model::health, /health of a server, the
    // errors of the requests in flight) for kExitGraceSeconds, then exits with status 1.
    std::thread([why] {
      std::this_thread::sleep_for(std::chrono::duration<double>(kExitGraceSeconds));
      std::fprintf(stderr, "pagedattn: tensor parallel: exiting: %s\n", why.c_str());
      std::fflush(stderr);
      std::_Exit(1);
    }).detach();
  }

  // Runs rank 0's part of a step; any failure (here or, through the watcher, on another rank)
  // ends the group, since the ranks can no longer agree on what ran.
  template <class F>
  std::invoke_result_t<F&> guarded(F&& f) {
    try {
      auto r = f();
      throw_if_failed();  // an aborted collective leaves garbage: never return it
      return r;
    } catch (const Error& e) {
      fail_group(std::string("rank 0 failed: ") + e.what());
      throw;
    }
  }

  // Enqueues rank 0's part of the step and waits for it without blocking in CUDA: a collective
  // whose peer has died may never finish, so the wait watches the group and gives up when the
  // watcher has failed it.
  const float* run_step(const ForwardBatch& batch, KvCache& cache, bool greedy = false) {
    const float* dl = shard_->forward_device(batch, cache, greedy);
    while (!shard_->idle()) {
      throw_if_failed();
      std::this_thread::yield();
    }
    return dl;
  }

  void begin_open(const ForwardBatch& batch, KvCache& cache, bool greedy) {
    send_step(batch, cache, greedy, /*open=*/true);
    guarded([&] {
      if (greedy)
        shard_->begin_greedy(batch, cache);
      else
        shard_->begin_sample(batch, cache);
      return 0;
    });
  }

  // Until the oldest open pass has finished on the device, watching the group.
  void wait_oldest() {
    while (!shard_->oldest_finished()) {
      throw_if_failed();
      std::this_thread::yield();
    }
  }

  void send_step(const ForwardBatch& batch, KvCache& cache, bool greedy = false,
                 bool open = false) {
    throw_if_failed();
    const KvCacheConfig& cc = cache.config();
    // NOTE: checked before anything is sent, so a bad batch fails here alone, not on every rank
    // in the middle of a collective.
    shard_->validate(batch, cache, open ? shard_->chained_rows() : 0);
    tp::StepMessage m;
    m.num_layers = cc.num_layers;
    m.head_dim = cc.head_dim;
    m.page_size = cc.page_size;
    m.num_pages = cc.num_pages;
    m.dtype = cc.dtype;
    m.cuda_graphs = shard_->cuda_graphs();
    m.greedy = greedy;
    m.open = open;
    m.copies = cache.take_page_copies();
    m.batch = batch;
    send_frame(m);
  }

  void send_frame(const tp::StepMessage& m) {
    try {
      link_->send_all(tp::FrameType::step, tp::encode_step(m));
    } catch (const Error& e) {
      fail_group(e.what());
      throw;
    }
  }

  int32_t world_ = 1;
  std::unique_ptr<tp::LeaderLink> link_;
  std::unique_ptr<cuda::NcclComm> comm_;
  std::unique_ptr<LlamaModelCuda> shard_;
  std::vector<pid_t> children_;
  mutable std::mutex mu_;
  std::string failure_;
};

}  // namespace

std::unique_ptr<Model> create_tensor_parallel_model(const std::string& model,
                                                    const TensorParallelOptions& options) {
  return std::make_unique<Leader>(model, options);
}

int run_tensor_parallel_worker(const TensorParallelOptions& o) {
  std::unique_ptr<tp::WorkerLink> link;  // declared first: destroyed last
  std::unique_ptr<cuda::NcclComm> comm;
  try {
    PA_CHECK(o.rank >= 1 && o.rank < o.world_size, kOp, ": --rank ", o.rank,
             " is not a worker rank of a world of ", o.world_size);
    PA_CHECK(!o.init_addr.empty(), kOp, ": rank ", o.rank, " needs --init-addr");
    link = std::make_unique<tp::WorkerLink>(o.init_addr, o.rank, o.connect_timeout_s);
    const tp::Frame init = link->recv();
    PA_CHECK(init.type == tp::FrameType::init, kOp, ": expected the init frame");
    const tp::InitMessage im = tp::decode_init(init.body);
    PA_CHECK(im.world == o.world_size, kOp, ": rank 0 runs a world of ", im.world, ", this rank ",
             "was started for ", o.world_size);
    set_device(o.rank, o.cuda_device);
    comm = std::make_unique<cuda::NcclComm>(to_id(im.nccl_id), o.world_size, o.rank);
    cuda::NcclComm* c = comm.get();
    auto group_failed = std::make_shared<std::atomic<bool>>(false);
    link->watch([group_failed](const std::string& why) {
      std::fprintf(stderr, "pagedattn: tensor parallel: %s\n", why.c_str());
      *group_failed = true;
    });
    std::unique_ptr<LlamaModelCuda> model = load_shard(im.model, TpShard{o.rank, o.world_size}, c);
    std::unique_ptr<KvCache> cache;
    // fp8 caches: this rank's maxima from the calibration pass and rank 0's headroom, from which
    // each fp8 cache made here gets its scales.
    std::unique_ptr<Model::KvAbsMax> absmax;
    float headroom = 0.f;
    auto scale = [&] {
      if (!cache || cache->config().dtype != DType::fp8_e4m3 || cache->scales_set()) return;
      PA_CHECK(absmax && headroom > 0.f, kOp, ": rank ", o.rank, " got an fp8 KV cache before ",
               "its scales' calibration (calibrate_kv_scales on rank 0)");
      set_kv_scales(*cache, *absmax, headroom);
    };
    // Finishes open passes (rank 0's schedule ahead) until `keep` are left. NOTE: polled, not
    // synchronized, as below.
    auto finish_open = [&](int32_t keep) {
      while (model->open_passes() > keep) {
        while (!model->oldest_finished()) {
          if (group_failed->load()) {
            std::fprintf(stderr, "pagedattn: rank %d: the group was stopped mid-step\n", o.rank);
            std::_Exit(1);
          }
          std::this_thread::yield();
        }
        model->finish_unread();
      }
    };
    while (true) {
      const tp::Frame f = link->recv();
      if (f.type == tp::FrameType::shutdown) break;
      PA_CHECK(f.type == tp::FrameType::step, kOp, ": unexpected frame type ", int(f.type));
      const tp::StepMessage m = tp::decode_step(f.body);
      // NOTE: an open pass runs on into this step only when this step is one too (its tokens
      // may name that pass's ids); anything else starts from a quiet stream.
      if (!m.open) finish_open(0);
      if (m.time_reps > 0) {
        model->time_collectives(m.time_tokens, m.time_rows, m.time_reps);
        continue;
      }
      if (!m.calibrate.empty()) {
        absmax = std::make_unique<Model::KvAbsMax>(model->kv_absmax(m.calibrate, [&] {
          if (group_failed->load()) {
            std::fprintf(stderr, "pagedattn: rank %d: the group was stopped mid-calibration\n",
                         o.rank);
            std::_Exit(1);
          }
          std::this_thread::yield();
        }));
        continue;
      }
      if (m.kv_headroom > 0.f) {
        headroom = m.kv_headroom;
        scale();
        continue;
      }
      KvCacheConfig kc;
      kc.num_layers = m.num_layers;
      kc.num_kv_heads = model->num_local_kv_heads();
      kc.head_dim = m.head_dim;
      kc.page_size = m.page_size;
      kc.num_pages = m.num_pages;
      kc.dtype = m.dtype;
      kc.device = Device::cuda;
      kc.enable_prefix_cache = false;
      if (!cache || cache->config().num_pages != kc.num_pages ||
          cache->config().page_size != kc.page_size || cache->config().dtype != kc.dtype ||
          cache->config().num_layers != kc.num_layers) {
        finish_open(0);
        cache.reset();
        cache = std::make_unique<KvCache>(kc);
        scale();
      }
      if (!m.copies.empty()) finish_open(0);
      for (const PageCopy& pc : m.copies) cache->copy_page_prefix(pc);
      if (model->cuda_graphs() != m.cuda_graphs) model->set_cuda_graphs(m.cuda_graphs);
      if (m.open) {
        // Rank 0's pass begun ahead: begin the same one (its stand-ins name the ids of the pass
        // still open here), then finish the one before it.
        if (m.greedy)
          model->begin_greedy(m.batch, *cache);
        else
          model->begin_sample(m.batch, *cache);
        finish_open(1);
        continue;
      }
      model->forward_device(m.batch, *cache, m.greedy);  // checks the batch before anything
      // NOTE: polled, not synchronized: when the group fails mid-collective the step may never
      // finish; the watcher has aborted the communicator and this rank leaves.
      while (!model->idle()) {
        if (group_failed->load()) {
          std::fprintf(stderr, "pagedattn: rank %d: the group was stopped mid-step\n", o.rank);
          std::_Exit(1);
        }
        std::this_thread::yield();
      }
    }
    link->close();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pagedattn: rank %d: %s\n", o.rank, e.what());
    std::fflush(stderr);
    if (link) {
      const std::string msg = e.what();
      try {
        link->send(tp::FrameType::error, std::vector<uint8_t>(msg.begin(), msg.end()));
      } catch (...) {
      }
    }
    if (comm) comm->abort();
    return 1;
  }
}

}  // namespace pagedattn
