// The portable dot-product kernels: the exact function of the vector ones (quant_kernels.h), with
// std::fma where those use a fused multiply-add.
#include <algorithm>
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

// One x16 format: group-block bytes, header bytes per row (f16 fields), quant bytes per row, and
// whether the quants are nibbles (value i low of byte i, value 16 + i high).
template <int Header, int Quants, bool Nibbles, int Offset>
void group_dot(const uint8_t* group, const ActRows& a, int R, float* out) {
  constexpr int64_t kBytes = kGroup * (Header + Quants);
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < kGroup; ++j) {
      float acc = 0.f, mn = 0.f;
      for (int64_t b = 0; b < a.nb; ++b) {
        const uint8_t* blk = group + b * kBytes;
        const uint8_t* quants = blk + kGroup * Header;
        const int8_t* x = a.q + r * a.k + b * kBlock;
        int isum = 0;
        for (int c = 0; c < Quants / 4; ++c)
          for (int t = 0; t < 4; ++t) {
            const uint8_t byte = quants[4 * kGroup * c + 4 * j + t];
            if (Nibbles) {
              isum += int(byte & 0xf) * int(x[4 * c + t]) + int(byte >> 4) * int(x[16 + 4 * c + t]);
            } else {
              isum += int(int8_t(byte)) * int(x[4 * c + t]);
            }
          }
        isum -= Offset * a.sum[r * a.nb + b];
        acc = std::fma(float(isum), f16_at(blk + 2 * j) * a.d[r * a.nb + b], acc);
        if (Header == 4) mn = std::fma(f16_at(blk + 2 * kGroup + 2 * j), a.s[r * a.nb + b], mn);
      }
      out[r * kGroup + j] = acc + mn;
    }
  }
}

void q4_0(const uint8_t* g, const ActRows& a, int R, float* out) {
  group_dot<2, 16, true, 8>(g, a, R, out);
}
void q4_1(const uint8_t* g, const ActRows& a, int R, float* out) {
  group_dot<4, 16, true, 0>(g, a, R, out);
}
void q8_0(const uint8_t* g, const ActRows& a, int R, float* out) {
  group_dot<2, 32, false, 0>(g, a, R, out);
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

void quantize(const float* x, int64_t nb, int8_t* q, float* d, float* s, int32_t* sum) {
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kBlock;
    float amax = 0.f;
    for (int64_t i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float db = amax / 127.f, id = db > 0.f ? 1.f / db : 0.f;
    int total = 0;
    for (int64_t i = 0; i < kBlock; ++i) {
      const int v = int(std::nearbyint(xb[i] * id));
      q[b * kBlock + i] = int8_t(v);
      total += v;
    }
    d[b] = db;
    s[b] = db * float(total);
    sum[b] = total;
  }
}

}  // namespace

const Kernels& generic_kernels() {
  static const Kernels k{"generic", q4_0, q4_1, q8_0, f32, quantize};
  return k;
}

}  // namespace pagedattn::cpu::qk
