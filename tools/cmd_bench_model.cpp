// `pagedattn bench model`: prefill and decode tokens/s of the whole model through the paged cache,
// at several batch sizes (random prompt ids, greedy decode, every sequence in one batch).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"
#include "model_session.h"
#include "pagedattn/error.h"

namespace pagedattn::tools {

namespace {

struct BenchModelArgs {
  SessionOptions session;
  std::vector<int> batch = {1, 32};
  int32_t prompt_len = 128;
  int32_t decode_steps = 32;
  bool json = false;
};

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<int32_t> greedy(const Tensor& logits) {
  std::vector<int32_t> out;
  const int64_t V = logits.dim(1);
  for (int64_t r = 0; r < logits.dim(0); ++r) {
    const float* row = logits.data_as<float>() + r * V;
    out.push_back(int32_t(std::max_element(row, row + V) - row));
  }
  return out;
}

void run_bench_model(const BenchModelArgs& a) {
  PA_CHECK(!a.batch.empty(), "bench model: --batch is empty");
  for (int b : a.batch) PA_CHECK(b > 0, "bench model: --batch has ", b, ", not positive");
  PA_CHECK(a.prompt_len > 0 && a.decode_steps > 0,
           "bench model: --prompt-len and --decode-steps must be positive");
  const int max_batch = *std::max_element(a.batch.begin(), a.batch.end());
  SessionOptions so = a.session;
  so.quiet = a.json;
  const int64_t per_seq =
      (int64_t(a.prompt_len) + a.decode_steps + so.page_size) / so.page_size * so.page_size;
  so.kv_tokens = per_seq * max_batch;
  ModelSession m(so);
  const int32_t vocab = m.config().vocab_size;
  std::mt19937 gen(7);

  // Warm-up: one short prefill and decode step (first-touch allocations, BLAS threads).
  {
    const SeqId s = m.cache().create_sequence();
    const Tensor l = m.prefill({s}, {std::vector<int32_t>(16, 1)});
    m.decode({s}, greedy(l));
    m.cache().free_sequence(s);
  }
  for (int B : a.batch) {
    std::vector<SeqId> seqs;
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(B));
    for (auto& p : prompts) {
      for (int32_t i = 0; i < a.prompt_len; ++i) p.push_back(int32_t(gen() % uint32_t(vocab)));
      seqs.push_back(m.cache().create_sequence());
    }
    auto t0 = std::chrono::steady_clock::now();
    Tensor logits = m.prefill(seqs, prompts);
    const double prefill_s = since(t0);
    t0 = std::chrono::steady_clock::now();
    for (int32_t step = 0; step < a.decode_steps; ++step) logits = m.decode(seqs, greedy(logits));
    const double decode_s = since(t0);
    for (SeqId s : seqs) m.cache().free_sequence(s);

    const double prefill_tps = double(B) * a.prompt_len / prefill_s;
    const double decode_tps = double(B) * a.decode_steps / decode_s;
    const double ms_per_step = 1e3 * decode_s / a.decode_steps;
    if (a.json) {
      std::printf(
          "{\"bench\":\"model\",\"model\":\"%s\",\"device\":\"%s\",\"kv_dtype\":\"%s\","
          "\"hw_threads\":%u,\"batch\":%d,\"prompt_len\":%d,\"decode_steps\":%d,"
          "\"prefill_s\":%.4f,\"prefill_tokens_per_s\":%.1f,\"decode_s\":%.4f,"
          "\"decode_tokens_per_s\":%.1f,\"decode_ms_per_step\":%.2f}\n",
          so.model.c_str(), device_name(m.model().device()).c_str(),
          std::string(dtype_name(m.cache().config().dtype)).c_str(),
          std::thread::hardware_concurrency(), B, a.prompt_len, a.decode_steps, prefill_s,
          prefill_tps, decode_s, decode_tps, ms_per_step);
    } else {
      std::printf(
          "batch %3d: prefill %d x %d tokens in %.3f s (%.1f tok/s); decode %d steps in %.3f s "
          "(%.1f tok/s, %.2f ms/step)\n",
          B, B, a.prompt_len, prefill_s, prefill_tps, a.decode_steps, decode_s, decode_tps,
          ms_per_step);
    }
    std::fflush(stdout);
  }
}

}  // namespace

void register_bench_model(CLI::App& bench) {
  auto args = std::make_shared<BenchModelArgs>();
  CLI::App* cmd = bench.add_subcommand("model", "Prefill and decode tokens/s of the whole model");
  cmd->add_option("--batch", args->batch, "Sequences per batch, e.g. 1,32")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--prompt-len", args->prompt_len, "Prompt tokens per sequence")
      ->capture_default_str();
  cmd->add_option("--decode-steps", args->decode_steps, "Decode steps timed")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "One JSON object per batch size");
  add_session_options(*cmd, args->session);
  cmd->callback([args] {
    run_bench_model(*args);
    set_exit_code(0);
  });
}

}  // namespace pagedattn::tools
