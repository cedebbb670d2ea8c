// The CLI's model options and loading: --model, --device, --kv-cache-dtype, and the engine that
// the direct commands (generate, chat, logits, bench model) run their tokens through.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pagedattn/default_model.h"
#include "pagedattn/engine.h"
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
  int32_t prefill_chunk = 2048;  // most tokens per forward step (max_num_batched_tokens)
  bool quiet = false;            // no load summary on stderr
  bool exact_matmul = false;     // CPU: f32 activations against the dequantised weights
  int32_t tensor_parallel = 1;   // CUDA: GPUs (processes) the model is split over
};

// Adds --model, --device, --kv-cache-dtype and --exact-matmul to a command.
void add_session_options(CLI::App& cmd, SessionOptions& opt);
// --device: cpu, cuda, or auto (cuda when a CUDA device is usable, else cpu).
Device resolve_device(const std::string& name);
// The runner of --model on device: a .gguf file, a Hugging Face folder or synthetic:NAME
// (synthetic_model.h). Throws Error naming what is wrong (a missing path, an unknown preset).
// tensor_parallel > 1 (CUDA): rank 0 of a group whose other ranks this process spawns (the hidden
// `tp-worker` command), each on its own GPU (tensor_parallel.h).
std::unique_ptr<Model> load_model(const std::string& model, Device device,
                                  int32_t tensor_parallel = 1);
// The worker command rank 0 spawns: this executable's `tp-worker`.
std::vector<std::string> tp_worker_argv();
// `pagedattn tp-worker --rank R --world-size N --init-addr HOST:PORT [--cuda-device D]`: one rank
// of a tensor-parallel group (spawned by rank 0, or started by a launcher on another host).
void register_tp_worker(CLI::App& app);
// Throws Error when --model cannot have a tokenizer (a synthetic model), naming the command that
// needs one; called before anything is loaded.
void require_tokenizer(const std::string& model, const char* command);

// A model and the engine that runs it, for the CLI's direct commands (generate, chat, logits,
// bench model): every token goes through Engine::step like the server's.
struct EngineSession {
  std::shared_ptr<const Tokenizer> tokenizer;  // null: the model has none (synthetic, bare folder)
  std::unique_ptr<Engine> engine;

  // Throws Error naming --model when the model has no tokenizer.
  const Tokenizer& tok() const;
  const ModelConfig& config() const { return engine->model().config(); }
};

// Loads --model and its tokenizer (when the file has one) and builds the engine on them: the KV
// cache holds opt.kv_tokens tokens in opt.page_size pages, a step at most opt.prefill_chunk
// tokens, the tokenizer's end-of-turn ids end generation, an fp8 cache is calibrated
// (kv_calibration_tokens). `config` brings the rest (prefix cache, max_num_seqs, ...); `tune`, when
// set, sees the runner before the engine is built. Prints the load summary on stderr unless
// opt.quiet. Throws Error naming what failed.
EngineSession open_engine(const SessionOptions& opt, EngineConfig config = {},
                          const std::function<void(Model&)>& tune = {});

// Registered from cli.h's register_generate.
void register_logits(CLI::App& app);
void register_bench_model(CLI::App& bench);

}  // namespace pagedattn::tools
