// Dequantisation of ggml block formats to f32.
//
// Block layouts (all little-endian, f16 scales):
//   Q8_0 (32 values, 34 bytes): d, int8 q[32]                      x = d * q
//   Q4_0 (32 values, 18 bytes): d, u8 qs[16]                       x = d * (nibble - 8)
//   Q4_1 (32 values, 20 bytes): d, m, u8 qs[16]                    x = d * nibble + m
//        value j < 16 is the low nibble of qs[j], value j + 16 its high nibble.
//   Q4_K (256 values, 144 bytes): d, dmin, u8 scales[12], u8 qs[128]
//        8 sub-blocks of 32 with 6-bit scale sc and min mn: x = d * sc * nibble - dmin * mn.
//        Sub-blocks 2c and 2c+1 share qs[32c .. 32c+32): low nibbles, then high nibbles.
//   Q6_K (256 values, 210 bytes): u8 ql[128], u8 qh[64], int8 scales[16], d
//        6-bit q = 4 low bits from ql | 2 high bits from qh, x = d * scale[v / 16] * (q - 32).
//   Q5_0 (32 values, 22 bytes): d, u32 qh, u8 qs[16]              x = d * (q5 - 16)
//   Q5_1 (32 values, 24 bytes): d, m, u32 qh, u8 qs[16]           x = d * q5 + m
//        q5 of value j: its nibble as in Q4_0 | bit j of qh as bit 4.
//   Q5_K (256 values, 176 bytes): d, dmin, u8 scales[12], u8 qh[32], u8 qs[128]
//        Q4_K's sub-blocks, scales and nibbles, with bit s of qh[l] as bit 4 of value l of
//        sub-block s: x = d * sc * q5 - dmin * mn.
//   IQ4_NL (32 values, 18 bytes): d, u8 qs[16] as Q4_0's        x = d * kIq4nl[nibble]
//   Q2_K (256 values, 84 bytes): u8 scales[16], u8 qs[64], d, dmin
//        value v = 128 h + 32 j + l (h < 2, j < 4, l < 32): q = (qs[32 h + l] >> 2 j) & 3, in the
//        16-value sub-block k = 8 h + 2 j + l / 16 of scale scales[k] & 15 and min scales[k] >> 4:
//        x = d * sc * q - dmin * mn.
//   Q3_K (256 values, 110 bytes): u8 hmask[32], u8 qs[64], u8 scales[12], d
//        the same positions, q = ((qs[32 h + l] >> 2 j) & 3) - (bit 4 h + j of hmask[l] ? 0 : 4),
//        6-bit scales: low 4 bits in the nibbles of bytes 0..7 (k < 8 low, k >= 8 high nibble of
//        byte k - 8), high 2 bits in bits 2 (k / 4) of byte 8 + k % 4: x = d * (sc - 32) * q.
#include <cstring>

#include "pagedattn/dtype.h"
#include "pagedattn/error.h"
#include "pagedattn/gguf.h"
#include "quant_kernels.h"

namespace pagedattn {

namespace {

float read_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// src: [n / 32 blocks of 34 bytes]
void dequant_q8_0(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 34, dst += 32) {
    const float d = read_f16(src);
    const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
    for (int j = 0; j < 32; ++j) dst[j] = d * float(q[j]);
  }
}

// src: [n / 32 blocks of 18 bytes]
void dequant_q4_0(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 18, dst += 32) {
    const float d = read_f16(src);
    const uint8_t* qs = src + 2;
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * float(int(qs[j] & 0xf) - 8);
      dst[j + 16] = d * float(int(qs[j] >> 4) - 8);
    }
  }
}

// src: [n / 32 blocks of 20 bytes]
void dequant_q4_1(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 20, dst += 32) {
    const float d = read_f16(src);
    const float m = read_f16(src + 2);
    const uint8_t* qs = src + 4;
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * float(qs[j] & 0xf) + m;
      dst[j + 16] = d * float(qs[j] >> 4) + m;
    }
  }
}

// src: [n / 256 blocks of 144 (Q4_K) or 176 (Q5_K: qh[32] between the scales and the nibbles)
// bytes]
template <bool Q5>
void dequant_q45_k(const uint8_t* src, float* dst, int64_t n) {
  constexpr int kBytes = Q5 ? 176 : 144, kQs = Q5 ? 48 : 16;
  for (int64_t b = 0; b < n / 256; ++b, src += kBytes, dst += 256) {
    const float d = read_f16(src);
    const float dmin = read_f16(src + 2);
    const uint8_t* scales = src + 4;
    const uint8_t* qh = src + 16;
    const uint8_t* qs = src + kQs;
    for (int c = 0; c < 4; ++c) {
      int sc0, mn0, sc1, mn1;
      cpu::qk::q4_k_scale_min(scales, 2 * c, sc0, mn0);
      cpu::qk::q4_k_scale_min(scales, 2 * c + 1, sc1, mn1);
      const float d0 = d * float(sc0), m0 = dmin * float(mn0);
      const float d1 = d * float(sc1), m1 = dmin * float(mn1);
      const uint8_t* q = qs + 32 * c;
      float* y = dst + 64 * c;
      for (int l = 0; l < 32; ++l) {
        int q0 = q[l] & 0xf, q1 = q[l] >> 4;
        if (Q5) {
          q0 |= ((qh[l] >> (2 * c)) & 1) << 4;
          q1 |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
        }
        y[l] = d0 * float(q0) - m0;
        y[l + 32] = d1 * float(q1) - m1;
      }
    }
  }
}

// src: [n / 256 blocks of 210 bytes]
void dequant_q6_k(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 256; ++b, src += 210, dst += 256) {
    const uint8_t* ql = src;
    const uint8_t* qh = src + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(src + 192);
    const float d = read_f16(src + 208);
    // Each half of 128 values uses ql[64h .. 64h+64), qh[32h .. 32h+32), scales[8h .. 8h+8).
    for (int h = 0; h < 2; ++h) {
      const uint8_t* l4 = ql + 64 * h;
      const uint8_t* h2 = qh + 32 * h;
      const int8_t* s = sc + 8 * h;
      float* y = dst + 128 * h;
      for (int l = 0; l < 32; ++l) {
        const int g = l / 16;
        const int q0 = int((l4[l] & 0xf) | ((h2[l] & 3) << 4)) - 32;
        const int q1 = int((l4[l + 32] & 0xf) | (((h2[l] >> 2) & 3) << 4)) - 32;
        const int q2 = int((l4[l] >> 4) | (((h2[l] >> 4) & 3) << 4)) - 32;
        const int q3 = int((l4[l + 32] >> 4) | (((h2[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * float(s[g]) * float(q0);
        y[l + 32] = d * float(s[g + 2]) * float(q1);
        y[l + 64] = d * float(s[g + 4]) * float(q2);
        y[l + 96] = d * float(s[g + 6]) * float(q3);
      }
    }
  }
}

// src: [n / 32 blocks of 22 (Q5_0) or 24 (Q5_1) bytes]
template <bool Q5_1>
void dequant_q5(const uint8_t* src, float* dst, int64_t n) {
  constexpr int kBytes = Q5_1 ? 24 : 22, kHigh = Q5_1 ? 4 : 2;
  for (int64_t b = 0; b < n / 32; ++b, src += kBytes, dst += 32) {
    const float d = read_f16(src);
    const float m = Q5_1 ? read_f16(src + 2) : 0.f;
    uint32_t qh;
    std::memcpy(&qh, src + kHigh, 4);
    const uint8_t* qs = src + kHigh + 4;
    for (int j = 0; j < 16; ++j) {
      const int q0 = (qs[j] & 0xf) | int((qh >> j) & 1) << 4;
      const int q1 = (qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
      if constexpr (Q5_1) {
        dst[j] = d * float(q0) + m;
        dst[j + 16] = d * float(q1) + m;
      } else {
        dst[j] = d * float(q0 - 16);
        dst[j + 16] = d * float(q1 - 16);
      }
    }
  }
}

// src: [n / 32 blocks of 18 bytes]
void dequant_iq4_nl(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 18, dst += 32) {
    const float d = read_f16(src);
    const uint8_t* qs = src + 2;
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * float(kIq4nl[qs[j] & 0xf]);
      dst[j + 16] = d * float(kIq4nl[qs[j] >> 4]);
    }
  }
}

// src: [n / 256 blocks of 84 bytes]
void dequant_q2_k(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 256; ++b, src += 84, dst += 256) {
    const uint8_t* scales = src;
    const uint8_t* qs = src + 16;
    const float d = read_f16(src + 80), dmin = read_f16(src + 82);
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < 32; ++l) {
          const int k = 8 * h + 2 * j + l / 16;
          const float dl = d * float(scales[k] & 15), ml = dmin * float(scales[k] >> 4);
          dst[128 * h + 32 * j + l] = dl * float((qs[32 * h + l] >> (2 * j)) & 3) - ml;
        }
  }
}

// src: [n / 256 blocks of 110 bytes]
void dequant_q3_k(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 256; ++b, src += 110, dst += 256) {
    const uint8_t* hmask = src;
    const uint8_t* qs = src + 32;
    const uint8_t* s = src + 96;
    const float d = read_f16(src + 108);
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < 32; ++l) {
          const int k = 8 * h + 2 * j + l / 16;
          const int lo = k < 8 ? s[k] & 15 : s[k - 8] >> 4, hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
          const int q = ((qs[32 * h + l] >> (2 * j)) & 3) - ((hmask[l] >> (4 * h + j)) & 1 ? 0 : 4);
          dst[128 * h + 32 * j + l] = d * float((lo | hi << 4) - 32) * float(q);
        }
  }
}

}  // namespace

void dequantize_row(GGMLType t, const void* src_v, float* dst, int64_t n) {
  const uint8_t* src = static_cast<const uint8_t*>(src_v);
  PA_CHECK(n >= 0 && n % ggml_block_size(t) == 0, "dequantize_row: n = ", n,
           " is not a multiple of the ", ggml_type_name(uint32_t(t)), " block size");
  switch (t) {
    case GGMLType::f32: std::memcpy(dst, src, size_t(n) * 4); return;
    case GGMLType::f16:
      for (int64_t i = 0; i < n; ++i) dst[i] = read_f16(src + 2 * i);
      return;
    case GGMLType::bf16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return;
    case GGMLType::q8_0: dequant_q8_0(src, dst, n); return;
    case GGMLType::q4_0: dequant_q4_0(src, dst, n); return;
    case GGMLType::q4_1: dequant_q4_1(src, dst, n); return;
    case GGMLType::q4_k: dequant_q45_k<false>(src, dst, n); return;
    case GGMLType::q6_k: dequant_q6_k(src, dst, n); return;
    case GGMLType::q5_0: dequant_q5<false>(src, dst, n); return;
    case GGMLType::q5_1: dequant_q5<true>(src, dst, n); return;
    case GGMLType::q5_k: dequant_q45_k<true>(src, dst, n); return;
    case GGMLType::q2_k: dequant_q2_k(src, dst, n); return;
    case GGMLType::iq4_nl: dequant_iq4_nl(src, dst, n); return;
    case GGMLType::q3_k: dequant_q3_k(src, dst, n); return;
  }
  fail("dequantize_row: unsupported type ", ggml_type_name(uint32_t(t)));
}

}  // namespace pagedattn
