// The portable dot-product kernels: the exact function of the AVX2 ones (quant_kernels.h), lane by
// lane, with std::fma where those use a fused multiply-add.
#include <cmath>
#include <cstring>

#include "pagedattn/dtype.h"
#include "quant_kernels.h"

namespace pagedattn::cpu::qk {

namespace {

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// One block of 32: acc[j] = fma(sum of w[i] * x[i] over i in 4j..4j+3, dd, acc[j]).
void block_lanes(const int* w, const int8_t* x, float dd, float* acc) {
  for (int j = 0; j < 8; ++j) {
    int isum = 0;
    for (int i = 4 * j; i < 4 * j + 4; ++i) isum += w[i] * int(x[i]);
    acc[j] = std::fma(float(isum), dd, acc[j]);
  }
}

// Q4_0 block (18 bytes): f16 d, 16 bytes of nibbles; value = nibble - 8.
void q4_0(const uint8_t* w, const ActRows& a, int R, float* out) {
  int v[32];
  for (int r = 0; r < R; ++r) {
    float acc[8] = {};
    for (int64_t b = 0; b < a.nb; ++b) {
      const uint8_t* blk = w + b * 18;
      for (int i = 0; i < 16; ++i) {
        v[i] = int(blk[2 + i] & 0xf) - 8;
        v[i + 16] = int(blk[2 + i] >> 4) - 8;
      }
      block_lanes(v, a.q + r * a.k + b * kBlock, f16_at(blk) * a.d[r * a.nb + b], acc);
    }
    out[r] = hsum8(acc);
  }
}

// Q4_1 block (20 bytes): f16 d, f16 m, 16 bytes of nibbles; value = d * nibble + m.
void q4_1(const uint8_t* w, const ActRows& a, int R, float* out) {
  int v[32];
  for (int r = 0; r < R; ++r) {
    float acc[8] = {}, acc_min = 0.f;
    for (int64_t b = 0; b < a.nb; ++b) {
      const uint8_t* blk = w + b * 20;
      for (int i = 0; i < 16; ++i) {
        v[i] = int(blk[4 + i] & 0xf);
        v[i + 16] = int(blk[4 + i] >> 4);
      }
      block_lanes(v, a.q + r * a.k + b * kBlock, f16_at(blk) * a.d[r * a.nb + b], acc);
      acc_min += f16_at(blk + 2) * a.s[r * a.nb + b];
    }
    out[r] = hsum8(acc) + acc_min;
  }
}

// Q8_0 block (34 bytes): f16 d, 32 int8.
void q8_0(const uint8_t* w, const ActRows& a, int R, float* out) {
  int v[32];
  for (int r = 0; r < R; ++r) {
    float acc[8] = {};
    for (int64_t b = 0; b < a.nb; ++b) {
      const uint8_t* blk = w + b * 34;
      for (int i = 0; i < 32; ++i) v[i] = int(int8_t(blk[2 + i]));
      block_lanes(v, a.q + r * a.k + b * kBlock, f16_at(blk) * a.d[r * a.nb + b], acc);
    }
    out[r] = hsum8(acc);
  }
}

void f32(const float* w, const float* x, int64_t ldx, int64_t k, int R, float* out) {
  for (int r = 0; r < R; ++r) {
    const float* xr = x + r * ldx;
    float acc[8] = {};
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
      for (int j = 0; j < 8; ++j) acc[j] = std::fma(xr[i + j], w[i + j], acc[j]);
    for (; i < k; ++i) acc[i % 8] = std::fma(xr[i], w[i], acc[i % 8]);
    out[r] = hsum8(acc);
  }
}

}  // namespace

const Kernels& generic_kernels() {
  static const Kernels k{"generic", q4_0, q4_1, q8_0, f32};
  return k;
}

}  // namespace pagedattn::cpu::qk
