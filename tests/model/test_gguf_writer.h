// A small GGUF writer for the model-file tests: builds a file image in memory.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "pagedattn/dtype.h"

namespace pagedattn::testing {

class GGUFWriter {
 public:
  explicit GGUFWriter(uint32_t version = 3, uint64_t alignment = 32) : version_(version), align_(alignment) {}

  template <class T>
  static void put(std::vector<uint8_t>& b, T v) {
    const size_t at = b.size();
    b.resize(at + sizeof(T));
    std::memcpy(b.data() + at, &v, sizeof(T));
  }
  static void put_str(std::vector<uint8_t>& b, const std::string& s) {
    put<uint64_t>(b, s.size());
    b.insert(b.end(), s.begin(), s.end());
  }

  // A key with a raw value encoding (type id, then the bytes of the value).
  void kv_raw(const std::string& key, uint32_t type, const std::vector<uint8_t>& value) {
    put_str(kv_, key);
    put<uint32_t>(kv_, type);
    kv_.insert(kv_.end(), value.begin(), value.end());
    ++n_kv_;
  }
  template <class T>
  void kv(const std::string& key, uint32_t type, T v) {
    std::vector<uint8_t> b;
    put<T>(b, v);
    kv_raw(key, type, b);
  }
  void kv_u32(const std::string& key, uint32_t v) { kv(key, 4, v); }
  void kv_f32(const std::string& key, float v) { kv(key, 6, v); }
  void kv_bool(const std::string& key, bool v) { kv(key, 7, uint8_t(v)); }
  void kv_str(const std::string& key, const std::string& s) {
    std::vector<uint8_t> b;
    put_str(b, s);
    kv_raw(key, 8, b);
  }
  void kv_str_array(const std::string& key, const std::vector<std::string>& v) {
    std::vector<uint8_t> b;
    put<uint32_t>(b, 8);
    put<uint64_t>(b, v.size());
    for (const auto& s : v) put_str(b, s);
    kv_raw(key, 9, b);
  }
  void kv_i32_array(const std::string& key, const std::vector<int32_t>& v) {
    std::vector<uint8_t> b;
    put<uint32_t>(b, 5);
    put<uint64_t>(b, v.size());
    for (int32_t x : v) put<int32_t>(b, x);
    kv_raw(key, 9, b);
  }

  // ne in GGUF order (ne[0] innermost); data is the tensor's encoded bytes.
  void tensor(const std::string& name, std::vector<int64_t> ne, uint32_t type,
              const std::vector<uint8_t>& data) {
    while (data_.size() % align_) data_.push_back(0);
    put_str(ti_, name);
    put<uint32_t>(ti_, uint32_t(ne.size()));
    for (int64_t d : ne) put<uint64_t>(ti_, uint64_t(d));
    put<uint32_t>(ti_, type);
    put<uint64_t>(ti_, data_.size());
    data_.insert(data_.end(), data.begin(), data.end());
    ++n_t_;
  }
  void tensor_f32(const std::string& name, std::vector<int64_t> ne, const std::vector<float>& v) {
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    tensor(name, std::move(ne), 0, b);
  }

  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> b;
    put<uint32_t>(b, 0x46554747u);
    put<uint32_t>(b, version_);
    put<uint64_t>(b, n_t_);
    put<uint64_t>(b, n_kv_);
    b.insert(b.end(), kv_.begin(), kv_.end());
    b.insert(b.end(), ti_.begin(), ti_.end());
    if (n_t_ > 0) {
      while (b.size() % align_) b.push_back(0);
      b.insert(b.end(), data_.begin(), data_.end());
    }
    return b;
  }
  void write(const std::string& path) const {
    const auto b = bytes();
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  }

 private:
  uint32_t version_;
  uint64_t align_;
  uint64_t n_kv_ = 0, n_t_ = 0;
  std::vector<uint8_t> kv_, ti_, data_;
};

inline void put_f16(std::vector<uint8_t>& b, float v) { GGUFWriter::put<uint16_t>(b, f32_to_f16(v)); }

}  // namespace pagedattn::testing
