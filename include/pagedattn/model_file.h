// What a model file gives the runtime: its configuration and its tensors by Hugging Face name.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pagedattn/tensor.h"

namespace pagedattn {

// rope_scaling of a Hugging Face config (transformers' names and defaults).
struct RopeScaling {
  std::string type;                  // "" (none), "linear", "llama3" or "yarn"
  float factor = 1.f;                // linear: positions over factor; llama3, yarn: as named
  float low_freq_factor = 1.f;       // llama3
  float high_freq_factor = 4.f;      // llama3
  int32_t original_max_position = 8192;  // llama3, yarn: the pretraining context
  // yarn: the correction range's rotations, the cos/sin scale (<= 0: from factor, mscale and
  // mscale_all_dim), and whether the range is rounded outwards to whole dimensions.
  float beta_fast = 32.f;
  float beta_slow = 1.f;
  float attention_factor = 0.f;
  float mscale = 0.f;
  float mscale_all_dim = 0.f;
  bool truncate = true;
};

struct ModelConfig {
  std::string architecture;          // "llama" (Llama 2/3, SmolLM2), "mistral", "qwen2", "qwen3"
  int32_t vocab_size = 0;
  int32_t hidden_size = 0;
  int32_t intermediate_size = 0;
  int32_t num_layers = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;              // hidden_size / num_q_heads unless the file says otherwise
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.f;
  RopeScaling rope_scaling;
  int32_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  bool attention_bias = false;       // q/k/v projections have a bias (Qwen2)
  bool qk_norm = false;              // RMSNorm on q and k per head before RoPE (Qwen3)
  int32_t sliding_window = 0;        // 0: none
  int32_t bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;
};

// Tensors are keyed by their Hugging Face names, in Hugging Face layout (GGUF's row permutation of
// q/k projections undone), dequantised to f32 on the CPU:
//   model.embed_tokens.weight [vocab, hidden]        model.norm.weight [hidden]
//   lm_head.weight [vocab, hidden] (absent when tied)
//   model.layers.{i}.input_layernorm.weight           model.layers.{i}.post_attention_layernorm.weight
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight  [out, in]   (+ .bias for q/k/v with attention_bias)
//   model.layers.{i}.self_attn.{q,k}_norm.weight [head_dim]       (qk_norm)
//   model.layers.{i}.mlp.{gate,up,down}_proj.weight  [out, in]
//
// With WeightFormat::file, the matrices of a GGUF file (projections, embeddings, lm_head) stay in
// their file's format in `weights` instead (memory-mapped; q/k rows reordered into a copy), and
// only the vectors (norms, biases) are in `tensors`.
struct FileWeight {
  uint32_t ggml_type = 0;               // GGMLType of the blocks (gguf.h)
  std::vector<int64_t> shape;           // [rows, cols], cols a multiple of the block size
  int64_t row_bytes = 0;                // bytes of one row of blocks
  std::shared_ptr<const uint8_t> data;  // [rows * row_bytes], shares the mapping or a copy
  bool mapped = false;  // data lies in a private read-only mapping of the file (pages re-readable)
  // Rows still in llama.cpp's q/k order, heads of head_rows rows (0: in Hugging Face order):
  // Hugging Face row h * head_rows + i * head_rows / 2 + j is stored row h * head_rows + 2 j + i.
  // Only WeightFormat::stored leaves them so (file_row maps them); `file` reorders a copy.
  int64_t head_rows = 0;
  // The stored row holding Hugging Face row r.
  int64_t file_row(int64_t r) const {
    if (head_rows == 0) return r;
    const int64_t half = head_rows / 2, in_head = r % head_rows;
    return r - in_head + 2 * (in_head % half) + in_head / half;
  }
};

struct ModelFile {
  std::string path;
  ModelConfig config;
  std::map<std::string, Tensor> tensors;
  std::map<std::string, FileWeight> weights;  // WeightFormat::file only
};

// How load_model_file keeps a file's weights: dequantised to f32 (every runner reads these); in a
// GGUF file's own blocks (the CPU runner reads them in place); or `stored`: a Hugging Face
// folder's tensors in their stored dtype (f32, f16 or bf16), memory-mapped and untouched until
// read, and a GGUF file's matrices in its blocks as with `file`, so the CUDA runner reads and
// dequantises only what it uploads (a tensor-parallel rank only its slice).
enum class WeightFormat { f32, file, stored };

// Loads a .gguf file or a Hugging Face folder (config.json + *.safetensors). Throws Error naming
// the file and the tensor or key at fault.
ModelFile load_model_file(const std::string& path, WeightFormat format = WeightFormat::f32);
// The file with every entry of `weights` dequantised to an f32 tensor (for runners that need f32).
ModelFile with_f32_weights(const ModelFile& file);
// Rows [row0, row0 + rows) and columns [col0, col0 + cols) of a file weight dequantised to f32
// into out [rows][cols], the same values as with_f32_weights gives them. Only the blocks that hold
// them are read where col0 and cols are multiples of the block size, else whole rows. Throws
// Error on a range outside the weight.
void dequantize_block(const FileWeight& w, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                      float* out);

// The parts, for tools and tests.
// Every tensor of one .safetensors file (F32, F16, BF16), converted to f32, by its stored name.
// keep_stored: each tensor in its stored dtype over a private read-only mapping of the file (a
// tensor whose data is not aligned to its element size is copied instead).
std::map<std::string, Tensor> load_safetensors(const std::string& path, bool keep_stored = false);
// A Hugging Face config.json (its text) as ModelConfig; file names the source in errors.
ModelConfig parse_hf_config(const std::string& json_text, const std::string& file);
// Checks that the tensors a config needs are present with the right shapes (Error names the first
// one at fault); drops tensors the runtime does not use.
void check_model_tensors(ModelFile& mf);

}  // namespace pagedattn
