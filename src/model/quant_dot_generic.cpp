// The portable dot-product kernels: the exact function of the vector ones (quant_kernels.h), with
// std::fma where those use a fused multiply-add.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "pagedattn/dtype.h"
#include "pagedattn/gguf.h"
#include "quant_kernels.h"

namespace pagedattn::cpu::qk {

namespace {

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// One x16 format: group-block bytes, header bytes per row (f16 fields), quant bytes per row, and
// whether the quants are nibbles (value i low of byte i, value 16 + i high), with a first chunk of
// fifth bits (Q5: bit i of the row's 4 bytes is bit 4 of value i).
template <int Header, int Quants, bool Nibbles, int Offset, bool Q5 = false, bool Table = false>
void group_dot(const uint8_t* group, const ActRows& a, int R, float* out) {
  constexpr int64_t kBytes = kGroup * (Header + Quants);
  constexpr int kFirst = Q5 ? 1 : 0;  // the first chunk of nibbles
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < kGroup; ++j) {
      float acc = 0.f, mn = 0.f;
      for (int64_t b = 0; b < a.nb; ++b) {
        const uint8_t* blk = group + b * kBytes;
        const uint8_t* quants = blk + kGroup * Header;
        const int8_t* x = a.q + r * a.k + b * kBlock;
        uint32_t qh = 0;
        if (Q5) std::memcpy(&qh, quants + 4 * j, 4);
        int isum = 0;
        for (int c = 0; c < Quants / 4 - kFirst; ++c)
          for (int t = 0; t < 4; ++t) {
            const uint8_t byte = quants[4 * kGroup * (c + kFirst) + 4 * j + t];
            if (Nibbles) {
              const int i = 4 * c + t;  // values i and 16 + i
              int lo = (byte & 0xf) | int((qh >> i) & 1) << 4;
              int hi = (byte >> 4) | int((qh >> (16 + i)) & 1) << 4;
              if (Table) lo = kIq4nl[lo], hi = kIq4nl[hi];
              isum += lo * int(x[i]) + hi * int(x[16 + i]);
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
void q5_0(const uint8_t* g, const ActRows& a, int R, float* out) {
  group_dot<2, 20, true, 16, true>(g, a, R, out);
}
void iq4_nl(const uint8_t* g, const ActRows& a, int R, float* out) {
  group_dot<2, 16, true, 0, false, true>(g, a, R, out);
}
void q5_1(const uint8_t* g, const ActRows& a, int R, float* out) {
  group_dot<4, 20, true, 0, true>(g, a, R, out);
}

// Q4_K (256 values, 144 bytes) and Q5_K (176 bytes: qh[32] between the scales and the nibbles)
// against 8 activation blocks: sub-block j of 32 has a 6-bit scale and min; value = d * sc * q -
// dmin * mn, q the nibble (Q5_K: with bit j of qh[l] as its bit 4).
template <bool Q5>
void qk_row(const uint8_t* w, const ActRows& a, int R, float* out) {
  constexpr int kBytes = Q5 ? 176 : 144, kQs = Q5 ? 48 : 16;
  const int64_t nsb = a.nb / 8;
  for (int r = 0; r < R; ++r) {
    float acc = 0.f;
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const uint8_t* blk = w + sb * kBytes;
      const float d = f16_at(blk), dmin = f16_at(blk + 2);
      const uint8_t* s = blk + 4;
      const uint8_t* qh = blk + 16;
      const uint8_t* qs = blk + kQs;
      for (int j = 0; j < 8; ++j) {
        int sc, mn;
        q4_k_scale_min(s, j, sc, mn);
        const int64_t b = sb * 8 + j;
        const int8_t* x = a.q + r * a.k + b * kBlock;
        const uint8_t* q = qs + 32 * (j / 2);
        int isum = 0;
        for (int l = 0; l < 32; ++l) {
          int v = j % 2 ? q[l] >> 4 : q[l] & 0xf;
          if (Q5) v |= ((qh[l] >> j) & 1) << 4;
          isum += v * int(x[l]);
        }
        acc += (d * float(sc)) * (a.d[r * a.nb + b] * float(isum));
        acc -= (dmin * float(mn)) * a.s[r * a.nb + b];
      }
    }
    out[r] = acc;
  }
}

// Q6_K (256 values, 210 bytes): value v = d * scale[v / 16] * (q6 - 32), q6 from 4 low bits in ql
// and 2 high bits in qh (layout in dequant.cpp).
void q6_k_row(const uint8_t* w, const ActRows& a, int R, float* out) {
  const int64_t nsb = a.nb / 8;
  for (int r = 0; r < R; ++r) {
    float acc = 0.f;
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const uint8_t* blk = w + sb * 210;
      const uint8_t* ql = blk;
      const uint8_t* qh = blk + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
      const float d = f16_at(blk + 208);
      for (int h = 0; h < 2; ++h) {
        for (int t = 0; t < 4; ++t) {  // activation block 4h + t: values 128h + 32t + l
          const int64_t b = sb * 8 + 4 * h + t;
          const int8_t* x = a.q + r * a.k + b * kBlock;
          int isum[2] = {0, 0};
          for (int l = 0; l < 32; ++l) {
            const uint8_t lo = ql[64 * h + l + 32 * (t & 1)];
            const int q4 = t < 2 ? lo & 0xf : lo >> 4;
            const int q2 = (qh[32 * h + l] >> (2 * t)) & 3;
            isum[l / 16] += (int(q4 | (q2 << 4)) - 32) * int(x[l]);
          }
          const float dx = a.d[r * a.nb + b];
          acc += (d * float(sc[8 * h + 2 * t])) * (dx * float(isum[0]));
          acc += (d * float(sc[8 * h + 2 * t + 1])) * (dx * float(isum[1]));
        }
      }
    }
    out[r] = acc;
  }
}

// A K-quant format in the x16 layout: each row of the group put back in its file layout (the f16
// fields at 32 f + 2 j of the group-block, 4-byte chunk c of the rest at 2 * Header * 8 + 64 c +
// 4 j; Q6_K's one field goes last in the file block), then the row code above.
template <int Bytes, int Header, bool HeaderLast,
          void (*Row)(const uint8_t*, const ActRows&, int, float*)>
void kq_group(const uint8_t* group, const ActRows& a, int R, float* out) {
  const int64_t nsb = a.nb / 8;
  constexpr int h0 = HeaderLast ? Bytes - Header : 0, q0 = HeaderLast ? 0 : Header;
  thread_local std::vector<uint8_t> row;
  row.resize(size_t(nsb * Bytes));
  float one[kMaxGroupRows];
  for (int j = 0; j < kGroup; ++j) {
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const uint8_t* g = group + sb * kGroup * Bytes;
      uint8_t* blk = row.data() + sb * Bytes;
      for (int f = 0; f < Header / 2; ++f)
        std::memcpy(blk + h0 + 2 * f, g + 2 * kGroup * f + 2 * j, 2);
      for (int c = 0; c < (Bytes - Header) / 4; ++c)
        std::memcpy(blk + q0 + 4 * c, g + kGroup * Header + 4 * kGroup * c + 4 * j, 4);
    }
    Row(row.data(), a, R, one);
    for (int r = 0; r < R; ++r) out[r * kGroup + j] = one[r];
  }
}
void q4_k(const uint8_t* g, const ActRows& a, int R, float* out) {
  kq_group<144, 4, false, qk_row<false>>(g, a, R, out);
}
void q5_k(const uint8_t* g, const ActRows& a, int R, float* out) {
  kq_group<176, 4, false, qk_row<true>>(g, a, R, out);
}
void q6_k(const uint8_t* g, const ActRows& a, int R, float* out) {
  kq_group<210, 2, true, q6_k_row>(g, a, R, out);
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
  static const Kernels k{"generic", q4_0, q4_1, q8_0, q5_0, q5_1, q4_k, q5_k, q6_k, iq4_nl, f32,
                         quantize};
  return k;
}

}  // namespace pagedattn::cpu::qk
