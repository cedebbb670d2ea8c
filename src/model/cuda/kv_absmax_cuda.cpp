// LlamaModelCuda::kv_absmax, the calibration pass behind fp8 KV scales on CUDA: the tokens run as
// one fresh sequence through a private bf16 cache, whose pools are read back for the absolute
// maximum of each layer's and KV head's K (after norm and RoPE) and V, as stored (bf16).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "kv_calibration.h"
#include "pagedattn/dtype.h"
#include "pagedattn/error.h"
#include "pagedattn/llama_cuda.h"

namespace pagedattn {

Model::KvAbsMax LlamaModelCuda::kv_absmax(const std::vector<int32_t>& tokens) {
  return kv_absmax(tokens, nullptr);
}

Model::KvAbsMax LlamaModelCuda::kv_absmax(const std::vector<int32_t>& tokens,
                                          const std::function<void()>& while_busy) {
  PA_CHECK(!tokens.empty(), "kv_absmax: tokens are empty");
  const ModelConfig& c = config();
  KvCacheConfig kc = calibration_cache_config(c, tokens.size(), Device::cuda, DType::bf16);
  kc.num_kv_heads = num_local_kv_heads();  // a tensor-parallel rank's own heads
  KvCache cache(kc);
  const ForwardBatch b = calibration_batch(cache, tokens);
  const SeqId seq = b.seqs[0];
  forward_device(b, cache);  // no logit rows
  while (!idle()) {  // (a tensor-parallel rank's pass is not waited for by forward_device)
    if (while_busy)
      while_busy();
    else
      std::this_thread::yield();
  }

  // Pools: [num_pages, num_kv_heads, page_size, head_dim] bf16.
  const int64_t H = kc.num_kv_heads, P = kc.page_size, D = kc.head_dim;
  const size_t pool_elems = size_t(kc.num_pages) * size_t(H * P * D);
  std::vector<uint16_t> k(pool_elems), v(pool_elems);
  const auto table = cache.block_table(seq);
  KvAbsMax m;
  m.k.assign(size_t(c.num_layers) * size_t(H), 0.f);
  m.v.assign(m.k.size(), 0.f);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const PagedKVView view = cache.layer_view(l);
    for (auto [dst, src] : {std::pair{&k, view.k_pages}, std::pair{&v, view.v_pages}}) {
      const cudaError_t e = cudaMemcpy(dst->data(), src, pool_elems * 2, cudaMemcpyDeviceToHost);
      if (e != cudaSuccess)
        fail("LlamaModelCuda::kv_absmax: pool download: ", cudaGetErrorString(e));
    }
    for (int64_t pos = 0; pos < int64_t(tokens.size()); ++pos) {
      const int64_t page = table[size_t(pos / P)], slot = pos % P;
      for (int64_t h = 0; h < H; ++h) {
        const size_t at = size_t(((page * H + h) * P + slot) * D), i = size_t(l * H + h);
        for (int64_t d = 0; d < D; ++d) {
          m.k[i] = std::max(m.k[i], std::fabs(bf16_to_f32(k[at + size_t(d)])));
          m.v[i] = std::max(m.v[i], std::fabs(bf16_to_f32(v[at + size_t(d)])));
        }
      }
    }
  }
  return m;
}

}  // namespace pagedattn
