// LlamaModelCuda in builds without CUDA: the constructor throws Error, so nothing else is reached.
#ifndef PAGEDATTN_HAVE_CUDA

#include "pagedattn/error.h"
#include "pagedattn/llama.h"
#include "pagedattn/llama_cuda.h"

namespace pagedattn {

struct LlamaModelCuda::Impl {
  ModelConfig config;
};

LlamaModelCuda::LlamaModelCuda(const ModelFile&) {
  fail("LlamaModelCuda: pagedattn was built without CUDA support");
}
LlamaModelCuda::LlamaModelCuda(const ModelConfig& config, uint64_t) {
  ModelConfig c = config;
  check_llama_config(c, "LlamaModelCuda");  // a bad config says so, as with CUDA
  fail("LlamaModelCuda: pagedattn was built without CUDA support");
}
LlamaModelCuda::LlamaModelCuda(const ModelFile&, TpShard, cuda::NcclComm*) {
  fail("LlamaModelCuda: pagedattn was built without CUDA support");
}
LlamaModelCuda::LlamaModelCuda(const ModelConfig&, uint64_t, TpShard, cuda::NcclComm*) {
  fail("LlamaModelCuda: pagedattn was built without CUDA support");
}
LlamaModelCuda::~LlamaModelCuda() = default;
int32_t LlamaModelCuda::num_local_kv_heads() const { return 0; }
Tensor LlamaModelCuda::download_logits(const float*, int64_t) {
  fail("LlamaModelCuda::forward: pagedattn was built without CUDA support");
}
std::vector<int32_t> LlamaModelCuda::download_greedy(const float*, int32_t) {
  fail("LlamaModelCuda::forward: pagedattn was built without CUDA support");
}
bool LlamaModelCuda::idle() const { return true; }
const float* LlamaModelCuda::forward_device(const ForwardBatch&, KvCache&, bool) {
  fail("LlamaModelCuda::forward: pagedattn was built without CUDA support");
}

const ModelConfig& LlamaModelCuda::config() const { return impl_->config; }

Tensor LlamaModelCuda::forward(const ForwardBatch&, KvCache&) {
  fail("LlamaModelCuda::forward: pagedattn was built without CUDA support");
}

std::vector<int32_t> LlamaModelCuda::forward_greedy(const ForwardBatch&, KvCache&) {
  fail("LlamaModelCuda::forward: pagedattn was built without CUDA support");
}

std::vector<TokenLogprobs> LlamaModelCuda::forward_sample(const ForwardBatch&, KvCache&,
                                                          const SamplePlan&) {
  fail("LlamaModelCuda::forward: pagedattn was built without CUDA support");
}

void LlamaModelCuda::begin_sample(const ForwardBatch&, KvCache&) {
  fail("LlamaModelCuda::forward: pagedattn was built without CUDA support");
}

void LlamaModelCuda::pick_sampled(const SamplePlan&) {
  fail("LlamaModelCuda::forward: pagedattn was built without CUDA support");
}

std::vector<TokenLogprobs> LlamaModelCuda::take_sampled() {
  fail("LlamaModelCuda::forward: pagedattn was built without CUDA support");
}

void LlamaModelCuda::begin_pass(const ForwardBatch&, KvCache&, bool) {
  fail("LlamaModelCuda::forward: pagedattn was built without CUDA support");
}

void LlamaModelCuda::begin_greedy(const ForwardBatch&, KvCache&) {
  fail("LlamaModelCuda::forward: pagedattn was built without CUDA support");
}

std::vector<int32_t> LlamaModelCuda::finish_greedy() {
  fail("LlamaModelCuda::forward: pagedattn was built without CUDA support");
}

const float* LlamaModelCuda::run_pass(const ForwardBatch&, KvCache&, bool, int) {
  fail("LlamaModelCuda::forward: pagedattn was built without CUDA support");
}

bool LlamaModelCuda::overlaps_passes() const { return false; }

int32_t LlamaModelCuda::open_passes() const { return 0; }

int32_t LlamaModelCuda::chained_rows() const { return 0; }

bool LlamaModelCuda::oldest_finished() const {
  fail("LlamaModelCuda::forward: pagedattn was built without CUDA support");
}

void LlamaModelCuda::finish_unread() {
  fail("LlamaModelCuda::forward: pagedattn was built without CUDA support");
}

double LlamaModelCuda::device_busy_seconds() const { return -1; }

void LlamaModelCuda::validate(const ForwardBatch&, const KvCache&, int32_t) const {
  fail("LlamaModelCuda::forward: pagedattn was built without CUDA support");
}

size_t LlamaModelCuda::weight_bytes() const { return 0; }
size_t LlamaModelCuda::step_weight_bytes() const { return 0; }
void LlamaModelCuda::set_cuda_graphs(bool) {}
bool LlamaModelCuda::cuda_graphs() const { return false; }
void LlamaModelCuda::set_decode_padding(bool) {}
double LlamaModelCuda::time_collectives(int32_t, int32_t, int32_t) { return 0; }
Model::KvAbsMax LlamaModelCuda::kv_absmax(const std::vector<int32_t>&) {
  fail("LlamaModelCuda::kv_absmax: pagedattn was built without CUDA support");
}
Model::KvAbsMax LlamaModelCuda::kv_absmax(const std::vector<int32_t>&,
                                          const std::function<void()>&) {
  fail("LlamaModelCuda::kv_absmax: pagedattn was built without CUDA support");
}
Model::GraphStats LlamaModelCuda::cuda_graph_stats() const { return {}; }

}  // namespace pagedattn

#endif  // PAGEDATTN_HAVE_CUDA
