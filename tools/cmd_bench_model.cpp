// `pagedattn bench model`: prefill and decode tokens/s of the whole model through the engine, at
// several batch sizes (random prompt ids, greedy decode, every sequence in one batch). A decode
// step is an engine step of greedy requests (Model::forward_greedy): the forward pass and the pick
// of the next tokens, on the device on CUDA. On CUDA each decode step is also compared with its
// memory floor: the bytes it must read (the weights once, every sequence's K/V once) over the
// device-to-device copy bandwidth measured in the same run.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"
#include "cuda_bandwidth.h"
#include "model_session.h"
#include "sampling_mix.h"
#include "pagedattn/tensor_parallel.h"
#include "pagedattn/engine.h"
#include "pagedattn/error.h"
#include "pagedattn/llama_cuda.h"

namespace pagedattn::tools {

namespace {

struct BenchModelArgs {
  SessionOptions session;
  std::vector<int> batch = {1, 32};
  int32_t prompt_len = 128;
  int32_t decode_steps = 32;
  int32_t warmup_steps = 16;       // decode steps run before the timed ones (not timed)
  bool json = false;
  int32_t prefill_chunk = 0;       // most prompt tokens per forward step; 0: the session's
  bool host_argmax = false;        // decode steps download logits and pick tokens on the host
  std::string sampling = "greedy";  // greedy | mixed (the non-greedy mix of kMixed)
  bool no_cuda_graphs = false;     // CUDA: LlamaModelCuda::set_cuda_graphs(false)
  bool no_schedule_ahead = false;  // EngineConfig::schedule_ahead = 0
};

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The memory floor of decode steps on CUDA: every step reads the weights once and every
// sequence's K/V (its whole context, the new token included) once, at the copy bandwidth.
struct DecodeFloor {
  CopyBandwidth copy;
  size_t weight_bytes = 0;    // read per step (LlamaModelCuda::step_weight_bytes)
  size_t kv_token_bytes = 0;  // K and V of one token, all layers
  // Seconds of `steps` decode steps of `batch` sequences whose prompts hold prompt_len tokens.
  double seconds(int batch, int32_t prompt_len, int32_t steps, double* kv_bytes_mean) const {
    double total = 0, kv_sum = 0;
    for (int32_t s = 0; s < steps; ++s) {
      const double kv = double(batch) * double(prompt_len + s + 1) * double(kv_token_bytes);
      kv_sum += kv;
      total += (double(weight_bytes) + kv) / (copy.gbps * 1e9);
    }
    *kv_bytes_mean = kv_sum / steps;
    return total;
  }
};

struct BatchResult {
  int batch = 0;
  double prefill_s = 0;
  double decode_s = 0;  // the greedy decode steps: forward and argmax (on the device on CUDA)
  double floor_s = 0, kv_bytes_mean = 0;  // CUDA
  double collective_ms = -1;               // tensor parallel: collectives of one decode step
  double device_s = -1;  // CUDA: the device's time on the decode steps (Model::device_busy_seconds)
};

// Prefills `batch` random prompts of prompt_len tokens, then runs warmup_steps untimed and
// decode_steps timed greedy steps, all through the engine: `batch` greedy requests of
// warmup_steps + decode_steps + 1 tokens that ignore eos. The
// engine runs prefills first (EngineConfig::prefill_first), so the prefill phase ends with the step
// that gives every request its first token (the steps that return host ids are synchronised);
// each decode step after it computes one token of every request. host_argmax: the engine was built
// to download logits and pick on the host (EngineConfig::device_sampling off), else the ids come
// from Model::forward_greedy (greedy) or Model::forward_sample (mixed).
BatchResult run_batch(Engine& engine, int batch, int32_t prompt_len, int32_t decode_steps,
                      std::mt19937& gen, bool mixed, int32_t warmup_steps = 0) {
  const int32_t vocab = engine.model().config().vocab_size;
  for (int b = 0; b < batch; ++b) {
    Request r;
    for (int32_t i = 0; i < prompt_len; ++i) r.prompt.push_back(int32_t(gen() % uint32_t(vocab)));
    r.sampling.temperature = 0.f;
    if (mixed) r.sampling = bench::mixed_sampling();
    r.seed = gen();
    r.max_tokens = warmup_steps + decode_steps + 1;
    r.ignore_eos = true;
    engine.add_request(std::move(r));
  }
  BatchResult r;
  r.batch = batch;
  int started = 0;
  auto t0 = std::chrono::steady_clock::now();
  while (started < batch) {
    for (const RequestOutput& o : engine.step()) {
      PA_CHECK(o.error.empty(), "bench model: ", o.error);
      if (o.completion_tokens == 1) ++started;
    }
  }
  r.prefill_s = since(t0);
  // NOTE: measured on an H100 (Llama-3-8B, batch 64, 512-token prompts, a kernel trace): the
  // same replayed step ran 8.6 ms right after the prefill and 7.8 ms from about the 12th step on,
  // the device warming to the decode phase; the steps timed are those after it.
  for (int32_t step = 0; step < warmup_steps; ++step) {
    PA_CHECK(engine.has_work(), "bench model: the requests ended during the warm-up steps");
    for (const RequestOutput& o : engine.step())
      PA_CHECK(o.error.empty(), "bench model: ", o.error);
  }
  t0 = std::chrono::steady_clock::now();
  const double busy0 = engine.model().device_busy_seconds();
  for (int32_t step = 0; step < decode_steps; ++step) {
    PA_CHECK(engine.has_work(), "bench model: the requests ended before the decode steps");
    for (const RequestOutput& o : engine.step())
      PA_CHECK(o.error.empty(), "bench model: ", o.error);
  }
  r.decode_s = since(t0);
  if (busy0 >= 0) r.device_s = engine.model().device_busy_seconds() - busy0;
  PA_CHECK(!engine.has_work(), "bench model: the requests outlived their decode steps");
  return r;
}

void print_result(const BenchModelArgs& a, const SessionOptions& so, const Engine& m,
                  const BatchResult& r, const DecodeFloor* floor) {
  const int B = r.batch;
  const double prefill_tps = double(B) * a.prompt_len / r.prefill_s;
  const double decode_tps = double(B) * a.decode_steps / r.decode_s;
  const double ms_per_step = 1e3 * r.decode_s / a.decode_steps;
  const double floor_ms = floor ? 1e3 * r.floor_s / a.decode_steps : 0;
  const double pct = floor ? 100.0 * r.floor_s / r.decode_s : 0;
  if (a.json) {
    std::printf(
        "{\"bench\":\"model\",\"model\":\"%s\",\"device\":\"%s\",\"kv_dtype\":\"%s\","
        "\"hw_threads\":%u,\"batch\":%d,\"prompt_len\":%d,\"decode_steps\":%d,"
        "\"warmup_steps\":%d,"
        "\"prefill_s\":%.4f,\"prefill_tokens_per_s\":%.1f,\"decode_s\":%.4f,"
        "\"decode_tokens_per_s\":%.1f,\"decode_ms_per_step\":%.3f,\"prefill_chunk\":%d,"
        "\"host_argmax\":%s,\"sampling\":\"%s\",\"schedule_ahead\":%s",
        so.model.c_str(), device_name(m.model().device()).c_str(),
        std::string(dtype_name(m.cache().config().dtype)).c_str(),
        std::thread::hardware_concurrency(), B, a.prompt_len, a.decode_steps, a.warmup_steps,
        r.prefill_s,
        prefill_tps, r.decode_s, decode_tps, ms_per_step, so.prefill_chunk,
        a.host_argmax ? "true" : "false", a.sampling.c_str(),
        m.schedules_ahead() ? "true" : "false");
    if (floor) {
      std::printf(
          ",\"gpu\":\"%s\",\"copy_gbps\":%.1f,\"weight_bytes_per_step\":%zu,"
          "\"kv_bytes_per_step\":%.0f,\"floor_ms_per_step\":%.3f,\"pct_of_floor\":%.1f,"
          "\"cuda_graphs\":%s",
          floor->copy.device.c_str(), floor->copy.gbps, floor->weight_bytes, r.kv_bytes_mean,
          floor_ms, pct,
          a.no_cuda_graphs ? "false" : "true");
    }
    if (r.device_s >= 0) {
      // The device's share of a step (from its first upload to its download): the rest is host
      // work between steps while the device waits.
      std::printf(",\"device_ms_per_step\":%.3f,\"host_gap_ms_per_step\":%.3f",
                  1e3 * r.device_s / a.decode_steps,
                  1e3 * std::max(0.0, r.decode_s - r.device_s) / a.decode_steps);
    }
    if (r.collective_ms >= 0) {
      std::printf(",\"tensor_parallel\":%d,\"collective_ms_per_step\":%.3f",
                  so.tensor_parallel, r.collective_ms);
    }
    std::printf("}\n");
  } else {
    std::printf(
        "batch %3d: prefill %d x %d tokens in %.3f s (%.1f tok/s); decode %d steps (after %d "
        "untimed) in %.3f s (%.1f tok/s, %.3f ms/step)",
        B, B, a.prompt_len, r.prefill_s, prefill_tps, a.decode_steps, a.warmup_steps, r.decode_s,
        decode_tps, ms_per_step);
    if (floor) {
      std::printf("; floor %.3f ms/step (%.2f GB weights + %.3f GB K/V): %.1f%% of floor", floor_ms,
                  double(floor->weight_bytes) / 1e9, r.kv_bytes_mean / 1e9, pct);
    }
    if (r.device_s >= 0) {
      std::printf("; device busy %.3f ms/step", 1e3 * r.device_s / a.decode_steps);
    }
    if (r.collective_ms >= 0) {
      std::printf("; %d GPUs, collectives alone %.3f ms/step", so.tensor_parallel,
                  r.collective_ms);
    }
    std::printf("\n");
  }
  std::fflush(stdout);
}

void run_bench_model(const BenchModelArgs& a) {
  PA_CHECK(!a.batch.empty(), "bench model: --batch is empty");
  for (int b : a.batch) PA_CHECK(b > 0, "bench model: --batch has ", b, ", not positive");
  PA_CHECK(a.prompt_len > 0 && a.decode_steps > 0,
           "bench model: --prompt-len and --decode-steps must be positive");
  PA_CHECK(a.warmup_steps >= 0, "bench model: --warmup-steps must not be negative, got ",
           a.warmup_steps);
  const int max_batch = *std::max_element(a.batch.begin(), a.batch.end());
  SessionOptions so = a.session;
  so.quiet = a.json;
  PA_CHECK(a.prefill_chunk >= 0, "bench model: --prefill-chunk must be positive");
  if (a.prefill_chunk > 0) so.prefill_chunk = a.prefill_chunk;
  const Device device = resolve_device(so.device);
  so.device = device_name(device);
  // A sequence's tokens: its prompt, the warm-up and timed steps' tokens and the first one; at
  // least the warm-up request's below (a 16-token prompt and two tokens).
  const int64_t seq_tokens =
      std::max<int64_t>(int64_t(a.prompt_len) + a.warmup_steps + a.decode_steps + 1, 18);
  PA_CHECK(seq_tokens <= INT32_MAX, "bench model: --prompt-len + --warmup-steps + --decode-steps",
           " is too long (", seq_tokens, " tokens a sequence)");
  const int64_t per_seq = (seq_tokens + so.page_size - 1) / so.page_size * so.page_size;
  so.kv_tokens = per_seq * max_batch;

  // NOTE: the copy is measured before the model loads, while 2 GiB of device memory are free.
  std::unique_ptr<DecodeFloor> floor;
  if (device == Device::cuda) {
    PA_CHECK(
        cuda_device_count() > 0,
        "bench model: --device cuda: no usable CUDA device (none found, or pagedattn was built "
        "without CUDA); use cpu");
    floor = std::make_unique<DecodeFloor>();
    floor->copy = measure_copy_bandwidth();
    if (!a.json) {
      std::printf(
          "copy bandwidth: %.0f GB/s (%s; %zu MiB device-to-device, bytes read + written, "
          "median of 10)\n",
          floor->copy.gbps, floor->copy.device.c_str(), floor->copy.bytes >> 20);
    }
  }
  EngineConfig ec;
  ec.enable_prefix_cache = false;  // random prompts: nothing to share
  ec.max_num_seqs = max_batch;
  ec.prefill_first = true;
  ec.device_sampling = !a.host_argmax;
  ec.schedule_ahead = a.no_schedule_ahead ? 0 : -1;
  PA_CHECK(a.sampling == "greedy" || a.sampling == "mixed",
           "bench model: --sampling must be greedy or mixed, got '", a.sampling, "'");
  const bool mixed = a.sampling == "mixed";
  // NOTE: the context the benchmark asks for, even past the model's trained length (synthetic
  // weights at --prompt-len 32768): it measures speed, not quality.
  ec.max_model_len = int32_t(seq_tokens);
  // NOTE: the runner's knobs are set before the engine is built (its steps use them).
  TensorParallelModel* tp_runner = nullptr;  // owned by the engine below
  auto tune = [&](Model& model) {
    if (!floor) return;
    // NOTE: with tensor parallelism every rank reads its own slice at once: the floor is one
    // rank's bytes (rank 0's; every rank holds the same amount but the vocabulary's remainder).
    auto* tp_model = dynamic_cast<TensorParallelModel*>(&model);
    tp_runner = tp_model;
    auto* cuda_model = tp_model ? &tp_model->shard() : dynamic_cast<LlamaModelCuda*>(&model);
    PA_CHECK(cuda_model, "bench model: the CUDA runner is not LlamaModelCuda");
    const ModelConfig& c = model.config();
    floor->weight_bytes = cuda_model->step_weight_bytes();
    if (a.no_cuda_graphs) cuda_model->set_cuda_graphs(false);
    const DType kv = resolve_kv_dtype(so.kv_cache_dtype, Device::cuda);
    floor->kv_token_bytes = size_t(c.num_layers) * 2 * size_t(cuda_model->num_local_kv_heads()) *
                            size_t(c.head_dim) * dtype_size(kv);
  };
  EngineSession session = open_engine(so, ec, tune);
  Engine& m = *session.engine;
  std::mt19937 gen(7);

  // Warm-up: one short prefill and decode step (first-touch allocations, BLAS threads).
  run_batch(m, 1, 16, 1, gen, mixed);
  for (int B : a.batch) {
    if (floor) {
      // NOTE: CUDA loads kernels lazily and cuBLAS picks an algorithm per new shape: run a full
      // prefill chunk (split over the batch) and this batch's decode shapes once, untimed.
      const int32_t warm_len = std::max(1, std::min(a.prompt_len, so.prefill_chunk / B));
      run_batch(m, B, warm_len, 2, gen, mixed);
    }
    BatchResult r = run_batch(m, B, a.prompt_len, a.decode_steps, gen, mixed, a.warmup_steps);
    // (The timed steps start from contexts of prompt_len + warmup_steps + 1.)
    if (floor)
      r.floor_s =
          floor->seconds(B, a.prompt_len + a.warmup_steps, a.decode_steps, &r.kv_bytes_mean);
    if (tp_runner) r.collective_ms = 1e3 * tp_runner->collective_seconds(B, B, 20);
    print_result(a, so, m, r, floor.get());
  }
}

}  // namespace

void register_bench_model(CLI::App& bench) {
  auto args = std::make_shared<BenchModelArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "model",
      "Prefill and decode tokens/s of the whole model (on CUDA: decode steps against the floor of "
      "their weight and K/V bytes at the copy bandwidth)");
  cmd->add_option("--batch", args->batch, "Sequences per batch, e.g. 1,32")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--prompt-len", args->prompt_len, "Prompt tokens per sequence")
      ->capture_default_str();
  cmd->add_option("--decode-steps", args->decode_steps, "Decode steps timed")
      ->capture_default_str();
  cmd->add_option("--warmup-steps", args->warmup_steps,
                  "Decode steps run after the prefill and before the timed ones (0: time the "
                  "steps right after the prefill)")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "One JSON object per batch size");
  cmd->add_flag("--host-argmax", args->host_argmax,
                "Decode steps download the logits and pick the tokens on the host instead of on "
                "the device");
  cmd->add_option("--sampling", args->sampling,
                  "greedy, or mixed: temperature 0.8, top-p 0.95, top-k 50, repetition penalty "
                  "1.1, logprobs 5 (seeded), sampled where the logits are unless --host-argmax")
      ->capture_default_str();
  cmd->add_flag("--no-cuda-graphs", args->no_cuda_graphs,
                "CUDA: launch every kernel of a decode step instead of replaying CUDA graphs");
  cmd->add_flag("--no-schedule-ahead", args->no_schedule_ahead,
                "CUDA: read each greedy decode step's ids before the next step is scheduled "
                "(else the next one is begun first: EngineConfig::schedule_ahead)");
  cmd->add_option("--prefill-chunk", args->prefill_chunk,
                  "Most prompt tokens per prefill forward step (default 2048, the engine's "
                  "max_num_batched_tokens)");
  add_session_options(*cmd, args->session);
  cmd->callback([args] {
    run_bench_model(*args);
    set_exit_code(0);
  });
}

}  // namespace pagedattn::tools
