// `pagedattn serve`: the OpenAI-compatible HTTP server over the continuous-batching engine.
//
// SIGINT and SIGTERM stop it gracefully: running requests are cancelled (streams get their last
// event and [DONE]), the listener closes, and the process exits 0.
#include <pthread.h>

#include <csignal>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "cli.h"
#include "model_session.h"
#include "pagedattn/chat_template.h"
#include "pagedattn/default_model.h"
#include "pagedattn/engine.h"
#include "pagedattn/error.h"
#include "pagedattn/model.h"
#include "pagedattn/server.h"
#include "pagedattn/tensor_parallel.h"
#include "pagedattn/tokenizer.h"

namespace pagedattn::tools {

namespace {

struct ServeArgs {
  std::string model = kDefaultModelPath;
  std::string device = "auto";
  std::string served_model_name;  // "" -> the file's stem
  ServerConfig server;
  EngineConfig engine = [] {
    EngineConfig e;
    e.reserve_swap_space = true;  // pinned before the first request, not at the first swaps
    return e;
  }();
  bool no_prefix_cache = false;
  std::string preemption_mode = "auto";
  std::string kv_cache_memory;  // MiB, a fraction or a percentage of free memory
  int32_t tensor_parallel = 1;  // GPUs on this host, workers spawned
  TensorParallelOptions tp;     // --rank / --world-size / --init-addr: an external launcher's
};

Device pick_device(const std::string& d) {
  if (d == "cpu") return Device::cpu;
  if (d == "cuda") return Device::cuda;
  PA_CHECK(d == "auto", "serve: --device '", d, "' is not auto, cpu or cuda");
  return cuda_device_count() > 0 ? Device::cuda : Device::cpu;
}

void run_serve(ServeArgs a) {
  if (a.tp.rank > 0) {  // a worker rank started by a launcher: it follows rank 0, serves nothing
    set_exit_code(run_tensor_parallel_worker(a.tp));
    return;
  }
  PA_CHECK(a.tensor_parallel == 1 || a.tp.world_size == 1, "serve: give --tensor-parallel (",
           "workers spawned here) or --world-size (ranks started by a launcher), not both");
  PA_CHECK(a.tp.world_size == 1 || !a.tp.init_addr.empty(), "serve: --world-size ",
           a.tp.world_size, " needs --init-addr host:port (where rank 0 listens for the others)");
  require_tokenizer(a.model, "serve");
  PA_CHECK(std::filesystem::exists(a.model), "serve: --model '", a.model,
           "' does not exist (fetch the default model with scripts/fetch-default-model.sh)");
  if (!a.kv_cache_memory.empty()) {
    const KvMemorySpec kv = parse_kv_cache_memory(a.kv_cache_memory);
    a.engine.kv_cache_memory_mib = kv.mib;
    a.engine.kv_cache_memory_fraction = kv.fraction;
  }
  // Signals go to the waiting thread below only: block them before any thread starts.
  // NOTE: a signal ignored at exec (a background job's SIGINT) is discarded even while blocked, so
  // give both a handler first.
  struct sigaction sa = {};
  sa.sa_handler = [](int) {};
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  std::unique_ptr<Model> model;
  {
    const Device device = pick_device(a.device);
    if (a.tensor_parallel > 1) {
      model = load_model(a.model, device, a.tensor_parallel);
    } else if (a.tp.world_size > 1) {
      PA_CHECK(device == Device::cuda, "serve: --world-size needs --device cuda");
      model = create_tensor_parallel_model(a.model, a.tp);
    } else {
      const ModelFile file = load_model_file(a.model, weight_format_for(device));
      model = create_model(file, device);
    }
  }
  auto tok = std::make_shared<Tokenizer>(load_tokenizer(a.model));
  a.engine.enable_prefix_cache = !a.no_prefix_cache;
  a.engine.preemption = parse_preemption_mode(a.preemption_mode);
  a.engine.eos_token_ids = tok->eog_ids();
  if (a.engine.kv_cache_dtype == "fp8")
    a.engine.kv_calibration_tokens = kv_calibration_tokens(tok.get(), model->config().vocab_size);
  auto decode = [tok](const std::vector<int32_t>& ids) { return tok->decode(ids, true); };
  AsyncEngine engine(std::make_unique<Engine>(std::move(model), a.engine, decode));

  TextCodec codec;
  codec.encode = [tok](const std::string& text) { return tok->encode(text, true, true); };
  codec.encode_chat = [tok](const std::vector<ChatMessage>& msgs) {
    return encode_chat(*tok, msgs, true);
  };
  codec.decode = [tok](const std::vector<int32_t>& ids) { return tok->decode(ids, true); };
  a.server.model_name = a.served_model_name.empty() ? std::filesystem::path(a.model).stem().string()
                                                    : a.served_model_name;
  Server server(engine, codec, a.server);
  const int port = server.start();
  std::cerr << "pagedattn: serving '" << a.server.model_name << "' on http://" << a.server.host
            << ":" << port << (a.server.api_key.empty() ? "" : " (API key required)")
            << " (Ctrl-C to stop)" << std::endl;

  int sig = 0;
  sigwait(&sigs, &sig);
  std::cerr << "pagedattn: signal " << sig << ", shutting down" << std::endl;
  engine.stop();  // cancels what runs: every waiting handler gets its final output
  server.stop();
  set_exit_code(0);
}

}  // namespace

void register_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server");
  cmd->add_option("--model", a->model, "GGUF file or Hugging Face folder")->capture_default_str();
  cmd->add_option("--device", a->device, "auto | cpu | cuda")->capture_default_str();
  cmd->add_option("--tensor-parallel", a->tensor_parallel,
                 "Split the model over this many GPUs of this host, one process each (NCCL)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--world-size", a->tp.world_size,
                  "Ranks of a tensor-parallel group started by a launcher (several hosts)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--rank", a->tp.rank, "This process's rank in that group (0 serves)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--init-addr", a->tp.init_addr,
                  "host:port where rank 0 listens for the other ranks");
  cmd->add_option("--cuda-device", a->tp.cuda_device, "CUDA device of this rank (default: rank % "
                  "devices)");
  cmd->add_option("--served-model-name", a->served_model_name,
                  "Model id in the API (default: the file's stem)");
  cmd->add_option("--host", a->server.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", a->server.port, "Port (0: any free port)")->capture_default_str();
  cmd->add_option("--kv-cache-memory", a->kv_cache_memory,
                  "KV cache budget: MiB, or a fraction (0.5) or percentage (50%) of free memory "
                  "(the GPU's after the weights load; on the CPU, MemAvailable). Default: what "
                  "--max-num-seqs sequences at the longest context need, at most 512 MiB");
  cmd->add_option("--kv-cache-tokens", a->engine.kv_cache_tokens,
                  "KV cache budget in tokens (overrides --kv-cache-memory)");
  cmd->add_option("--page-size,--block-size", a->engine.page_size, "Tokens per KV page")
      ->capture_default_str();
  cmd->add_option("--kv-cache-dtype", a->engine.kv_cache_dtype, "auto | f32 | f16 | bf16 | fp8")
      ->capture_default_str();
  cmd->add_flag("--no-prefix-cache", a->no_prefix_cache, "Disable prefix caching");
  cmd->add_option("--swap-space", a->engine.swap_space_mib,
                  "MiB of host memory for the KV pages of preempted sequences (default: 4096 "
                  "with a CUDA cache, 0 on the CPU; 0: every preemption recomputes)");
  cmd->add_option("--preemption-mode", a->preemption_mode,
                  "auto (swap a preempted sequence's pages to host memory when that is cheaper "
                  "than recomputing them), recompute or swap")
      ->check(CLI::IsMember({"auto", "recompute", "swap"}))
      ->capture_default_str();
  cmd->add_flag("--exact-matmul", a->engine.exact_matmul,
                "CPU: f32 activations against the dequantised weights (slower; no int8 rounding)");
  cmd->add_option("--max-num-batched-tokens", a->engine.max_num_batched_tokens,
                  "Token budget per step")
      ->capture_default_str();
  cmd->add_option("--max-num-seqs", a->engine.max_num_seqs, "Sequences per step")
      ->capture_default_str();
  cmd->add_option("--max-model-len", a->engine.max_model_len, "Context length (0: the model's)")
      ->capture_default_str();
  cmd->add_option("--max-body-bytes", a->server.max_body_bytes, "Largest request body")
      ->capture_default_str();
  cmd->add_option("--max-header-bytes", a->server.max_header_bytes,
                  "Largest request line and headers, together (431 past it)")
      ->check(CLI::Range(size_t(1024), size_t(1) << 30))
      ->capture_default_str();
  cmd->add_option("--max-connections", a->server.max_connections,
                  "Connections served at once (one more gets a 503)")
      ->capture_default_str();
  cmd->add_option("--idle-timeout", a->server.idle_timeout_s,
                  "Seconds a new or kept-alive connection may wait before its request starts")
      ->capture_default_str();
  cmd->add_option("--header-timeout", a->server.header_timeout_s,
                  "Seconds for a request's line and headers, from their first byte")
      ->capture_default_str();
  cmd->add_option("--body-timeout", a->server.body_timeout_s,
                  "Seconds for a request's body, from the end of its headers")
      ->capture_default_str();
  cmd->add_option("--io-timeout", a->server.io_timeout_s,
                  "Seconds one read or write may make no progress")
      ->capture_default_str();
  cmd->add_option("--default-max-tokens", a->server.default_chat_max_tokens,
                  "Chat's max_tokens when a request sets none (capped by the context left)")
      ->capture_default_str();
  cmd->add_option("--api-key", a->server.api_key,
                  "Require 'Authorization: Bearer KEY' on every route but /health")
      ->envname("PAGEDATTN_API_KEY");
  cmd->add_flag("--metrics-without-key", a->server.metrics_without_key,
                "With --api-key: leave /metrics open (for a Prometheus scraper)");
  cmd->callback([a] { run_serve(*a); });
}

}  // namespace pagedattn::tools
