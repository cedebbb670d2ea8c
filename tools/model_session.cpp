#include "model_session.h"

#include <chrono>
#include <filesystem>
#include <iostream>

#include "cli.h"
#include "pagedattn/error.h"
#include "pagedattn/model_file.h"
#include "pagedattn/synthetic_model.h"
#include "pagedattn/tensor_parallel.h"

namespace pagedattn::tools {

Device resolve_device(const std::string& name) {
  if (name == "cuda") return Device::cuda;  // create_model says so when there is none
  if (name == "cpu") return Device::cpu;
  PA_CHECK(name == "auto", "--device: expected auto, cpu or cuda, got '", name, "'");
  return cuda_device_count() > 0 ? Device::cuda : Device::cpu;
}

std::vector<std::string> tp_worker_argv() { return {"/proc/self/exe", "tp-worker"}; }

std::unique_ptr<Model> load_model(const std::string& model, Device device,
                                  int32_t tensor_parallel) {
  PA_CHECK(tensor_parallel >= 1, "--tensor-parallel must be at least 1, got ", tensor_parallel);
  if (tensor_parallel > 1) {
    PA_CHECK(device == Device::cuda, "--tensor-parallel ", tensor_parallel,
             " needs --device cuda (one GPU per rank)");
    PA_CHECK(is_synthetic_model(model) || std::filesystem::exists(model), "--model: '", model,
             "' does not exist");
    TensorParallelOptions o;
    o.world_size = tensor_parallel;
    o.worker_argv = tp_worker_argv();
    return create_tensor_parallel_model(model, o);
  }
  if (is_synthetic_model(model)) return create_synthetic_model(model, device);
  PA_CHECK(std::filesystem::exists(model), "--model: '", model,
           "' does not exist (fetch the default model with scripts/fetch-default-model.sh)");
  const ModelFile file = load_model_file(model, weight_format_for(device));
  return create_model(file, device);  // the runner keeps the weights it needs, not the file
}

void require_tokenizer(const std::string& model, const char* command) {
  PA_CHECK(!is_synthetic_model(model), command, ": --model ", model,
           " is a synthetic model (random weights, no tokenizer) and this command needs a "
           "tokenizer; synthetic models work with bench model, bench serve and logits");
}

void add_session_options(CLI::App& cmd, SessionOptions& opt) {
  cmd.add_option("--model", opt.model,
                 "A .gguf file, a Hugging Face folder or synthetic:NAME (random weights, no "
                 "tokenizer: synthetic:llama3-8b, synthetic:llama3-70b, synthetic:smollm2-135m, synthetic:tiny)")
      ->capture_default_str();
  cmd.add_option("--device", opt.device, "auto (cuda when a CUDA device is usable), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd.add_option("--kv-cache-dtype", opt.kv_cache_dtype,
                 "auto (the compute dtype), fp8 (e4m3, calibrated scales), f32, f16 or bf16")
      ->check(CLI::IsMember({"auto", "fp8", "f32", "f16", "bf16"}))
      ->capture_default_str();
  cmd.add_option("--tensor-parallel", opt.tensor_parallel,
                 "CUDA: split the model over this many GPUs, one process each (NCCL)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd.add_flag("--exact-matmul", opt.exact_matmul,
               "CPU: f32 activations against the dequantised weights instead of int8 activation "
               "blocks (slower; no activation rounding)");
}

namespace {

bool expects_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  if (is_synthetic_model(path)) return false;
  return !fs::is_directory(path) || fs::exists(fs::path(path) / "tokenizer.json");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

const Tokenizer& EngineSession::tok() const {
  PA_CHECK(tokenizer != nullptr, "tokenizer: the model has no tokenizer (pass token ids instead)");
  return *tokenizer;
}

EngineSession open_engine(const SessionOptions& opt, EngineConfig config,
                          const std::function<void(Model&)>& tune) {
  PA_CHECK(opt.page_size > 0 && opt.kv_tokens > 0 && opt.prefill_chunk > 0,
           "open_engine: page_size, kv_tokens and prefill_chunk must be positive");
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Model> model =
      load_model(opt.model, resolve_device(opt.device), opt.tensor_parallel);
  if (tune) tune(*model);
  EngineSession s;
  if (expects_tokenizer(opt.model))
    s.tokenizer = std::make_shared<const Tokenizer>(load_tokenizer(opt.model));
  const ModelConfig& c = model->config();
  config.kv_cache_tokens = opt.kv_tokens;
  config.kv_cache_memory_mib = 0;
  config.kv_cache_memory_fraction = 0;
  config.page_size = opt.page_size;
  config.kv_cache_dtype = opt.kv_cache_dtype;
  config.max_num_batched_tokens = opt.prefill_chunk;
  config.exact_matmul = opt.exact_matmul;
  config.log_startup = false;  // the summary below says it in the CLI's words
  if (s.tokenizer) config.eos_token_ids = s.tokenizer->eog_ids();
  if (opt.kv_cache_dtype == "fp8")
    config.kv_calibration_tokens = kv_calibration_tokens(s.tokenizer.get(), c.vocab_size);
  DecodeFn decode;
  if (s.tokenizer) {
    decode = [tok = s.tokenizer](const std::vector<int32_t>& ids) {
      return tok->decode(ids, true);
    };
  }
  const std::string arch = c.architecture;
  const int32_t layers = c.num_layers, hidden = c.hidden_size, vocab = c.vocab_size;
  s.engine = std::make_unique<Engine>(std::move(model), config, std::move(decode));
  if (!opt.quiet) {
    const KvCacheConfig& kc = s.engine->cache().config();
    const double mib = double(kc.num_pages) * kc.page_size * kc.num_layers * kc.num_kv_heads *
                       kc.head_dim * 2 * double(dtype_size(kc.dtype)) / (1024.0 * 1024.0);
    std::cerr << "model: " << opt.model << " (" << arch << ", " << layers << " layers, hidden "
              << hidden << ", vocab " << vocab << ") on " << device_name(s.engine->model().device())
              << ", loaded in " << seconds_since(t0) << " s\n"
              << "kv cache: " << kc.num_pages << " pages x " << kc.page_size << " tokens, "
              << dtype_name(kc.dtype) << ", " << mib << " MiB\n";
  }
  return s;
}

void register_tp_worker(CLI::App& app) {
  auto o = std::make_shared<TensorParallelOptions>();
  CLI::App* cmd = app.add_subcommand("tp-worker", "");  // hidden: started by rank 0 or a launcher
  cmd->group("");
  cmd->add_option("--rank", o->rank, "This process's rank (1 .. world size - 1)")->required();
  cmd->add_option("--world-size", o->world_size, "Ranks in the group")->required();
  cmd->add_option("--init-addr", o->init_addr, "host:port where rank 0 listens")->required();
  cmd->add_option("--cuda-device", o->cuda_device, "CUDA device (default: rank % devices)");
  cmd->add_option("--connect-timeout", o->connect_timeout_s, "Seconds to reach rank 0")
      ->capture_default_str();
  cmd->callback([o] { set_exit_code(run_tensor_parallel_worker(*o)); });
}

}  // namespace pagedattn::tools
