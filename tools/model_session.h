// A loaded model for the CLI's direct commands (generate, chat, logits, bench model): the model
// file, its runner, a paged KV cache sized for the job, the tokenizer when the file has one, and a
// chunked prefill / batched decode over any set of sequences. The engine proper (scheduler,
// preemption, prefix cache) lives in src/engine; this is the small loop beside it.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pagedattn/default_model.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/model.h"
#include "pagedattn/tokenizer.h"

namespace pagedattn::tools {

// kDefaultModelPath: pagedattn/default_model.h.

struct SessionOptions {
  std::string model = kDefaultModelPath;
  std::string device = "auto";          // auto | cpu | cuda
  std::string kv_cache_dtype = "auto";  // auto (the model's compute dtype) | fp8
  int64_t kv_tokens = 4096;             // cache capacity, in tokens (rounded up to pages)
  int32_t page_size = 16;
  int32_t prefill_chunk = 2048;  // most prompt tokens per forward step (the engine's default)
  bool quiet = false;            // no load summary on stderr
  bool exact_matmul = false;     // CPU: f32 activations against the dequantised weights
};

// Adds --model, --device, --kv-cache-dtype and --exact-matmul to a command.
void add_session_options(CLI::App& cmd, SessionOptions& opt);
// --device: cpu, cuda, or auto (cuda when a CUDA device is usable, else cpu).
Device resolve_device(const std::string& name);
// The runner of --model on device: a .gguf file, a Hugging Face folder or synthetic:NAME
// (synthetic_model.h). Throws Error naming what is wrong (a missing path, an unknown preset).
std::unique_ptr<Model> load_model(const std::string& model, Device device);
// Throws Error when --model cannot have a tokenizer (a synthetic model), naming the command that
// needs one; called before anything is loaded.
void require_tokenizer(const std::string& model, const char* command);

class ModelSession {
 public:
  // Loads the file and the tokenizer (absent for a folder without tokenizer.json), builds the
  // runner and the cache, and calibrates fp8 scales when asked. Throws Error naming what failed.
  explicit ModelSession(const SessionOptions& opt);

  Model& model() { return *model_; }
  KvCache& cache() { return *cache_; }
  const ModelConfig& config() const { return model_->config(); }
  bool has_tokenizer() const { return tokenizer_.has_value(); }
  // Throws Error when the model has no tokenizer.
  const Tokenizer& tokenizer() const;
  // Token ids that end generation: the tokenizer's end-of-generation ids and the config's eos.
  std::vector<int32_t> stop_ids() const;

  // Runs the new tokens of each sequence through the cache, at most prefill_chunk tokens per step.
  // Returns logits [seqs.size(), vocab] of each sequence's last new token (all_rows: of every new
  // token, sequences in order, [sum of sizes, vocab]).
  Tensor prefill(const std::vector<SeqId>& seqs, const std::vector<std::vector<int32_t>>& tokens,
                 bool all_rows = false);
  // One decode step: token[b] appended to seqs[b]. Returns logits [seqs.size(), vocab].
  Tensor decode(const std::vector<SeqId>& seqs, const std::vector<int32_t>& tokens);
  // The same step, greedy: returns the argmax of each sequence's logits [seqs.size()]
  // (Model::forward_greedy: picked on the device on CUDA, only the ids downloaded).
  std::vector<int32_t> decode_greedy(const std::vector<SeqId>& seqs,
                                     const std::vector<int32_t>& tokens);

 private:
  SessionOptions opt_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<KvCache> cache_;
  std::optional<Tokenizer> tokenizer_;
};

// Registered from cli.h's register_generate.
void register_logits(CLI::App& app);
void register_bench_model(CLI::App& bench);

}  // namespace pagedattn::tools
