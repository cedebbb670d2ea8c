// GGUF reader: every metadata value type, alignment, each quantisation format against values
// computed here from the block layouts, and malformed files (truncated at every byte, bad magic,
// absurd counts, unknown types, tensors past the end) raising Error.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "pagedattn/error.h"
#include "pagedattn/gguf.h"
#include "test_gguf_writer.h"

namespace pagedattn {
namespace {

using testing::GGUFWriter;
using testing::put_f16;

template <class T>
std::vector<uint8_t> enc(T v) {
  std::vector<uint8_t> b;
  GGUFWriter::put<T>(b, v);
  return b;
}

TEST(GGUF, EveryValueTypeRoundTrips) {
  for (uint32_t version : {2u, 3u}) {
    GGUFWriter w(version);
    w.kv("u8", 0, uint8_t(250));
    w.kv("i8", 1, int8_t(-100));
    w.kv("u16", 2, uint16_t(65000));
    w.kv("i16", 3, int16_t(-30000));
    w.kv("u32", 4, uint32_t(4000000000u));
    w.kv("i32", 5, int32_t(-2000000000));
    w.kv("f32", 6, 1.5f);
    w.kv_bool("b", true);
    w.kv_str("s", "héllo");
    w.kv("u64", 10, uint64_t(1) << 40);
    w.kv("i64", 11, int64_t(-1) << 40);
    w.kv("f64", 12, 2.25);
    w.kv_str_array("strs", {"a", "", "ccc"});
    w.kv_i32_array("ints", {1, -2, 3});
    {  // array of f32, array of bool, and an array of arrays of u16
      std::vector<uint8_t> b = enc<uint32_t>(6);
      GGUFWriter::put<uint64_t>(b, 2);
      GGUFWriter::put<float>(b, 0.5f);
      GGUFWriter::put<float>(b, -4.f);
      w.kv_raw("floats", 9, b);
      b = enc<uint32_t>(7);
      GGUFWriter::put<uint64_t>(b, 2);
      b.push_back(1);
      b.push_back(0);
      w.kv_raw("bools", 9, b);
      b = enc<uint32_t>(9);
      GGUFWriter::put<uint64_t>(b, 2);
      for (int k = 0; k < 2; ++k) {
        GGUFWriter::put<uint32_t>(b, 2);
        GGUFWriter::put<uint64_t>(b, 1);
        GGUFWriter::put<uint16_t>(b, uint16_t(7 + k));
      }
      w.kv_raw("nested", 9, b);
    }
    const GGUFFile f = GGUFFile::from_bytes(w.bytes(), "mem.gguf");
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.get_int("u8"), 250);
    EXPECT_EQ(f.get_int("i8"), -100);
    EXPECT_EQ(f.get_int("u16"), 65000);
    EXPECT_EQ(f.get_int("i16"), -30000);
    EXPECT_EQ(f.get_int("u32"), 4000000000LL);
    EXPECT_EQ(f.get_int("i32"), -2000000000);
    EXPECT_EQ(f.get_float("f32"), 1.5);
    EXPECT_TRUE(f.get_bool("b"));
    EXPECT_EQ(f.get_string("s"), "héllo");
    EXPECT_EQ(f.get_int("u64"), int64_t(1) << 40);
    EXPECT_EQ(f.get_int("i64"), -(int64_t(1) << 40));
    EXPECT_EQ(f.get_float("f64"), 2.25);
    EXPECT_EQ(f.get("strs").strings, (std::vector<std::string>{"a", "", "ccc"}));
    EXPECT_EQ(f.get("ints").ints, (std::vector<int64_t>{1, -2, 3}));
    EXPECT_EQ(f.get("floats").floats, (std::vector<double>{0.5, -4.0}));
    EXPECT_EQ(f.get("bools").ints, (std::vector<int64_t>{1, 0}));
    ASSERT_EQ(f.get("nested").items.size(), 2u);
    EXPECT_EQ(f.get("nested").items[1].ints, (std::vector<int64_t>{8}));
    EXPECT_EQ(f.get("nested").array_size(), 2u);
    // Defaults and type errors.
    EXPECT_EQ(f.get_int("absent", 42), 42);
    EXPECT_THROW(f.get_string("u8"), Error);
    EXPECT_THROW(f.get_int("s"), Error);
    try {
      f.get_int("missing.key");
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("mem.gguf"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("missing.key"), std::string::npos);
    }
  }
}

TEST(GGUF, AlignmentAndTensorInfos) {
  for (uint32_t align : {32u, 64u, 256u}) {
    GGUFWriter w(3, align);
    if (align != 32) w.kv_u32("general.alignment", align);
    w.tensor_f32("a", {3}, {1, 2, 3});
    w.tensor_f32("b", {2, 3}, {1, 2, 3, 4, 5, 6});
    const GGUFFile f = GGUFFile::from_bytes(w.bytes(), "mem.gguf");
    EXPECT_EQ(f.alignment(), align);
    EXPECT_EQ(f.data_offset() % align, 0u);
    ASSERT_EQ(f.tensors().size(), 2u);
    const GGUFTensorInfo* b = f.find_tensor("b");
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->offset % align, 0u);
    EXPECT_EQ(b->shape(), (std::vector<int64_t>{3, 2}));  // ne reversed: 3 rows of 2
    const Tensor t = f.load_f32(*b);
    EXPECT_EQ(t.shape(), (std::vector<int64_t>{3, 2}));
    for (int i = 0; i < 6; ++i) EXPECT_EQ(t.data_as<float>()[i], float(i + 1));
  }
}

// One tensor of `type` holding `blocks`; returns its dequantised values.
std::vector<float> roundtrip(uint32_t type, int64_t n, const std::vector<uint8_t>& blocks) {
  GGUFWriter w;
  w.tensor("t", {n}, type, blocks);
  const GGUFFile f = GGUFFile::from_bytes(w.bytes(), "q.gguf");
  const Tensor t = f.load_f32(f.tensors()[0]);
  return {t.data_as<float>(), t.data_as<float>() + n};
}

TEST(GGUF, FloatTypes) {
  const std::vector<float> v = {0.f, 1.f, -2.5f, 65504.f, 1e-7f, 3.140625f};
  std::vector<uint8_t> f16, bf16;
  for (float x : v) {
    GGUFWriter::put<uint16_t>(f16, f32_to_f16(x));
    GGUFWriter::put<uint16_t>(bf16, f32_to_bf16(x));
  }
  const auto a = roundtrip(1, 6, f16), b = roundtrip(30, 6, bf16);
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(a[i], f16_to_f32(f32_to_f16(v[i])));
    EXPECT_EQ(b[i], bf16_to_f32(f32_to_bf16(v[i])));
  }
}

TEST(GGUF, Q8_0) {
  std::vector<uint8_t> b;
  std::vector<float> want;
  for (int blk = 0; blk < 2; ++blk) {
    const float d = blk == 0 ? 0.5f : -0.125f;
    put_f16(b, d);
    for (int j = 0; j < 32; ++j) {
      const int q = blk == 0 ? j - 16 : 127 - 8 * j;
      b.push_back(uint8_t(int8_t(q)));
      want.push_back(d * float(int8_t(q)));
    }
  }
  EXPECT_EQ(roundtrip(8, 64, b), want);
}

TEST(GGUF, Q4_0AndQ4_1) {
  // Value j of a block is the low nibble of byte j (j < 16) or the high nibble of byte j - 16.
  std::vector<int> v(32);
  for (int j = 0; j < 32; ++j) v[size_t(j)] = (j * 7 + 3) % 16;
  std::vector<uint8_t> b0, b1;
  put_f16(b0, 0.25f);
  put_f16(b1, 0.5f);
  put_f16(b1, -1.0f);
  for (int j = 0; j < 16; ++j) {
    b0.push_back(uint8_t(v[size_t(j)] | (v[size_t(j + 16)] << 4)));
    b1.push_back(uint8_t(v[size_t(j)] | (v[size_t(j + 16)] << 4)));
  }
  const auto q40 = roundtrip(2, 32, b0), q41 = roundtrip(3, 32, b1);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(q40[size_t(j)], 0.25f * float(v[size_t(j)] - 8)) << j;
    EXPECT_EQ(q41[size_t(j)], 0.5f * float(v[size_t(j)]) - 1.0f) << j;
  }
}

TEST(GGUF, Q4_K) {
  // 8 sub-blocks of 32 values with 6-bit scales/mins. Packing: bytes 0-3 hold sc[0..3] (low 6 bits)
  // with sc[4..7] >> 4 in their top 2 bits, bytes 4-7 the same for the mins, bytes 8-11 hold the
  // low nibbles of sc[4..7] (low) and mn[4..7] (high). Sub-blocks 2c, 2c+1 share qs[32c..32c+32).
  const float d = 0.5f, dmin = 0.25f;
  const int sc[8] = {1, 15, 16, 63, 17, 33, 48, 62};
  const int mn[8] = {0, 5, 31, 40, 63, 18, 7, 50};
  std::vector<uint8_t> b;
  put_f16(b, d);
  put_f16(b, dmin);
  uint8_t s[12];
  for (int i = 0; i < 4; ++i) {
    s[i] = uint8_t(sc[i] | ((sc[i + 4] >> 4) << 6));
    s[i + 4] = uint8_t(mn[i] | ((mn[i + 4] >> 4) << 6));
    s[i + 8] = uint8_t((sc[i + 4] & 15) | ((mn[i + 4] & 15) << 4));
  }
  b.insert(b.end(), s, s + 12);
  std::vector<int> q(256);
  std::mt19937 rng(1);
  for (int& x : q) x = int(rng() % 16);
  std::vector<uint8_t> qs(128, 0);
  for (int v = 0; v < 256; ++v) {
    const int sub = v / 32, l = v % 32, c = sub / 2;
    qs[size_t(32 * c + l)] |= uint8_t(sub % 2 == 0 ? q[size_t(v)] : q[size_t(v)] << 4);
  }
  b.insert(b.end(), qs.begin(), qs.end());
  ASSERT_EQ(b.size(), 144u);
  const auto got = roundtrip(12, 256, b);
  for (int v = 0; v < 256; ++v) {
    const int sub = v / 32;
    const float want = d * float(sc[sub]) * float(q[size_t(v)]) - dmin * float(mn[sub]);
    EXPECT_FLOAT_EQ(got[size_t(v)], want) << v;
  }
}

TEST(GGUF, Q6_K) {
  // Value v: half h = v / 128, quarter g = (v % 128) / 32, l = v % 32. Low 4 bits in ql[64h + l]
  // (g = 0, 2: low/high nibble) or ql[64h + 32 + l] (g = 1, 3), high 2 bits at bit 2g of
  // qh[32h + l], scale scales[8h + 2g + l / 16], x = d * scale * (q - 32).
  std::mt19937 rng(2);
  std::vector<int> q(256);
  for (int& x : q) x = int(rng() % 64);
  int8_t scales[16];
  for (int i = 0; i < 16; ++i) scales[i] = int8_t(int(rng() % 255) - 127);
  std::vector<uint8_t> ql(128, 0), qh(64, 0);
  for (int v = 0; v < 256; ++v) {
    const int h = v / 128, g = (v % 128) / 32, l = v % 32;
    const int lo = q[size_t(v)] & 15, hi = q[size_t(v)] >> 4;
    ql[size_t(64 * h + (g % 2) * 32 + l)] |= uint8_t(g < 2 ? lo : lo << 4);
    qh[size_t(32 * h + l)] |= uint8_t(hi << (2 * g));
  }
  const float d = 0.0625f;
  std::vector<uint8_t> b(ql);
  b.insert(b.end(), qh.begin(), qh.end());
  for (int8_t s : scales) b.push_back(uint8_t(s));
  put_f16(b, d);
  ASSERT_EQ(b.size(), 210u);
  const auto got = roundtrip(14, 256, b);
  for (int v = 0; v < 256; ++v) {
    const int h = v / 128, g = (v % 128) / 32, l = v % 32;
    const float want = d * float(scales[8 * h + 2 * g + l / 16]) * float(q[size_t(v)] - 32);
    EXPECT_FLOAT_EQ(got[size_t(v)], want) << v;
  }
}

std::vector<uint8_t> small_file() {
  GGUFWriter w;
  w.kv_str("general.architecture", "llama");
  w.kv_str_array("tokenizer.ggml.tokens", {"a", "b", "ab"});
  w.kv_u32("general.alignment", 32);
  w.tensor_f32("x", {4}, {1, 2, 3, 4});
  std::vector<uint8_t> q;
  put_f16(q, 1.f);
  for (int j = 0; j < 32; ++j) q.push_back(uint8_t(j));
  w.tensor("y", {32}, 8, q);
  return w.bytes();
}

TEST(GGUF, TruncationAtEveryOffsetRaisesError) {
  const auto full = small_file();
  ASSERT_NO_THROW(GGUFFile::from_bytes(full, "full.gguf"));
  for (size_t n = 0; n < full.size(); ++n) {
    std::vector<uint8_t> cut(full.begin(), full.begin() + std::ptrdiff_t(n));
    EXPECT_THROW(GGUFFile::from_bytes(cut, "cut.gguf"), Error) << "truncated at " << n;
  }
}

TEST(GGUF, CorruptedBytesNeverCrash) {
  // Flip every byte of the header region in turn: either it still parses or it raises Error.
  const auto full = small_file();
  for (size_t i = 0; i < full.size(); ++i) {
    for (uint8_t x : {uint8_t(0xff), uint8_t(0x7f), uint8_t(0x01)}) {
      auto bad = full;
      bad[i] ^= x;
      try {
        const GGUFFile f = GGUFFile::from_bytes(bad, "bad.gguf");
        for (const auto& t : f.tensors())
          if (ggml_type_supported(t.type)) f.load_f32(t);
      } catch (const Error&) {
      }
    }
  }
}

void expect_error(const std::vector<uint8_t>& bytes, const std::string& needle) {
  try {
    GGUFFile::from_bytes(bytes, "bad.gguf");
    ADD_FAILURE() << "no error, wanted one mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.gguf"), std::string::npos) << e.what();
  }
}

TEST(GGUF, MalformedFilesNameTheProblem) {
  auto b = small_file();
  b[0] = 'X';
  expect_error(b, "magic");
  b = small_file();
  b[4] = 1;  // version 1
  expect_error(b, "version");
  b = small_file();
  b[4] = 9;
  expect_error(b, "version");
  b = small_file();
  b[16] = 0xff;  // kv_count absurd
  b[23] = 0x7f;
  expect_error(b, "kv_count");
  b = small_file();
  b[8] = 0xff;  // tensor_count absurd
  b[13] = 0x7f;
  expect_error(b, "tensor_count");
  {
    GGUFWriter w;
    w.tensor("weird", {32}, 99, std::vector<uint8_t>(64, 0));
    expect_error(w.bytes(), "weird");
  }
  {
    GGUFWriter w;
    w.tensor("short", {64}, 0, std::vector<uint8_t>(64, 0));  // needs 256 bytes
    expect_error(w.bytes(), "short");
  }
  {
    GGUFWriter w;
    w.tensor("odd", {33}, 8, std::vector<uint8_t>(68, 0));  // 33 not a multiple of 32
    expect_error(w.bytes(), "odd");
  }
  {
    GGUFWriter w;
    w.kv_u32("general.alignment", 24);
    expect_error(w.bytes(), "general.alignment");
  }
  {  // an array claiming more strings than the file holds
    std::vector<uint8_t> v = enc<uint32_t>(8);
    GGUFWriter::put<uint64_t>(v, uint64_t(1) << 60);
    GGUFWriter w;
    w.kv_raw("tokenizer.ggml.tokens", 9, v);
    expect_error(w.bytes(), "tokenizer.ggml.tokens");
  }
  {  // a string longer than the file
    std::vector<uint8_t> v = enc<uint64_t>(uint64_t(1) << 62);
    GGUFWriter w;
    w.kv_raw("general.name", 8, v);
    expect_error(w.bytes(), "general.name");
  }
  {  // an unsupported but known type opens, and loading it names the tensor and type
    GGUFWriter w;
    w.tensor("q8k", {256}, 15, std::vector<uint8_t>(292, 0));
    const GGUFFile f = GGUFFile::from_bytes(w.bytes(), "q8k.gguf");
    try {
      f.load_f32(f.tensors()[0]);
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("q8k"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("Q8_K"), std::string::npos);
    }
  }
  EXPECT_THROW(GGUFFile::open("/nonexistent/file.gguf"), Error);
}

}  // namespace
}  // namespace pagedattn
