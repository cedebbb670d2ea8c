// embed_norm_peers: the embedding rows from their ranks' memory and the first norm (peer_embed.h).
#include "block_math.cuh"   // block_sum, load_row_groups, store_normed_row
#include "cuda_common.cuh"  // allow_dependent_launch, wait_for_dependency
#include "pagedattn/dtype.h"  // bf16_to_f32
#include "pagedattn/error.h"
#include "pdl.h"
#include "peer_embed.h"
#include "rope_rows.cuh"  // gather_rope_rows

namespace pagedattn::cuda {

namespace {

// peer_all_reduce.cu's layout: a row of up to kThreads * kVecs * 4 values in registers, thread t
// holding the 4-value groups t, t + kThreads, ...
constexpr int kThreads = 256, kVecs = 8;

// grid (num_tokens), block kThreads: block t owns token t.
__global__ void __launch_bounds__(kThreads)
    embed_norm_peers_kernel(PeerEmbedTable table, const int32_t* __restrict__ tokens,
                            const int32_t* __restrict__ chained_ids, int32_t hidden,
                            const float* __restrict__ norm_w, float eps,
                            float* __restrict__ x,     // [T, hidden]
                            uint16_t* __restrict__ h,  // [T, hidden]
                            RopeRowsGather rope) {
  const int nv = hidden / 4;
  // The norm's weights and the slices' pointers are no kernel's output: read before the wait.
  float4 w[kVecs];
  load_row_groups<kVecs, kThreads>(norm_w, nv, w);
  // NOTE: through shared memory, written with constant indices: an array of a kernel's
  // parameters indexed by a run-time value (the token's rank) is copied to every thread's stack
  // first (peer_all_reduce.cu measured what that costs).
  __shared__ const uint16_t* slice[PeerEmbedTable::kMaxRanks];
  if (threadIdx.x == 0) {
#pragma unroll
    for (int q = 0; q < PeerEmbedTable::kMaxRanks; ++q) slice[q] = table.slice[q];
  }
  __syncthreads();
  wait_for_dependency();  // launched with launch_pdl: the kernels before it have finished
  allow_dependent_launch();
  const int t = blockIdx.x;
  int32_t token = tokens[t];
  if (token < 0) token = chained_ids[-token - 1];  // chained_token(r): the pass before's row r
  const bool known = token >= 0 && token < table.vocab;
  const int owner = known ? token / table.stride : 0;
  const uint2* row = reinterpret_cast<const uint2*>(
      slice[owner] + int64_t(known ? token - owner * table.stride : 0) * hidden);
  float4 v[kVecs];
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {  // 4 bf16 a group: every load in flight at once
    const int i = threadIdx.x + k * kThreads;
    uint2 b = make_uint2(0u, 0u);
    if (known && i < nv) b = row[i];
    v[k] = make_float4(bf16_to_f32(uint16_t(b.x)), bf16_to_f32(uint16_t(b.x >> 16)),
                       bf16_to_f32(uint16_t(b.y)), bf16_to_f32(uint16_t(b.y >> 16)));
  }
  gather_rope_rows(rope, t);  // (its loads wait behind the row's)
  float4* xr = reinterpret_cast<float4*>(x) + int64_t(t) * nv;
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int i = threadIdx.x + k * kThreads;
    if (i >= nv) continue;
    xr[i] = v[k];
    ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
  }
  const float inv = rsqrtf(block_sum(ss) / float(hidden) + eps);
  store_normed_row<kVecs, kThreads>(reinterpret_cast<uint2*>(h) + int64_t(t) * nv, v, w, inv, nv);
}

}  // namespace

bool embed_norm_peers_takes(int32_t hidden) {
  return hidden > 0 && hidden % 4 == 0 && hidden <= kThreads * kVecs * 4;
}

void embed_norm_peers(const PeerEmbedTable& table, const int32_t* tokens,
                      const int32_t* chained_ids, int32_t num_tokens, int32_t hidden,
                      const float* norm_w, float eps, float* x, uint16_t* h,
                      const RopeRowsGather& rope, cudaStream_t stream) {
  PA_CHECK(embed_norm_peers_takes(hidden), "tensor parallel: embed_norm_peers takes a hidden ",
           "size that is a multiple of 4 up to ", kThreads * kVecs * 4, ", got ", hidden);
  PA_CHECK(table.world >= 1 && table.world <= PeerEmbedTable::kMaxRanks && table.stride > 0 &&
               int64_t(table.stride) * table.world >= table.vocab,
           "tensor parallel: embed_norm_peers: a table of ", table.world, " slices of ",
           table.stride, " rows does not cover a vocabulary of ", table.vocab);
  if (num_tokens == 0) return;
  const cudaError_t e =
      launch_pdl(embed_norm_peers_kernel, dim3(unsigned(num_tokens)), dim3(kThreads), 0, stream,
                 table, tokens, chained_ids, hidden, norm_w, eps, x, h, rope);
  PA_CHECK(e == cudaSuccess, "tensor parallel: embed_norm_peers: launch failed: ",
           cudaGetErrorString(e));
}

}  // namespace pagedattn::cuda
