// Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3", 2011),
// the counter-based generator behind sample_plan.h's draws, for the host and CUDA kernels alike
// (plain integer arithmetic: the same bits everywhere).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define PA_PHILOX_FN __host__ __device__ __forceinline__
#else
#define PA_PHILOX_FN inline
#endif

namespace pagedattn::philox {

// A uniform double in [0, 1) with 53 random bits from block `counter` of the stream keyed `seed`.
PA_PHILOX_FN double uniform(uint64_t seed, uint64_t counter) {
  uint32_t c0 = uint32_t(counter), c1 = uint32_t(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0, p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  const uint64_t bits = ((uint64_t(c0) << 32) | c1) >> 11;
  return double(bits) * (1.0 / 9007199254740992.0);  // 2^-53
}

}  // namespace pagedattn::philox
