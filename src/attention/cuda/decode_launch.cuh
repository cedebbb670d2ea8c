// How both decode kernels are launched: one CTA per (item, KV head, tile of query heads), with the
// kernel's dynamic shared memory limit raised once per kernel instance.
#pragma once

#include <algorithm>

#include "cuda_common.cuh"
#include "kernels.h"
#include "pdl.h"

namespace pagedattn::cuda {

// Raises Kernel's dynamic shared memory limit to SMEM, once per instance and device.
template <auto Kernel, size_t SMEM>
void raise_smem_limit() {
  static std::atomic<uint64_t> done{0};
  set_smem_limit_on_this_device(Kernel, int(SMEM), done,
                                "paged_attention_cuda: decode shared memory attribute");
}

// Grid: x = p.num_decode_items, y = num_kv_heads x head tiles of `heads` query heads.
template <auto Kernel, int THREADS, size_t SMEM>
void launch_decode_kernel(const AttentionParams& p, int heads, cudaStream_t s) {
  raise_smem_limit<Kernel, SMEM>();
  AttentionParams pp = p;
  pp.head_tiles = (p.group + heads - 1) / heads;
  const dim3 grid(unsigned(p.num_decode_items), unsigned(p.num_kv_heads * pp.head_tiles));
  // A programmatic dependent (pdl.h): its CTAs may be scheduled while the kernel before it ends
  // and wait for it before reading q and the pages.
  check_cuda(launch_pdl(Kernel, grid, dim3(THREADS), SMEM, s, pp),
             "paged_attention_cuda: decode kernel launch");
}

// CTAs of one kernel instance resident at once on an SM (cached per instance; at least 1).
template <auto Kernel, int THREADS, size_t SMEM>
int resident_ctas() {
  static const int n = [] {
    raise_smem_limit<Kernel, SMEM>();
    int blocks = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, Kernel, THREADS, SMEM),
               "paged_attention_cuda: decode occupancy");
    return std::max(blocks, 1);
  }();
  return n;
}

}  // namespace pagedattn::cuda
