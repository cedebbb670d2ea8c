// GGUF (v2, v3) reader: header, metadata of every value type, tensor infos, and dequantisation of
// F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K tensors to
// f32.
//
// The file is memory-mapped (or held in memory for from_bytes). Every read is bounds-checked: a
// truncated or inconsistent file raises Error naming the file and the key or tensor at fault.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pagedattn/tensor.h"

namespace pagedattn {

enum class GGUFType : uint32_t {
  uint8 = 0, int8 = 1, uint16 = 2, int16 = 3, uint32 = 4, int32 = 5, float32 = 6, boolean = 7,
  string = 8, array = 9, uint64 = 10, int64 = 11, float64 = 12,
};
std::string_view gguf_type_name(GGUFType t);

// One metadata value. Scalars live in u/i/f/s by kind; arrays of scalars in ints/floats/strings
// (unsigned values in ints as their bit pattern), arrays of arrays in items.
struct GGUFValue {
  GGUFType type = GGUFType::uint8;
  GGUFType array_type = GGUFType::uint8;  // element type when type == array
  uint64_t u = 0;                         // unsigned scalars and bool
  int64_t i = 0;                          // signed scalars (and unsigned ones that fit)
  double f = 0;                           // float32/float64
  std::string s;                          // string
  std::vector<int64_t> ints;              // integer/bool arrays
  std::vector<double> floats;             // float arrays
  std::vector<std::string> strings;       // string arrays
  std::vector<GGUFValue> items;           // arrays of arrays

  bool is_integer() const;
  bool is_float() const { return type == GGUFType::float32 || type == GGUFType::float64; }
  size_t array_size() const;
};

// ggml tensor types (the subset this reader knows; others are rejected by name).
enum class GGMLType : uint32_t {
  f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8, q2_k = 10, q3_k = 11,
  q4_k = 12, q5_k = 13, q6_k = 14, iq4_nl = 20, bf16 = 30,
};
// IQ4_NL's 16 quant values (a nibble indexes them; llama.cpp's non-linear grid).
inline constexpr int8_t kIq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};
// Name of a ggml type id ("Q4_K", ...; "type <n>" for unknown ones).
std::string ggml_type_name(uint32_t type);
bool ggml_type_supported(uint32_t type);
// Elements per block and bytes per block of a supported type.
int64_t ggml_block_size(GGMLType t);
int64_t ggml_block_bytes(GGMLType t);
// Dequantises n elements (a multiple of the block size) of type t at src into dst.
//   src: [n / block_size blocks], dst: [n] f32
void dequantize_row(GGMLType t, const void* src, float* dst, int64_t n);

struct GGUFTensorInfo {
  std::string name;
  std::vector<int64_t> ne;  // GGUF order: ne[0] is the contiguous (innermost) dimension
  uint32_t type = 0;        // ggml type id
  uint64_t offset = 0;      // from the start of the data section
  uint64_t nbytes = 0;
  int64_t numel() const;
  // Row-major shape (ne reversed): ne = {in, out} -> {out, in}.
  std::vector<int64_t> shape() const;
};

class GGUFFile {
 public:
  // Memory-maps and parses the file (header, metadata, tensor infos; tensor data is read lazily).
  static GGUFFile open(const std::string& path);
  // Parses a file image held in memory; name is used in error messages.
  static GGUFFile from_bytes(std::vector<uint8_t> bytes, const std::string& name);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }

  const std::map<std::string, GGUFValue>& metadata() const { return metadata_; }
  const GGUFValue* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }
  // Typed getters: throw Error naming the file and key when missing or of the wrong type.
  const GGUFValue& get(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;  // accepts integers too
  bool get_bool(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  // With a default when the key is absent (still throws on a wrong type).
  int64_t get_int(const std::string& key, int64_t dflt) const;
  double get_float(const std::string& key, double dflt) const;
  bool get_bool(const std::string& key, bool dflt) const;
  std::string get_string(const std::string& key, const std::string& dflt) const;

  const std::vector<GGUFTensorInfo>& tensors() const { return tensors_; }
  const GGUFTensorInfo* find_tensor(const std::string& name) const;
  // The tensor's raw bytes inside the mapping: [info.nbytes].
  const uint8_t* tensor_data(const GGUFTensorInfo& info) const;
  // The same bytes, kept alive by the returned pointer (it shares the mapping).
  std::shared_ptr<const uint8_t> tensor_bytes(const GGUFTensorInfo& info) const;
  // Whether the bytes are a private read-only mapping of the file (open), not a buffer (from_bytes).
  bool mapped() const { return mapped_; }
  // Dequantises a tensor to an f32 CPU tensor of shape info.shape().
  Tensor load_f32(const GGUFTensorInfo& info) const;

 private:
  void parse();

  std::string path_;
  std::shared_ptr<const uint8_t> base_;  // the mapping or buffer
  bool mapped_ = false;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GGUFValue> metadata_;
  std::vector<GGUFTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// Maps a GGUF file to ModelConfig and Hugging Face tensor names (used by load_model_file).
struct ModelFile;
enum class WeightFormat;  // model_file.h; WeightFormat{} is f32
ModelFile load_gguf_model(const std::string& path, WeightFormat format = WeightFormat{});

}  // namespace pagedattn
