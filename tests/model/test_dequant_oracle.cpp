// Dequantisation of Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K against an
// independent implementation, the `gguf` package (llama.cpp's gguf-py, `gguf.quants.dequantize`,
// run by dequant_oracle.py): random blocks (random bytes, f16 scales of random sign and magnitude,
// subnormals and zero included) must dequantise to bit-identical floats. Skips when the package
// cannot be installed (offline).
//
// NOTE: bit-identical, not a tolerance, because every product in these formats is exact in f32: a
// value is an f16 scale (at most 11 significant bits) times a sub-block scale (Q4_K: 6-bit; Q6_K:
// int8, at most 7 significant bits) times a quant (Q8_0: int8, 7 bits; 4-bit nibbles; Q6_K: q - 32
// in [-32, 31], 5 bits): at most 11 + 7 + 5 = 23 significant bits, and f16's range keeps it a
// normal f32 (Q5's 5-bit quants, Q2_K's 4-bit scales and 2-bit quants, Q3_K's 6-bit scales and
// 3-bit quants likewise). So Q8_0, Q4_0, Q5_0, Q3_K and Q6_K are exact in any evaluation order,
// and Q4_1 and Q5_1 (d * q + m), Q2_K, Q4_K and Q5_K (d * sc * q - dmin * mn) round
// once, in one f32 addition of the same two exact operands in both implementations (a fused
// multiply-add rounds the same, its product being exact). Any difference is a layout error, not
// rounding; the Q4_1 case checks that many of its sums do round.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

#include "pagedattn/dtype.h"
#include "pagedattn/gguf.h"
#include "python_oracle.h"

namespace pagedattn {
namespace {

namespace fs = std::filesystem;

struct Case {
  GGMLType type;
  const char* name;            // gguf-py's GGMLQuantizationType name
  std::vector<int> f16_bytes;  // offsets of the block's f16 scales
  int64_t blocks;
};

const Case kCases[] = {
    {GGMLType::q8_0, "Q8_0", {0}, 4096},    {GGMLType::q4_0, "Q4_0", {0}, 4096},
    {GGMLType::q4_1, "Q4_1", {0, 2}, 4096}, {GGMLType::q4_k, "Q4_K", {0, 2}, 1024},
    {GGMLType::q6_k, "Q6_K", {208}, 1024},  {GGMLType::q5_0, "Q5_0", {0}, 4096},
    {GGMLType::q5_1, "Q5_1", {0, 2}, 4096}, {GGMLType::q5_k, "Q5_K", {0, 2}, 1024},
    {GGMLType::q2_k, "Q2_K", {80, 82}, 1024}, {GGMLType::q3_k, "Q3_K", {108}, 1024},
    {GGMLType::iq4_nl, "IQ4_NL", {0}, 4096},
};

// A finite f16 below 32 in magnitude: any sign and mantissa, exponent field 0 (zero and
// subnormals) to 19.
uint16_t random_f16_scale(std::mt19937& rng) {
  const uint32_t sign = rng() & 1, exponent = rng() % 20, mantissa = rng() & 0x3ff;
  return uint16_t(sign << 15 | exponent << 10 | mantissa);
}

// Random bytes, with the f16 scales replaced by random_f16_scale (every other byte pattern of
// these formats, the packed 6-bit and int8 sub-block scales included, is a valid block).
std::vector<uint8_t> random_blocks(const Case& c, std::mt19937& rng) {
  const int64_t bytes = ggml_block_bytes(c.type);
  std::vector<uint8_t> data(size_t(c.blocks * bytes));
  for (uint8_t& b : data) b = uint8_t(rng());
  for (int64_t b = 0; b < c.blocks; ++b)
    for (int off : c.f16_bytes) {
      const uint16_t h = random_f16_scale(rng);
      std::memcpy(&data[size_t(b * bytes + off)], &h, 2);
    }
  return data;
}

// Q4_1 values whose exact d * q + m is not a float, so that the f32 sum had to round (exact in
// double: the operands' bits span fewer than 40 binary places, from 2^-24 to 2^8).
int64_t q4_1_rounded_values(const std::vector<uint8_t>& data, const std::vector<float>& out) {
  int64_t rounded = 0;
  for (size_t b = 0; b < data.size() / 20; ++b) {
    const uint8_t* blk = &data[b * 20];
    uint16_t dh, mh;
    std::memcpy(&dh, blk, 2);
    std::memcpy(&mh, blk + 2, 2);
    for (int j = 0; j < 32; ++j) {
      const int q = j < 16 ? blk[4 + j] & 0xf : blk[4 + j - 16] >> 4;
      const double exact = double(f16_to_f32(dh)) * q + double(f16_to_f32(mh));
      rounded += double(out[b * 32 + size_t(j)]) != exact;
    }
  }
  return rounded;
}

std::string hex(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  std::ostringstream s;
  s << v << " (0x" << std::hex << u << ")";
  return s.str();
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class DequantOracle : public ::testing::TestWithParam<Case> {};

TEST_P(DequantOracle, BitIdenticalToGgufPy) {
  const Case& c = GetParam();
  const int64_t per_block = ggml_block_size(c.type), n = c.blocks * per_block;
  std::mt19937 rng(20240601u + uint32_t(c.type));
  const std::vector<uint8_t> data = random_blocks(c, rng);

  const fs::path dir = fs::temp_directory_path() /
                       ("pa_dequant_" + std::string(c.name) + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "blocks.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
  const fs::path script = fs::path(__FILE__).parent_path() / "dequant_oracle.py";
  const test::PythonRun run = test::run_python_oracle(
      script, {c.name, (dir / "blocks.bin").string(), (dir / "out.f32").string()});
  std::vector<float> want(size_t(n), 0.f);
  if (run.status == test::PythonRun::ok) {
    std::ifstream in(dir / "out.f32", std::ios::binary);
    in.read(reinterpret_cast<char*>(want.data()), std::streamsize(n * 4));
    EXPECT_EQ(in.gcount(), n * 4) << "dequant_oracle.py wrote a short file";
    EXPECT_EQ(in.peek(), EOF) << "dequant_oracle.py wrote more than " << n << " values";
  }
  fs::remove_all(dir);
  if (run.status == test::PythonRun::skip) GTEST_SKIP() << run.reason;
  ASSERT_EQ(run.status, test::PythonRun::ok) << "dequant_oracle.py failed:\n" << run.output;

  std::vector<float> got(static_cast<size_t>(n));
  dequantize_row(c.type, data.data(), got.data(), n);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(&got[size_t(i)], &want[size_t(i)], 4) == 0) continue;
    if (++mismatches <= 8)
      ADD_FAILURE() << c.name << " block " << i / per_block << " value " << i % per_block
                    << ": ours " << hex(got[size_t(i)]) << ", gguf-py " << hex(want[size_t(i)]);
  }
  EXPECT_EQ(mismatches, 0) << "of " << n << " values";
  if (c.type == GGMLType::q4_1) {
    EXPECT_GT(q4_1_rounded_values(data, got), n / 20);  // about 11% with these scales
  }
}

INSTANTIATE_TEST_SUITE_P(GGUF, DequantOracle, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace pagedattn
