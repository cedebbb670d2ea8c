// Element types: f32, f16, bf16 and fp8 e4m3 (OCP "e4m3fn": no infinities, max 448).
//
// The conversions are bit-exact, round to nearest even, and usable from host and device code.
//   f32 -> f16   : overflow goes to +-inf (IEEE), subnormals kept, NaN stays NaN.
//   f32 -> bf16  : overflow goes to +-inf, NaN stays (quiet) NaN.
//   f32 -> fp8   : saturating: anything beyond +-448 (infinities included) becomes +-448; NaN -> NaN.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__CUDACC__)
#define PA_HD __host__ __device__ __forceinline__
#else
#define PA_HD inline
#endif

namespace pagedattn {

enum class DType : uint8_t { f32, f16, bf16, fp8_e4m3 };

constexpr size_t dtype_size(DType t) {
  return t == DType::f32 ? 4 : (t == DType::fp8_e4m3 ? 1 : 2);
}
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::fp8_e4m3: return "fp8_e4m3";
  }
  return "?";
}
// Parses "f32", "f16", "bf16", "fp8", "fp8_e4m3" (throws Error naming the text otherwise).
DType parse_dtype(std::string_view name);

PA_HD uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
PA_HD float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// ---- f16 ----
PA_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0x1f) return bits_f32(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    const float mag = float(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return bits_f32(sign | f32_bits(mag));
  }
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}
PA_HD uint16_t f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u);
  if (ax >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf
  if (ax < 0x38800000u) {                         // below 2^-14: f16 subnormal (units of 2^-24)
    const float a = bits_f32(ax) + 0.5f;          // ulp(0.5) = 2^-24: the FPU rounds to even
    return sign | uint16_t(f32_bits(a) - 0x3f000000u);
  }
  ax += 0xc8000fffu + ((ax >> 13) & 1u);  // rebias 127 -> 15 and round half to even at bit 13
  return sign | uint16_t(ax >> 13);
}

// ---- bf16 ----
PA_HD float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }
PA_HD uint16_t f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

// ---- fp8 e4m3 (bias 7, 3 mantissa bits, 0x7f/0xff are NaN, max normal 448) ----
PA_HD float fp8e4m3_to_f32(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80u) << 24;
  const uint32_t e = (b >> 3) & 0xfu;
  const uint32_t m = b & 0x7u;
  if (e == 15 && m == 7) return bits_f32(sign | 0x7fc00000u);
  if (e == 0) return bits_f32(sign | f32_bits(float(m) * 0.001953125f));  // m * 2^-9
  return bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}
PA_HD uint8_t f32_to_fp8e4m3(float f) {
  const uint32_t x = f32_bits(f);
  const uint8_t sign = uint8_t((x >> 24) & 0x80u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7fu;     // NaN
  if (ax >= 0x43e00000u) return sign | 0x7eu;    // >= 448 (and inf): saturate to 448
  if (ax < 0x3c800000u) {                        // below 2^-6: subnormal, units of 2^-9
    const float a = bits_f32(ax) + 16384.0f;     // ulp(16384) = 2^-9: the FPU rounds to even
    return sign | uint8_t(f32_bits(a) - 0x46800000u);
  }
  ax += 0x7ffffu + ((ax >> 20) & 1u) - 0x3c000000u;  // rebias 127 -> 7, round at bit 20
  return sign | uint8_t(ax >> 20);
}

// Load element i of a buffer of dtype t as f32 (no scale applied).
PA_HD float load_as_f32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::fp8_e4m3: return fp8e4m3_to_f32(static_cast<const uint8_t*>(p)[i]);
  }
  return 0.f;
}
// Store v (already divided by any scale) as element i of a buffer of dtype t.
PA_HD void store_from_f32(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = v; break;
    case DType::f16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    case DType::fp8_e4m3: static_cast<uint8_t*>(p)[i] = f32_to_fp8e4m3(v); break;
  }
}

}  // namespace pagedattn
