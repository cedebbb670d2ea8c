// `pagedattn bench attention`: options to BenchAttentionArgs, then the CPU or CUDA benchmark.
#include <memory>

#include "bench_attention.h"
#include "cli.h"
#include "pagedattn/error.h"

namespace pagedattn::tools {

using bench::bench_attention_cpu;
using bench::bench_attention_cuda;
using bench::BenchAttentionArgs;

void register_bench_attention(CLI::App& bench) {
  auto args = std::make_shared<BenchAttentionArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "attention", "Time paged attention against a dense-KV kernel and the reference");
  cmd->add_option("--device", args->device, "cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "One JSON object per result line");
  cmd->add_flag("--quick", args->quick, "A tiny grid that runs in seconds");
  cmd->add_flag("--report", args->report,
                "The kernel-report grid: page sizes 8..128, contexts, batches, GQA 1/4/8, KV "
                "dtypes (other flags narrow it)");
  cmd->add_option("--csv", args->csv,
                  "Also write one CSV row per result to this file (scripts/plot-kernels.sh)");
  cmd->add_option("--batch", args->batch, "Sequences per batch, e.g. 1,8")->delimiter(',');
  cmd->add_option("--context", args->context, "Tokens in the cache per sequence, e.g. 2048,8192")
      ->delimiter(',');
  cmd->add_option("--num-kv-heads", args->num_kv_heads, "KV heads, e.g. 8")->delimiter(',');
  cmd->add_option("--head-dim", args->head_dim, "Head dims, e.g. 64,128")->delimiter(',');
  cmd->add_option("--page-size", args->page_size, "Tokens per page, e.g. 16")->delimiter(',');
  cmd->add_option("--kv-dtype", args->kv_dtype, "KV cache dtypes: bf16, f16, f32, fp8")
      ->delimiter(',');
  cmd->add_option("--num-q-heads", args->num_q_heads, "Query heads")->capture_default_str();
  cmd->add_option("--prefill-chunk", args->prefill_chunk,
                  "Prefill: query tokens per sequence, the last ones of the context (0: default)");
  cmd->add_option("--iters", args->iters, "Timed runs per shape (0: default)");
  cmd->add_option("--mode", args->mode, "decode, prefill or all")
      ->check(CLI::IsMember({"decode", "prefill", "all"}))
      ->capture_default_str();
  cmd->callback([args] {
    set_exit_code(args->device == "cuda" ? bench_attention_cuda(*args)
                                         : bench_attention_cpu(*args));
  });
}

}  // namespace pagedattn::tools
