// The start of a tensor-parallel decode step on one host: every token's embedding row read from
// the rank whose vocabulary slice holds it, straight from that rank's memory (mapped once at load:
// PeerAllReduce::map_peer_buffers), and the first layer's normalised input, in one kernel.
//
// Each rank holds ceil(vocab / world) rows of the embedding. Without the mapping a rank writes
// the rows of its slice and zeros for the others, and an all-reduce sums them (a gather kernel,
// then the all-reduce kernel with its meeting of the ranks); with it there is nothing to sum and
// no meeting: the rows are weights, which no kernel writes. The values are the all-reduce's (the
// one rank's row plus zeros) and so is the norm's arithmetic (peer_all_reduce.cu's thread layout
// and block sum), but for the sign of a zero: -0 + 0 is +0 there.
// Compiled as C++17 (nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "llama_kernels.h"  // RopeRowsGather

namespace pagedattn::cuda {

struct PeerEmbedTable {
  static constexpr int kMaxRanks = 8;
  // Rank r's rows, ids [r * stride, min((r + 1) * stride, vocab)), as this rank sees them.
  //   slice[r] [rows of rank r, hidden] bf16
  const uint16_t* slice[kMaxRanks] = {};
  int32_t world = 0, stride = 0, vocab = 0;
};

// Whether embed_norm_peers takes this width: hidden % 4 == 0 and hidden <= 8192.
bool embed_norm_peers_takes(int32_t hidden);

// x[t] = embed[tokens[t]] as f32 (a token -(r + 1) is chained_ids[r], as embed_gather's), h[t] =
// bf16(x[t] * rsqrt(mean(x[t]^2) + eps) * norm_w), and the tokens' RoPE rows (rope). A token
// outside [0, vocab) gives a row of zeros. Throws Error on a width it does not take or a failed
// launch.
//   tokens [num_tokens];  norm_w [hidden] f32;  x [num_tokens, hidden] f32;  h [.., hidden] bf16
void embed_norm_peers(const PeerEmbedTable& table, const int32_t* tokens,
                      const int32_t* chained_ids, int32_t num_tokens, int32_t hidden,
                      const float* norm_w, float eps, float* x, uint16_t* h,
                      const RopeRowsGather& rope, cudaStream_t stream);

}  // namespace pagedattn::cuda
