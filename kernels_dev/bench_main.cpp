// bench_attention_cuda_main: the CUDA attention benchmark with `pagedattn bench attention`'s flags
// (--quick --json --csv F --batch 1,8 --context 512,2048 --num-kv-heads 8 --head-dim 128
//  --page-size 16 --kv-dtype bf16,fp8 --num-q-heads 32 --iters N --mode decode|prefill|all).
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "bench_attention.h"
#include "pagedattn/error.h"

using pagedattn::tools::BenchAttentionArgs;

namespace {

template <class T>
std::vector<T> list(const std::string& s) {
  std::vector<T> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if constexpr (std::is_same_v<T, int>) {
      v.push_back(std::stoi(item));
    } else {
      v.push_back(item);
    }
  }
  return v;
}

}  // namespace

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
      else if (f == "--json")
        a.json = true;
      else if (f == "--csv")
        a.csv = value();
      else if (f == "--batch")
        a.batch = list<int>(value());
      else if (f == "--context")
        a.context = list<int>(value());
      else if (f == "--num-kv-heads")
        a.num_kv_heads = list<int>(value());
      else if (f == "--head-dim")
        a.head_dim = list<int>(value());
      else if (f == "--page-size")
        a.page_size = list<int>(value());
      else if (f == "--kv-dtype")
        a.kv_dtype = list<std::string>(value());
      else if (f == "--num-q-heads")
        a.num_q_heads = std::stoi(value());
      else if (f == "--iters")
        a.iters = std::stoi(value());
      else if (f == "--mode")
        a.mode = value();
      else
        pagedattn::fail("bench attention: unknown flag '", f, "'");
    }
    return pagedattn::tools::bench_attention_cuda(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
