// dtype.h conversions against independent oracles:
//   f16:  GCC's _Float16 (exhaustive over f16, 10^8 random f32 bit patterns, every tie);
//   bf16: exact rounding computed in double (random patterns, every tie, exhaustive decode);
//   fp8:  a decode from ldexp and a brute-force nearest search over all finite codes.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "pagedattn/dtype.h"
#include "pagedattn/error.h"

using namespace pagedattn;

namespace {

// splitmix64: a small, fast, well-mixed generator (deterministic seeds keep failures reproducible).
struct SplitMix64 {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

bool is_nan32(uint32_t b) { return (b & 0x7fffffffu) > 0x7f800000u; }
bool is_nan16(uint16_t h) { return (h & 0x7fffu) > 0x7c00u; }
bool is_nan_bf16(uint16_t h) { return (h & 0x7fffu) > 0x7f80u; }

uint16_t oracle_f32_to_f16(float f) { return std::bit_cast<uint16_t>(static_cast<_Float16>(f)); }
float oracle_f16_to_f32(uint16_t h) { return static_cast<float>(std::bit_cast<_Float16>(h)); }

// f32 -> f16 compared with the oracle; NaN inputs only need a NaN of the same sign.
void expect_f16_matches(uint32_t bits) {
  const float f = std::bit_cast<float>(bits);
  const uint16_t got = f32_to_f16(f);
  if (is_nan32(bits)) {
    ASSERT_TRUE(is_nan16(got)) << std::hex << bits;
    ASSERT_EQ(got & 0x8000u, (bits >> 16) & 0x8000u) << std::hex << bits;
    return;
  }
  ASSERT_EQ(got, oracle_f32_to_f16(f)) << "f32 bits 0x" << std::hex << bits << " (" << f << ")";
}

}  // namespace

// ---------------------------------------------------------------- f16

TEST(DTypeF16, DecodeMatchesFloat16Exhaustively) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint32_t got = f32_bits(f16_to_f32(uint16_t(h)));
    const uint32_t want = f32_bits(oracle_f16_to_f32(uint16_t(h)));
    if (is_nan16(uint16_t(h))) {
      ASSERT_TRUE(is_nan32(got)) << std::hex << h;
      ASSERT_EQ(got >> 31, h >> 15) << std::hex << h;
    } else {
      ASSERT_EQ(got, want) << "f16 0x" << std::hex << h;
    }
  }
}

TEST(DTypeF16, RoundTripExhaustive) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t back = f32_to_f16(f16_to_f32(uint16_t(h)));
    if (is_nan16(uint16_t(h))) {
      ASSERT_TRUE(is_nan16(back)) << std::hex << h;
      ASSERT_EQ(back & 0x8000u, h & 0x8000u);
    } else {
      ASSERT_EQ(back, h) << "f16 0x" << std::hex << h;
    }
  }
}

TEST(DTypeF16, EncodeMatchesFloat16OnRandomBitPatterns) {
  SplitMix64 rng{0x5eed0f16};
  for (int64_t i = 0; i < 50'000'000; ++i) {  // two patterns per draw: 10^8 in all
    const uint64_t r = rng.next();
    expect_f16_matches(uint32_t(r));
    expect_f16_matches(uint32_t(r >> 32));
    if (testing::Test::HasFatalFailure()) return;
  }
}

TEST(DTypeF16, EncodeMatchesFloat16AroundEveryTie) {
  // Every midpoint between adjacent f16 magnitudes (exact in f32), and one f32 ulp either side.
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const double lo = f16_to_f32(uint16_t(h)), hi = f16_to_f32(uint16_t(h + 1));
    const float mid = float((lo + hi) / 2);
    ASSERT_EQ(double(mid), (lo + hi) / 2) << "midpoint not exact for " << h;
    const uint32_t mb = f32_bits(mid);
    for (uint32_t sign : {0u, 0x80000000u}) {
      for (uint32_t b : {mb - 1, mb, mb + 1}) expect_f16_matches(sign | b);
      if (testing::Test::HasFatalFailure()) return;
    }
    // The tie itself goes to the even code.
    const uint16_t even = (h & 1) ? uint16_t(h + 1) : uint16_t(h);
    ASSERT_EQ(f32_to_f16(mid), even) << "tie above f16 0x" << std::hex << h;
  }
}

TEST(DTypeF16, BoundaryCases) {
  EXPECT_EQ(f32_to_f16(65504.f), 0x7bffu);                       // max normal
  EXPECT_EQ(f32_to_f16(std::nextafter(65520.f, 0.f)), 0x7bffu);  // just below the tie
  EXPECT_EQ(f32_to_f16(65520.f), 0x7c00u);                       // tie with 2^16: to inf (even)
  EXPECT_EQ(f32_to_f16(-65520.f), 0xfc00u);
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00u);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00u);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00u);
  EXPECT_TRUE(is_nan16(f32_to_f16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(f32_to_f16(0.f), 0x0000u);
  EXPECT_EQ(f32_to_f16(-0.f), 0x8000u);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -14)), 0x0400u);  // min normal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -24)), 0x0001u);  // min subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -25)), 0x0000u);  // tie to even (0)
  EXPECT_EQ(f32_to_f16(std::nextafter(std::ldexp(1.f, -25), 1.f)), 0x0001u);
  EXPECT_EQ(f32_to_f16(std::ldexp(3.f, -25)), 0x0002u);        // 1.5 units: tie to even (2)
  EXPECT_EQ(f32_to_f16(std::ldexp(5.f, -25)), 0x0002u);        // 2.5 units: tie to even (2)
  EXPECT_EQ(f32_to_f16(-std::ldexp(1.f, -26)), 0x8000u);       // underflow keeps the sign
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.5f, -24)), 0x0400u);    // subnormal rounds up to normal
  EXPECT_EQ(f32_to_f16(1.f + std::ldexp(1.f, -11)), 0x3c00u);  // tie, even is 1.0
  EXPECT_EQ(f32_to_f16(1.f + std::ldexp(3.f, -11)), 0x3c02u);  // tie, even is 1 + 2^-9
  EXPECT_EQ(f16_to_f32(0x7bffu), 65504.f);
  EXPECT_EQ(f16_to_f32(0x0001u), std::ldexp(1.f, -24));
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00u)));
}

// ---------------------------------------------------------------- bf16

namespace {

// bf16 value of code h via ldexp (independent of the bit shift in dtype.h); inf for exponent 255.
double bf16_value(uint16_t h) {
  const int sign = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
  double v;
  if (e == 0xff) {
    v = std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    v = std::ldexp(double(m), -133);  // m/128 * 2^-126
  } else {
    v = std::ldexp(1.0 + m / 128.0, e - 127);
  }
  return sign ? -v : v;
}

// Round-to-nearest-even f32 -> bf16 computed with exact double distances. Not for NaN.
uint16_t oracle_f32_to_bf16(float f) {
  const uint32_t b = f32_bits(f);
  const uint16_t lo = uint16_t(b >> 16);  // truncation: |lo| <= |f|
  const double x = std::fabs(double(f));
  const double vlo = std::fabs(bf16_value(lo));
  if (vlo == x) return lo;
  const uint16_t hi = uint16_t(lo + 1);
  // NOTE: past the largest finite bf16, IEEE rounds as if the next value were 2^128.
  const double vhi = ((hi & 0x7fff) == 0x7f80) ? std::ldexp(1.0, 128) : std::fabs(bf16_value(hi));
  const double dlo = x - vlo, dhi = vhi - x;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

void expect_bf16_matches(uint32_t bits) {
  const uint16_t got = f32_to_bf16(bits_f32(bits));
  if (is_nan32(bits)) {
    ASSERT_TRUE(is_nan_bf16(got)) << std::hex << bits;
    ASSERT_EQ(got & 0x8000u, (bits >> 16) & 0x8000u);
    return;
  }
  ASSERT_EQ(got, oracle_f32_to_bf16(bits_f32(bits))) << "f32 bits 0x" << std::hex << bits;
}

}  // namespace

TEST(DTypeBF16, DecodeExhaustive) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = bf16_to_f32(uint16_t(h));
    if (is_nan_bf16(uint16_t(h))) {
      ASSERT_TRUE(std::isnan(got));
      continue;
    }
    ASSERT_EQ(double(got), bf16_value(uint16_t(h))) << std::hex << h;
    ASSERT_EQ(std::signbit(got), bool(h >> 15));
    ASSERT_EQ(f32_to_bf16(got), h) << "round trip of bf16 0x" << std::hex << h;
  }
}

TEST(DTypeBF16, EncodeMatchesOracleOnRandomBitPatterns) {
  SplitMix64 rng{0xbf16bf16};
  for (int64_t i = 0; i < 10'000'000; ++i) {
    const uint64_t r = rng.next();
    expect_bf16_matches(uint32_t(r));
    expect_bf16_matches(uint32_t(r >> 32));
    if (testing::Test::HasFatalFailure()) return;
  }
}

TEST(DTypeBF16, EncodeEveryTieAndItsNeighbours) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint32_t tie = (h << 16) | 0x8000u;  // halfway between bf16 h and h + 1
    if (is_nan32(tie) || (tie & 0x7fffffffu) >= 0x7f800000u) continue;
    for (uint32_t b : {tie - 1, tie, tie + 1}) expect_bf16_matches(b);
    if (testing::Test::HasFatalFailure()) return;
    const uint16_t even = (h & 1) ? uint16_t(h + 1) : uint16_t(h);
    ASSERT_EQ(f32_to_bf16(bits_f32(tie)), even) << std::hex << h;
  }
}

TEST(DTypeBF16, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_bf16(inf), 0x7f80u);
  EXPECT_EQ(f32_to_bf16(-inf), 0xff80u);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80u);  // rounds past max to inf
  EXPECT_EQ(f32_to_bf16(-0.f), 0x8000u);
  EXPECT_TRUE(is_nan_bf16(f32_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  // A signalling NaN whose payload sits only in the low 16 bits must not become infinity.
  EXPECT_TRUE(is_nan_bf16(f32_to_bf16(bits_f32(0x7f800001u))));
  EXPECT_TRUE(is_nan_bf16(f32_to_bf16(bits_f32(0xff800001u))));
}

// ---------------------------------------------------------------- fp8 e4m3

namespace {

// Value of an e4m3fn code from its fields (NaN for S.1111.111).
double fp8_value(uint8_t c) {
  const int sign = c >> 7, e = (c >> 3) & 0xf, m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return sign ? -v : v;
}

// Brute force: the nearest of the 127 finite non-negative codes (ties to the even code), signed;
// saturating at 448; NaN -> NaN.
uint8_t oracle_f32_to_fp8(float f) {
  if (std::isnan(f)) return std::signbit(f) ? 0xff : 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  if (std::isinf(f)) return sign | 0x7e;
  const double x = std::fabs(double(f));
  uint8_t best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7e; ++c) {
    const double d = std::fabs(x - fp8_value(uint8_t(c)));
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = uint8_t(c);
      best_d = d;
    }
  }
  return sign | best;
}

void expect_fp8_matches(float f) {
  const uint8_t got = f32_to_fp8e4m3(f);
  const uint8_t want = oracle_f32_to_fp8(f);
  ASSERT_EQ(int(got), int(want)) << "f = " << f << " (bits 0x" << std::hex << f32_bits(f) << ")";
}

}  // namespace

TEST(DTypeFP8, DecodeAndRoundTripAll256Codes) {
  for (int c = 0; c < 256; ++c) {
    const float got = fp8e4m3_to_f32(uint8_t(c));
    const double want = fp8_value(uint8_t(c));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << c;
      ASSERT_EQ(int(f32_to_fp8e4m3(got)) & 0x7f, 0x7f) << "NaN code " << c << " must stay NaN";
      continue;
    }
    ASSERT_EQ(double(got), want) << "code " << c;
    ASSERT_EQ(std::signbit(got), bool(c & 0x80)) << "code " << c;
    ASSERT_EQ(int(f32_to_fp8e4m3(got)), c) << "round trip of code " << c;
  }
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.f);
  EXPECT_EQ(fp8e4m3_to_f32(0x01), std::ldexp(1.f, -9));
}

TEST(DTypeFP8, EncodeMatchesBruteForceAtEveryTie) {
  for (int c = 0; c < 0x7e; ++c) {
    const double lo = fp8_value(uint8_t(c)), hi = fp8_value(uint8_t(c + 1));
    const float mid = float((lo + hi) / 2);
    ASSERT_EQ(double(mid), (lo + hi) / 2);
    for (float s : {1.f, -1.f}) {
      expect_fp8_matches(s * mid);
      expect_fp8_matches(s * std::nextafter(mid, 0.f));
      expect_fp8_matches(s * std::nextafter(mid, 1e9f));
      if (testing::Test::HasFatalFailure()) return;
    }
    ASSERT_EQ(int(f32_to_fp8e4m3(mid)), (c & 1) ? c + 1 : c) << "tie above code " << c;
  }
}

TEST(DTypeFP8, EncodeMatchesBruteForceOnRandomValues) {
  SplitMix64 rng{0xf8e4};
  for (int i = 0; i < 1'000'000; ++i) {
    const uint64_t r = rng.next();
    // Half raw bit patterns, half magnitudes spread over 2^-12 .. 2^10 (the interesting range).
    expect_fp8_matches(bits_f32(uint32_t(r)));
    const double mag =
        std::ldexp(1.0 + double(r >> 40) / double(1ull << 24), int((r >> 32) % 23) - 12);
    expect_fp8_matches(float((r & 1) ? -mag : mag));
    if (testing::Test::HasFatalFailure()) return;
  }
}

TEST(DTypeFP8, SaturationAndSpecials) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_fp8e4m3(448.f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(-448.f), 0xfe);
  EXPECT_EQ(f32_to_fp8e4m3(449.f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(464.f), 0x7e);  // halfway to 480 (not representable): saturates
  EXPECT_EQ(f32_to_fp8e4m3(470.f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(-479.f), 0xfe);
  EXPECT_EQ(f32_to_fp8e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(inf), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(-inf), 0xfe);
  EXPECT_EQ(f32_to_fp8e4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7f, 0x7f);
  EXPECT_EQ(f32_to_fp8e4m3(-std::numeric_limits<float>::quiet_NaN()), 0xff);
  EXPECT_EQ(f32_to_fp8e4m3(0.f), 0x00);
  EXPECT_EQ(f32_to_fp8e4m3(-0.f), 0x80);
  EXPECT_EQ(f32_to_fp8e4m3(std::ldexp(1.f, -10)), 0x00);  // half the min subnormal: tie to 0
  EXPECT_EQ(f32_to_fp8e4m3(std::nextafter(std::ldexp(1.f, -10), 1.f)), 0x01);
  EXPECT_EQ(f32_to_fp8e4m3(std::ldexp(1.f, -6)), 0x08);  // min normal
}

// ---------------------------------------------------------------- helpers and names

TEST(DType, LoadStoreEveryDType) {
  const float vals[] = {0.f, 1.f, -2.5f, 0.375f, 104.f};  // exact in every dtype
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3}) {
    std::vector<uint8_t> buf(sizeof(vals) / sizeof(float) * dtype_size(t));
    for (int i = 0; i < 5; ++i) store_from_f32(buf.data(), t, i, vals[i]);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(load_as_f32(buf.data(), t, i), vals[i]) << dtype_name(t) << " " << i;
    }
  }
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::fp8_e4m3), 1u);
}

TEST(DType, ParseNames) {
  EXPECT_EQ(parse_dtype("f32"), DType::f32);
  EXPECT_EQ(parse_dtype("float32"), DType::f32);
  EXPECT_EQ(parse_dtype("f16"), DType::f16);
  EXPECT_EQ(parse_dtype("float16"), DType::f16);
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(parse_dtype("fp8"), DType::fp8_e4m3);
  EXPECT_EQ(parse_dtype("fp8_e4m3"), DType::fp8_e4m3);
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3}) {
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  }
}

TEST(DType, ParseRejectsUnknownNames) {
  for (const char* bad : {"", "f64", "F32", "int8", "fp8_e5m2", " f32"}) {
    try {
      parse_dtype(bad);
      ADD_FAILURE() << "parse_dtype accepted '" << bad << "'";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("parse_dtype:", 0), 0u) << msg;
      EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << msg;
    }
  }
}
