// Synthetic models: random weights of a real model's shapes, for tests and benchmarks that need no
// checkpoint (the speed of a forward pass does not depend on the values). Named presets are
// accepted wherever a --model is: "synthetic:llama3-8b", "synthetic:smollm2-135m",
// "synthetic:tiny". They have no tokenizer.
//
// Weights are hashed, not drawn from a sequential generator: element i of tensor t is a
// counter-based hash of (seed, t.id, i), so the CUDA runner fills its bf16 weights on the device
// (no host copy: 32 GB of f32 for Llama-3-8B) and the CPU gets the same values.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pagedattn/model.h"
#include "pagedattn/model_file.h"

namespace pagedattn {

// One weight tensor of a synthetic model: uniform in [center - half_width, center + half_width].
struct SyntheticTensor {
  std::string name;  // Hugging Face name (model_file.h)
  std::vector<int64_t> shape;
  float center = 0.f, half_width = 0.f;
  uint32_t id = 0;  // distinct within a model, the same for the same name in every config
};

// Every tensor `config` calls for, in a fixed order, with the scale rules of every synthetic model:
// embeddings uniform in [-1, 1]; Linear weights [out, in] with half-width sqrt(3 / in) (outputs of
// about unit variance for unit-variance inputs); norm weights in 1 +- 0.2; biases in +-0.5.
// Biases only with attention_bias, q/k norms only with qk_norm, no lm_head when tied.
// config.head_dim must be set (Error otherwise).
std::vector<SyntheticTensor> synthetic_tensors(const ModelConfig& config);

// A host f32 model file of hashed weights: the same values LlamaModelCuda(config, seed) makes on
// the device (before its bf16 rounding). head_dim 0 becomes hidden_size / num_q_heads.
ModelFile make_hashed_synthetic_model_file(const ModelConfig& config, uint64_t seed);

// ---- Named presets ("synthetic:NAME") ----

inline constexpr std::string_view kSyntheticPrefix = "synthetic:";
inline constexpr uint64_t kSyntheticSeed = 1234;  // the weights of every named preset
// Synthetic models larger than this in f32 are refused on the CPU (Llama-3-8B is 32 GB).
inline constexpr int64_t kMaxCpuSyntheticBytes = int64_t(8) << 30;

struct SyntheticPreset {
  std::string name;         // "llama3-8b"
  std::string description;  // "Llama-3-8B shapes: 32 layers, hidden 4096, ..."
  ModelConfig config;       // head_dim set
};

// The known presets, in the order error messages list them.
const std::vector<SyntheticPreset>& synthetic_presets();
// Whether `model` names a synthetic model ("synthetic:" prefix), known or not.
bool is_synthetic_model(std::string_view model);
// The config of "synthetic:NAME". Error naming the known presets when NAME is not one of them (or
// the prefix is missing).
ModelConfig synthetic_model_config(std::string_view model);
// Parameters (elements of every weight tensor) of a config.
int64_t synthetic_param_count(const ModelConfig& config);

// The host f32 file of "synthetic:NAME" (make_hashed_synthetic_model_file, kSyntheticSeed).
// Refused (Error saying to use --device cuda) beyond kMaxCpuSyntheticBytes.
ModelFile make_synthetic_preset_file(std::string_view model);

// The runner of "synthetic:NAME" on `device`, weights from kSyntheticSeed. CUDA: LlamaModelCuda
// filled on the device. CPU: LlamaModel over make_synthetic_preset_file.
std::unique_ptr<Model> create_synthetic_model(std::string_view model, Device device);

}  // namespace pagedattn
