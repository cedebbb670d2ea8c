// The named synthetic models ("synthetic:NAME") and their runners.
#include <cmath>
#include <memory>

#include "pagedattn/error.h"
#include "pagedattn/llama.h"
#include "pagedattn/llama_cuda.h"
#include "pagedattn/synthetic_model.h"

namespace pagedattn {

namespace {

ModelConfig llama_shapes(int32_t layers, int32_t hidden, int32_t q_heads, int32_t kv_heads,
                         int32_t head_dim, int32_t intermediate, int32_t vocab) {
  ModelConfig c;
  c.architecture = "llama";
  c.num_layers = layers;
  c.hidden_size = hidden;
  c.num_q_heads = q_heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.intermediate_size = intermediate;
  c.vocab_size = vocab;
  c.rms_norm_eps = 1e-5f;
  c.max_position_embeddings = 8192;
  return c;
}

std::vector<SyntheticPreset> make_presets() {
  std::vector<SyntheticPreset> p;
  {
    // Meta-Llama-3-8B's config.json (no rope scaling: that came with 3.1).
    ModelConfig c = llama_shapes(32, 4096, 32, 8, 128, 14336, 128256);
    c.rope_theta = 500000.f;
    c.bos_token_id = 128000;
    c.eos_token_ids = {128001};
    p.push_back({"llama3-8b",
                 "Llama-3-8B shapes: 32 layers, hidden 4096, 32/8 heads of 128, intermediate "
                 "14336, vocab 128256, untied lm_head (CUDA only)",
                 c});
  }
  {
    // Meta-Llama-3-70B's config.json: 141 GB of bf16 weights, more than one GPU holds (tensor
    // parallelism).
    ModelConfig c = llama_shapes(80, 8192, 64, 8, 128, 28672, 128256);
    c.rope_theta = 500000.f;
    c.bos_token_id = 128000;
    c.eos_token_ids = {128001};
    p.push_back({"llama3-70b",
                 "Llama-3-70B shapes: 80 layers, hidden 8192, 64/8 heads of 128, intermediate "
                 "28672, vocab 128256, untied lm_head (CUDA; over several GPUs)",
                 c});
  }
  {
    // SmolLM2-135M(-Instruct)'s config.json: the default model's shapes.
    ModelConfig c = llama_shapes(30, 576, 9, 3, 64, 1536, 49152);
    c.rope_theta = 100000.f;
    c.tie_word_embeddings = true;
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
    p.push_back({"smollm2-135m",
                 "SmolLM2-135M shapes: 30 layers, hidden 576, 9/3 heads of 64, intermediate 1536, "
                 "vocab 49152, tied embeddings",
                 c});
  }
  {
    ModelConfig c = llama_shapes(2, 64, 4, 2, 16, 128, 512);
    c.eos_token_ids = {0};
    p.push_back(
        {"tiny", "2 layers, hidden 64, 4/2 heads of 16, vocab 512 (for tests; CPU only)", c});
  }
  return p;
}

std::string preset_list() {
  std::string s;
  for (const SyntheticPreset& p : synthetic_presets()) {
    s += (s.empty() ? "" : ", ") + std::string(kSyntheticPrefix) + p.name;
  }
  return s;
}

}  // namespace

const std::vector<SyntheticPreset>& synthetic_presets() {
  static const std::vector<SyntheticPreset> presets = make_presets();
  return presets;
}

bool is_synthetic_model(std::string_view model) { return model.starts_with(kSyntheticPrefix); }

ModelConfig synthetic_model_config(std::string_view model) {
  PA_CHECK(is_synthetic_model(model), "synthetic model: '", model, "' does not start with '",
           kSyntheticPrefix, "' (known: ", preset_list(), ")");
  const std::string_view name = model.substr(kSyntheticPrefix.size());
  for (const SyntheticPreset& p : synthetic_presets()) {
    if (p.name == name) return p.config;
  }
  fail("synthetic model: '", model, "' is not a known preset (known: ", preset_list(), ")");
}

int64_t synthetic_param_count(const ModelConfig& config) {
  int64_t n = 0;
  for (const SyntheticTensor& t : synthetic_tensors(config)) {
    int64_t e = 1;
    for (int64_t d : t.shape) e *= d;
    n += e;
  }
  return n;
}

ModelFile make_synthetic_preset_file(std::string_view model) {
  const ModelConfig c = synthetic_model_config(model);
  const int64_t bytes = synthetic_param_count(c) * 4;
  auto gib = [](int64_t b) { return std::round(double(b) / double(1 << 30) * 10) / 10; };
  PA_CHECK(bytes <= kMaxCpuSyntheticBytes, "create_model: ", model, " needs ", gib(bytes),
           " GiB of f32 weights on the CPU (synthetic models there are limited to ",
           gib(kMaxCpuSyntheticBytes), " GiB); use --device cuda");
  ModelFile f = make_hashed_synthetic_model_file(c, kSyntheticSeed);
  f.path = std::string(model);
  return f;
}

std::unique_ptr<Model> create_synthetic_model(std::string_view model, Device device) {
  if (device == Device::cuda) {
    const ModelConfig c = synthetic_model_config(model);
    PA_CHECK(cuda_device_count() > 0, "create_model: ", model,
             " on device cuda: no usable CUDA device (none found, or pagedattn was built without "
             "CUDA); use cpu");
    return std::make_unique<LlamaModelCuda>(c, kSyntheticSeed);
  }
  return std::make_unique<LlamaModel>(make_synthetic_preset_file(model));
}

}  // namespace pagedattn
