// bench_attention_cuda_main: the CUDA attention benchmark with `pagedattn bench attention`'s flags
// (--quick --report --json --csv F --batch 1,8 --context 512,2048 --num-kv-heads 8 --head-dim 128
//  --page-size 16 --kv-dtype bf16,fp8 --num-q-heads 32 --prefill-chunk N --iters N
//  --mode decode|prefill|all).
#include <cstdio>
#include <string>

#include "bench_attention.h"
#include "bench_attention_grid.h"
#include "pagedattn/error.h"

namespace bg = pagedattn::bench::bench_grid;
using pagedattn::bench::BenchAttentionArgs;

int main(int argc, char** argv) {
  BenchAttentionArgs a;
  a.device = "cuda";
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string f = argv[i];
      auto value = [&]() -> std::string {
        PA_CHECK(i + 1 < argc, "bench attention: ", f, " needs a value");
        return argv[++i];
      };
      if (f == "--quick")
        a.quick = true;
      else if (f == "--report")
        a.report = true;
      else if (f == "--json")
        a.json = true;
      else if (f == "--csv")
        a.csv = value();
      else if (f == "--batch")
        a.batch = bg::parse_int_list(value(), f);
      else if (f == "--context")
        a.context = bg::parse_int_list(value(), f);
      else if (f == "--num-kv-heads")
        a.num_kv_heads = bg::parse_int_list(value(), f);
      else if (f == "--head-dim")
        a.head_dim = bg::parse_int_list(value(), f);
      else if (f == "--page-size")
        a.page_size = bg::parse_int_list(value(), f);
      else if (f == "--kv-dtype")
        a.kv_dtype = bg::parse_string_list(value(), f);
      else if (f == "--num-q-heads")
        a.num_q_heads = bg::parse_int(value(), f);
      else if (f == "--prefill-chunk")
        a.prefill_chunk = bg::parse_int(value(), f);
      else if (f == "--iters")
        a.iters = bg::parse_int(value(), f);
      else if (f == "--mode")
        a.mode = value();
      else
        pagedattn::fail("bench attention: unknown flag '", f, "'");
    }
    return pagedattn::bench::bench_attention_cuda(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
