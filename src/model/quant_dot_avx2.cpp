// The dot-product kernels compiled for AVX2 + FMA + F16C, chosen at run time only on CPUs that have
// them. They compute exactly what quant_dot_generic.cpp computes (quant_kernels.h): the integer
// lane sums are exact, and each lane's accumulation is one fused multiply-add per block.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "quant_kernels.h"

// NOTE: clang does not take `#pragma GCC target` (the fuzzing build compiles with it): there the
// portable kernels run, as in the CPU attention kernel.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include <immintrin.h>

// NOTE: every header is included above the pragma, so only this file's own functions are compiled
// for the wider ISA and the binary still runs on any x86-64.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace pagedattn::cpu::qk {

namespace {

inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline float reduce(__m256 acc) {
  alignas(32) float l[8];
  _mm256_store_ps(l, acc);
  return hsum8(l);
}

// 8 int32 lanes of a block: lane j = sum of u[i] * s[i] over i in 4j..4j+3 (u unsigned bytes,
// s signed; every pair sum fits in int16 for the value ranges used here).
inline __m256i lanes_us(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// 32 nibbles of 16 bytes in value order: low nibbles (values 0..15), then high ones (16..31).
inline __m256i nibbles(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

inline __m256i act(const ActRows& a, int r, int64_t b) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + r * a.k + b * kBlock));
}

template <int R>
void q4_0_rows(const uint8_t* w, const ActRows& a, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* blk = w + b * 18;
    const float dw = f16_at(blk);
    const __m256i v = _mm256_sub_epi8(nibbles(blk + 2), _mm256_set1_epi8(8));  // -8..7
    const __m256i av = _mm256_sign_epi8(v, v);
    for (int r = 0; r < R; ++r) {
      const __m256i p = lanes_us(av, _mm256_sign_epi8(act(a, r, b), v));
      acc[r] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * a.d[r * a.nb + b]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = reduce(acc[r]);
}

template <int R>
void q4_1_rows(const uint8_t* w, const ActRows& a, float* out) {
  __m256 acc[R];
  float acc_min[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), acc_min[r] = 0.f;
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* blk = w + b * 20;
    const float dw = f16_at(blk), mw = f16_at(blk + 2);
    const __m256i v = nibbles(blk + 4);  // 0..15
    for (int r = 0; r < R; ++r) {
      const __m256i p = lanes_us(v, act(a, r, b));
      acc[r] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * a.d[r * a.nb + b]), acc[r]);
      acc_min[r] += mw * a.s[r * a.nb + b];
    }
  }
  for (int r = 0; r < R; ++r) out[r] = reduce(acc[r]) + acc_min[r];
}

template <int R>
void q8_0_rows(const uint8_t* w, const ActRows& a, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* blk = w + b * 34;
    const float dw = f16_at(blk);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    const __m256i av = _mm256_sign_epi8(v, v);
    for (int r = 0; r < R; ++r) {
      const __m256i p = lanes_us(av, _mm256_sign_epi8(act(a, r, b), v));
      acc[r] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * a.d[r * a.nb + b]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = reduce(acc[r]);
}

template <int R>
void f32_rows(const float* w, const float* x, int64_t ldx, int64_t k, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const __m256 wv = _mm256_loadu_ps(w + i);
    for (int r = 0; r < R; ++r)
      acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * ldx + i), wv, acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float l[8];
    _mm256_store_ps(l, acc[r]);
    for (int64_t t = i; t < k; ++t) l[t % 8] = std::fma(x[r * ldx + t], w[t], l[t % 8]);
    out[r] = hsum8(l);
  }
}

#define PA_ROWS_DISPATCH(name, fn)                                   \
  void name(const uint8_t* w, const ActRows& a, int R, float* out) { \
    switch (R) {                                                     \
      case 1:                                                        \
        return fn<1>(w, a, out);                                     \
      case 2:                                                        \
        return fn<2>(w, a, out);                                     \
      case 3:                                                        \
        return fn<3>(w, a, out);                                     \
      default:                                                       \
        return fn<4>(w, a, out);                                     \
    }                                                                \
  }
PA_ROWS_DISPATCH(q4_0, q4_0_rows)
PA_ROWS_DISPATCH(q4_1, q4_1_rows)
PA_ROWS_DISPATCH(q8_0, q8_0_rows)
#undef PA_ROWS_DISPATCH

void f32(const float* w, const float* x, int64_t ldx, int64_t k, int R, float* out) {
  switch (R) {
    case 1:
      return f32_rows<1>(w, x, ldx, k, out);
    case 2:
      return f32_rows<2>(w, x, ldx, k, out);
    case 3:
      return f32_rows<3>(w, x, ldx, k, out);
    default:
      return f32_rows<4>(w, x, ldx, k, out);
  }
}

}  // namespace

const Kernels* avx2_kernels() {
  static const Kernels k{"avx2", q4_0, q4_1, q8_0, f32};
  return &k;
}

}  // namespace pagedattn::cpu::qk
#pragma GCC pop_options

#else
namespace pagedattn::cpu::qk {
const Kernels* avx2_kernels() { return nullptr; }
}  // namespace pagedattn::cpu::qk
#endif
