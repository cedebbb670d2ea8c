// The serving benchmark's replay loop (bench/serve_bench_run.cpp) end to end on a tiny synthetic
// Llama. Checks what must hold whatever the timing: every request completes with exactly its
// output length, the static baseline never holds more than the KV budget nor preempts, and paged KV
// use stays within the pool. No timing assertions.
#include <gtest/gtest.h>

#include <cmath>

#include "pagedattn/llama.h"
#include "serve_bench_run.h"

namespace sb = pagedattn::bench::serve_bench;
using pagedattn::Error;
using pagedattn::ModelConfig;
using pagedattn::ModelFile;

namespace {

ModelFile tiny_model() {
  ModelConfig c;
  c.architecture = "llama";
  c.vocab_size = 128;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_layers = 2;
  c.num_q_heads = 4;
  c.num_kv_heads = 2;
  c.max_position_embeddings = 512;
  c.eos_token_ids = {0};
  return pagedattn::make_synthetic_model_file(c, 7);
}

sb::WorkloadSpec spec(double rate) {
  sb::WorkloadSpec w;
  w.num_requests = 12;
  w.rate = rate;
  w.prompt = sb::parse_length_spec("uniform:4:24", "p");
  w.output = sb::parse_length_spec("uniform:2:20", "o");
  w.vocab_lo = 1;
  w.vocab_hi = 128;
  w.seed = 11;
  return w;
}

sb::RunConfig config(const std::string& mode) {
  sb::RunConfig rc;
  rc.mode = mode;
  rc.kv_budget_tokens = 160;
  rc.page_size = 8;
  rc.max_num_seqs = 8;
  rc.max_num_batched_tokens = 64;
  rc.batch_timeout_s = 0.01;
  rc.progress = false;
  return rc;
}

}  // namespace

TEST(ServeBenchRun, EveryRequestCompletesWithItsLengthInBothModes) {
  const ModelFile file = tiny_model();
  for (double rate : {std::numeric_limits<double>::infinity(), 200.0}) {
    const sb::WorkloadSpec w = spec(rate);
    const auto work = sb::make_workload(w);
    int64_t want_out = 0, want_prompt = 0;
    for (const auto& it : work) {
      want_out += it.max_tokens;
      want_prompt += int64_t(it.prompt.size());
    }
    for (const std::string mode : {"paged", "static"}) {
      SCOPED_TRACE(mode + " rate " + std::to_string(rate));
      const sb::RunResult r = sb::run_serve_bench(file, work, w, config(mode));
      EXPECT_EQ(r.completed, 12);
      EXPECT_EQ(r.output_tokens, want_out);
      EXPECT_EQ(r.prompt_tokens, want_prompt);
      EXPECT_EQ(r.ttft_s.count, 12);
      EXPECT_EQ(r.e2e_s.count, 12);
      EXPECT_EQ(r.itl_s.count, want_out - 12);  // every token after each request's first
      EXPECT_LE(r.ttft_s.p50, r.e2e_s.p99);
      ASSERT_FALSE(r.timeline.empty());
      for (const sb::KvSample& s : r.timeline) {
        EXPECT_LE(s.kv_live, s.kv_allocated);
        EXPECT_LE(s.kv_allocated, mode == "static" ? 160 : r.kv_pool_tokens);
        EXPECT_GE(s.kv_live, 0);
      }
      EXPECT_EQ(r.timeline.back().kv_allocated, 0);  // nothing held at the end
      EXPECT_GT(r.steps, 0);
      EXPECT_NEAR(r.ramp_s + r.steady_s + r.tail_s, r.duration_s, 1e-9);
      // A CPU model has no device time: its idle share and time per step are absent, not zero.
      EXPECT_TRUE(std::isnan(r.device_idle_frac));
      EXPECT_TRUE(std::isnan(r.device_idle_ms_per_step));
      if (mode == "static") {
        EXPECT_EQ(r.preemptions, 0);
        EXPECT_EQ(r.prefix_hit_rate, 0.0);
      }
    }
  }
}

TEST(ServeBenchRun, LookaheadAdmissionNeverPreemptsAndCountsItsDecisions) {
  // 160 tokens of KV for requests of up to 44: admission on current use preempts, the lookahead
  // (lengths are known: the benchmark ignores EOS) does not; both complete every request.
  const ModelFile file = tiny_model();
  const sb::WorkloadSpec w = spec(std::numeric_limits<double>::infinity());
  const auto work = sb::make_workload(w);
  sb::RunConfig rc = config("paged");
  rc.kv_budget_tokens = 96;
  const sb::RunResult look = sb::run_serve_bench(file, work, w, rc);
  EXPECT_EQ(look.completed, 12);
  EXPECT_EQ(look.preemptions, 0);
  EXPECT_EQ(look.recomputed_tokens, 0);
  EXPECT_GT(look.admission_stalls, 0);
  rc.admission = "immediate";
  const sb::RunResult now = sb::run_serve_bench(file, work, w, rc);
  EXPECT_EQ(now.completed, 12);
  EXPECT_GT(now.preemptions, 0);
  EXPECT_EQ(now.preemptions_recompute, now.preemptions);
  EXPECT_GT(now.recomputed_tokens, 0);
  EXPECT_EQ(now.recomputed_tokens, now.preempted_computed_tokens - now.resumed_prefix_hit_tokens);
  // With swap space the same preemptions keep their tokens in host memory.
  rc.preemption = "swap";
  rc.swap_space_mib = 16;
  const sb::RunResult swapped = sb::run_serve_bench(file, work, w, rc);
  EXPECT_EQ(swapped.completed, 12);
  EXPECT_GT(swapped.preemptions_swap, 0);
  EXPECT_EQ(swapped.preemptions_swap, swapped.preemptions);
  EXPECT_EQ(swapped.recomputed_tokens, 0);
  EXPECT_GT(swapped.swap_bytes, 0);
  rc.preemption = "auto";
  rc.swap_space_mib = -1;
  rc.admission = "sometimes";
  EXPECT_THROW(sb::run_serve_bench(file, work, w, rc), Error);
}

TEST(ServeBenchRun, StaticReservationsAreHeldUntilTheBatchEnds) {
  // Budget 160 with requests of 6..44 tokens: several batches. A batch's reservation changes only
  // by going to 0 (the whole batch finished) or from 0 (the next one starts): members that finish
  // early keep their regions, and nothing joins a running batch.
  const ModelFile file = tiny_model();
  const sb::WorkloadSpec w = spec(std::numeric_limits<double>::infinity());
  const sb::RunResult r = sb::run_serve_bench(file, sb::make_workload(w), w, config("static"));
  int64_t prev = 0;
  int batches = 0;
  for (const sb::KvSample& s : r.timeline) {
    if (s.kv_allocated != prev) {
      EXPECT_TRUE(prev == 0 || s.kv_allocated == 0) << "t=" << s.t;
    }
    if (prev == 0 && s.kv_allocated > 0) ++batches;
    prev = s.kv_allocated;
  }
  EXPECT_GE(batches, 2);
}

TEST(ServeBenchRun, RejectsRequestsThatCanNeverFit) {
  const ModelFile file = tiny_model();
  sb::WorkloadSpec w = spec(std::numeric_limits<double>::infinity());
  w.output = sb::parse_length_spec("200", "o");  // 200+ tokens against a budget of 160
  const auto work = sb::make_workload(w);
  for (const std::string mode : {"paged", "static"})
    EXPECT_THROW(sb::run_serve_bench(file, work, w, config(mode)), Error);
  sb::RunConfig bad = config("paged");
  bad.mode = "dense";
  EXPECT_THROW(sb::run_serve_bench(file, sb::make_workload(spec(1)), spec(1), bad), Error);
}

TEST(ServeBenchRun, ClosedLoopReachesTheTargetWithinTheConcurrency) {
  // --target-tokens 150 --concurrency 3: requests are released only while fewer than 3 are active
  // and fewer than 150 output tokens were asked for; each completes with its length.
  const ModelFile file = tiny_model();
  sb::WorkloadSpec w = spec(std::numeric_limits<double>::infinity());
  w.num_requests = 40;  // more than the target needs
  const auto work = sb::make_workload(w);
  sb::RunConfig rc = config("paged");
  rc.target_tokens = 150;
  rc.concurrency = 3;
  const sb::RunResult r = sb::run_serve_bench(file, work, w, rc);
  ASSERT_FALSE(r.requests.empty());
  EXPECT_LT(r.requests.size(), work.size());  // it stopped releasing at the target
  EXPECT_EQ(r.completed, int32_t(r.requests.size()));
  int64_t asked = 0;
  for (size_t i = 0; i < r.requests.size(); ++i) {
    EXPECT_EQ(r.requests[i].max_tokens, work[i].max_tokens);
    EXPECT_EQ(r.requests[i].output_tokens, work[i].max_tokens) << "request " << i;
    EXPECT_LE(r.requests[i].ttft_s, r.requests[i].e2e_s);
    asked += work[i].max_tokens;
  }
  EXPECT_EQ(r.output_tokens, asked);
  EXPECT_GE(r.output_tokens, rc.target_tokens);
  // The last request released was the one that reached the target: without it, fewer.
  EXPECT_LT(asked - r.requests.back().max_tokens, rc.target_tokens);
  // Never more than `concurrency` requests in the engine, and the bound was reached.
  int32_t most = 0;
  for (const sb::KvSample& s : r.timeline) {
    EXPECT_LE(s.running + s.waiting, rc.concurrency) << "t=" << s.t;
    most = std::max(most, s.running + s.waiting);
  }
  EXPECT_EQ(most, rc.concurrency);
  // A request is released when an earlier one finishes: at any release time, fewer than
  // `concurrency` earlier requests are still unfinished.
  for (size_t i = 0; i < r.requests.size(); ++i) {
    const double at = r.requests[i].arrival_s;
    int32_t unfinished = 0;
    for (size_t k = 0; k < i; ++k)
      if (r.requests[k].arrival_s + r.requests[k].e2e_s > at + 1e-9) ++unfinished;
    EXPECT_LT(unfinished, rc.concurrency) << "request " << i;
  }
}
