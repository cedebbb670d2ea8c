// The CPU matrix products over weights in their file's format (src/model/quant_matmul.h), for
// every supported format on random blocks:
//   - int8 path against a double-precision dot of the dequantised weights with the dequantised
//     activation blocks (the integer arithmetic is exact, so only f32 rounding remains);
//   - exact path against a double-precision dot of the dequantised weights with x;
//   - the AVX2 and portable kernels bit-identical;
//   - a row's result bit-identical whatever the number of rows and its place among them.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "model/quant_matmul.h"
#include "model/quant_pack.h"
#include "pagedattn/dtype.h"
#include "pagedattn/error.h"

using namespace pagedattn;
using cpu::MatmulMode;

namespace {

// A matrix as the model keeps it: Q4_0/Q4_1/Q8_0 in the x16 layout (packed from the file bytes),
// the other formats in place.
struct RandomWeight {
  std::vector<uint8_t> bytes;  // the file layout
  cpu::WeightView view;
  cpu::PackedWeight packed;
};

void put_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

// Random blocks with sane scales: every f16 scale field is overwritten with a small positive value.
RandomWeight random_weight(GGMLType t, int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(0.01f, 0.05f), sym(-1.f, 1.f);
  RandomWeight w;
  const int64_t bs = ggml_block_size(t), bb = ggml_block_bytes(t);
  w.view = {t, rows, cols, cols / bs * bb, nullptr};
  w.bytes.resize(size_t(rows * w.view.row_bytes));
  for (auto& b : w.bytes) b = uint8_t(g());
  const int64_t nblocks = rows * cols / bs;
  for (int64_t b = 0; b < nblocks; ++b) {
    uint8_t* blk = w.bytes.data() + b * bb;
    switch (t) {
      case GGMLType::q4_0:
      case GGMLType::q8_0:
        put_f16(blk, u(g));
        break;
      case GGMLType::q4_1:
        put_f16(blk, u(g)), put_f16(blk + 2, -8 * u(g));
        break;
      case GGMLType::q4_k:
        put_f16(blk, u(g) / 8), put_f16(blk + 2, u(g) / 8);
        break;
      case GGMLType::q6_k:
        put_f16(blk + 208, u(g) / 16);
        break;
      case GGMLType::q5_0:
        put_f16(blk, u(g));
        break;
      case GGMLType::q5_1:
        put_f16(blk, u(g)), put_f16(blk + 2, -16 * u(g));
        break;
      case GGMLType::q5_k:
        put_f16(blk, u(g) / 8), put_f16(blk + 2, u(g) / 8);
        break;
      case GGMLType::iq4_nl:
        put_f16(blk, u(g) / 64);
        break;
      case GGMLType::q2_k:
        put_f16(blk + 80, u(g) / 4), put_f16(blk + 82, u(g) / 4);
        break;
      case GGMLType::q3_k:
        put_f16(blk + 108, u(g) / 16);
        break;
      case GGMLType::f16:
        put_f16(blk, sym(g));
        break;
      case GGMLType::bf16: {
        const uint16_t h = f32_to_bf16(sym(g));
        std::memcpy(blk, &h, 2);
        break;
      }
      case GGMLType::f32: {
        const float v = sym(g);
        std::memcpy(blk, &v, 4);
        break;
      }
    }
  }
  w.view.data = w.bytes.data();
  w.packed = cpu::pack_x16(w.view);
  w.view = w.packed.view;
  return w;
}

std::vector<float> random_x(int64_t m, int64_t k, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> x(size_t(m * k));
  for (auto& v : x) v = n(g);
  return x;
}

std::vector<float> run(const float* x, int64_t m, const cpu::WeightView& w, MatmulMode mode) {
  cpu::MatmulInput in;
  in.set(x, m, w.cols);
  std::vector<float> y(size_t(m * w.rows));
  cpu::matmul(in, w, y.data(), mode);
  return y;
}

class QuantMatmul : public ::testing::TestWithParam<GGMLType> {
 protected:
  void TearDown() override { cpu::set_matmul_isa(""); }
};

TEST_P(QuantMatmul, MatchesDoublePrecisionOracle) {
  const GGMLType t = GetParam();
  const int64_t m = 5, n = 37, k = 512;
  const RandomWeight w = random_weight(t, n, k, 1);
  const std::vector<float> x = random_x(m, k, 2);
  std::vector<float> wf(size_t(n * k));
  for (int64_t c = 0; c < n; ++c) cpu::weight_row(w.view, c, wf.data() + c * k);
  // The activations as the int8 path sees them.
  cpu::MatmulInput in;
  in.set(x.data(), m, k);
  const int8_t* q = in.q();
  for (MatmulMode mode : {MatmulMode::fast, MatmulMode::exact}) {
    const std::vector<float> y = run(x.data(), m, w.view, mode);
    // NOTE: Q2_K and Q3_K have no int8 kernel: f32 activations in both modes.
    const bool int8 = mode == MatmulMode::fast && cpu::x16_packable(t);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        double want = 0, mag = 0;
        for (int64_t i = 0; i < k; ++i) {
          const double xv =
              int8 ? double(in.d()[r * k / 32 + i / 32]) * q[r * k + i] : x[r * k + i];
          want += double(wf[c * k + i]) * xv;
          mag += std::abs(double(wf[c * k + i]) * xv);
        }
        ASSERT_NEAR(y[r * n + c], want, 1e-5 * mag + 1e-6)
            << ggml_type_name(uint32_t(t)) << (int8 ? " int8" : " exact") << " row " << r << " col "
            << c;
      }
  }
}

TEST_P(QuantMatmul, PortableKernelsComputeTheSameBits) {
  const GGMLType t = GetParam();
  const int64_t m = 7, n = 43, k = 256 + 256;  // K-quant rows in tiles of 8 and a rest of 3
  const RandomWeight w = random_weight(t, n, k, 3);
  const std::vector<float> x = random_x(m, k, 4);
  const std::vector<std::string> isas = cpu::matmul_isas();
  ASSERT_EQ(isas.back(), "generic");
  for (MatmulMode mode : {MatmulMode::fast, MatmulMode::exact}) {
    cpu::set_matmul_isa("generic");
    ASSERT_STREQ(cpu::matmul_isa(), "generic");
    const std::vector<float> portable = run(x.data(), m, w.view, mode);
    for (const std::string& isa : isas) {
      cpu::set_matmul_isa(isa);
      ASSERT_EQ(cpu::matmul_isa(), isa);
      const std::vector<float> wide = run(x.data(), m, w.view, mode);
      EXPECT_EQ(std::memcmp(wide.data(), portable.data(), wide.size() * 4), 0)
          << ggml_type_name(uint32_t(t)) << ": " << isa << " and generic kernels differ";
    }
  }
}

TEST_P(QuantMatmul, RowResultIndependentOfBatch) {
  const GGMLType t = GetParam();
  const int64_t n = 33, k = 256;
  const RandomWeight w = random_weight(t, n, k, 5);
  const std::vector<float> x = random_x(11, k, 6);
  for (MatmulMode mode : {MatmulMode::fast, MatmulMode::exact}) {
    const std::vector<float> all = run(x.data(), 11, w.view, mode);
    for (int64_t r = 0; r < 11; ++r) {
      const std::vector<float> one = run(x.data() + r * k, 1, w.view, mode);
      EXPECT_EQ(std::memcmp(one.data(), all.data() + r * n, size_t(n) * 4), 0) << "row " << r;
    }
    // The same rows at other offsets of other batch sizes.
    const std::vector<float> tail = run(x.data() + 3 * k, 6, w.view, mode);
    EXPECT_EQ(std::memcmp(tail.data(), all.data() + 3 * n, size_t(6 * n) * 4), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantMatmul,
                         ::testing::Values(GGMLType::q4_0, GGMLType::q4_1, GGMLType::q8_0,
                                           GGMLType::q5_0, GGMLType::q5_1, GGMLType::q2_k,
                                           GGMLType::q3_k, GGMLType::q4_k, GGMLType::q5_k,
                                           GGMLType::q6_k, GGMLType::iq4_nl, GGMLType::f16,
                                           GGMLType::bf16, GGMLType::f32),
                         [](const auto& p) { return ggml_type_name(uint32_t(p.param)); });

TEST(QuantMatmulErrors, ShapeMismatchNamesTheOperation) {
  const RandomWeight w = random_weight(GGMLType::q4_1, 4, 64, 7);
  std::vector<float> x(96), y(8);
  cpu::MatmulInput in;
  in.set(x.data(), 1, 96);
  try {
    cpu::matmul(in, w.view, y.data());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("matmul"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("96"), std::string::npos) << e.what();
  }
}

TEST(QuantMatmulErrors, UnpackedBlockMatrixIsRefusedByName) {
  RandomWeight w = random_weight(GGMLType::q4_0, 8, 64, 8);
  cpu::WeightView file = w.view;
  file.data = w.bytes.data();
  file.x16 = false;
  std::vector<float> x(64, 1.f), y(8);
  cpu::MatmulInput in;
  in.set(x.data(), 1, 64);
  try {
    cpu::matmul(in, file, y.data());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x16"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Q4_0"), std::string::npos) << e.what();
  }
  // The exact path dequantises rows, so it reads the file layout as it is.
  cpu::matmul(in, file, y.data(), MatmulMode::exact);
}

// Every row of a packed matrix reads back as the file's bytes, padded groups included.
TEST(QuantPack, RowsReadBackAsTheFileBytes) {
  for (GGMLType t : {GGMLType::q4_0, GGMLType::q4_1, GGMLType::q5_0, GGMLType::q5_1, GGMLType::q8_0,
                     GGMLType::q4_k, GGMLType::q5_k, GGMLType::q6_k, GGMLType::iq4_nl})
    for (int64_t rows : {1, 7, 8, 9, 15, 16, 17, 37}) {
      const RandomWeight w = random_weight(t, rows, ggml_block_size(t) == 256 ? 512 : 96,
                                           9 + uint64_t(rows));
      ASSERT_TRUE(w.view.x16);
      std::vector<uint8_t> row(size_t(w.view.row_bytes));
      for (int64_t r = 0; r < rows; ++r) {
        cpu::x16_file_row(w.view, r, row.data());
        ASSERT_EQ(std::memcmp(row.data(), w.bytes.data() + r * w.view.row_bytes, row.size()), 0)
            << ggml_type_name(uint32_t(t)) << " rows " << rows << " row " << r;
      }
    }
}

// Packing from a file mapping hands its pages back as it goes: the copy equals one packed from
// memory, and the file's bytes read the same afterwards (the pages come back from the file).
TEST(QuantPack, ReleasingMappedPagesKeepsTheFileIntact) {
  const int64_t rows = 4096, cols = 256;
  const RandomWeight w = random_weight(GGMLType::q4_1, rows, cols, 10);
  char path[] = "/tmp/pagedattn_pack_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, w.bytes.data(), w.bytes.size()), ssize_t(w.bytes.size()));
  void* m = mmap(nullptr, w.bytes.size(), PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  unlink(path);
  ASSERT_NE(m, MAP_FAILED);
  cpu::WeightView file = w.view;
  file.data = static_cast<const uint8_t*>(m);
  file.x16 = false;
  const cpu::PackedWeight p = cpu::pack_x16(file, /*release_source=*/true);
  EXPECT_EQ(std::memcmp(p.view.data, w.view.data, w.bytes.size()), 0);
  EXPECT_EQ(std::memcmp(m, w.bytes.data(), w.bytes.size()), 0);
  munmap(m, w.bytes.size());
}

// The activation blocks are the same bits on every ISA, halves rounded to even: with max|x| = 127
// the scale is 1, so x = 2.5 gives 2, -3.5 gives -4, 0.5 gives 0.
TEST(QuantMatmulInput, BlocksAreTheSameOnEveryIsaHalvesToEven) {
  std::vector<float> x(64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 32) - 16) + 0.5f;
  x[0] = 127.f, x[32] = -127.f;
  for (const std::string& isa : cpu::matmul_isas()) {
    cpu::set_matmul_isa(isa);
    cpu::MatmulInput in;
    in.set(x.data(), 1, 64);
    const int8_t* q = in.q();
    for (int b = 0; b < 2; ++b) {
      EXPECT_EQ(in.d()[b], 1.f) << isa;
      int sum = 0;
      for (int i = 0; i < 32; ++i) {
        const float v = x[size_t(32 * b + i)];
        EXPECT_EQ(q[32 * b + i], int8_t(std::nearbyint(v))) << isa << " value " << v;
        sum += q[32 * b + i];
      }
      EXPECT_EQ(in.sum()[b], sum) << isa;
      EXPECT_EQ(in.s()[b], float(sum)) << isa;
    }
    EXPECT_EQ(q[1], -14) << isa;  // -14.5 -> -14
    EXPECT_EQ(q[3], -12) << isa;  // -12.5 -> -12
  }
  cpu::set_matmul_isa("");
}

}  // namespace
