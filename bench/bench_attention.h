// `pagedattn bench attention`: shared arguments of the CPU and CUDA attention benchmarks.
#pragma once

#include <string>
#include <vector>

namespace pagedattn::bench {

struct BenchAttentionArgs {
  std::string device = "cpu";         // cpu | cuda
  bool json = false;                  // one JSON object per result line
  bool quick = false;                 // a small grid (make demo, CI smoke runs)
  bool report = false;                // the kernel-report grid (bench_attention_grid.h)
  std::string csv;                    // also write one CSV row per result here ("" = no)
  std::vector<int> batch;             // empty: the backend's default grid
  std::vector<int> context;
  std::vector<int> num_kv_heads;
  std::vector<int> head_dim;
  std::vector<int> page_size;
  std::vector<std::string> kv_dtype;  // bf16, f16, f32, fp8
  int num_q_heads = 32;
  int prefill_chunk = 0;              // prefill: query tokens per sequence (0: backend default)
  int iters = 0;                      // 0: backend default
  std::string mode = "all";           // decode | prefill | all
};

int bench_attention_cpu(const BenchAttentionArgs& args);
// Implemented in bench_attention_cuda.cu; builds without CUDA get a version that throws Error.
int bench_attention_cuda(const BenchAttentionArgs& args);

}  // namespace pagedattn::bench
