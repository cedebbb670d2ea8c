// safetensors reader: u64 header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
// then the data section; offsets are relative to its start. Everything is checked against the
// file size before any tensor is read.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "pagedattn/error.h"
#include "pagedattn/model_file.h"

namespace pagedattn {

namespace {

constexpr uint64_t kMaxHeader = uint64_t(100) << 20;

struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

DType parse_st_dtype(const std::string& s, const std::string& file, const std::string& name) {
  if (s == "F32") return DType::f32;
  if (s == "F16") return DType::f16;
  if (s == "BF16") return DType::bf16;
  fail("load_safetensors: ", file, ": tensor '", name, "': unsupported dtype '", s,
       "' (supported: F32, F16, BF16)");
}

// The whole file, mapped read-only (private), unmapped with the last reference.
std::shared_ptr<const uint8_t> map_file(const std::string& path, uint64_t size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  PA_CHECK(fd >= 0, "load_safetensors: cannot open ", path);
  void* m = ::mmap(nullptr, size_t(size), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  PA_CHECK(m != MAP_FAILED, "load_safetensors: ", path, ": mmap failed");
  return std::shared_ptr<const uint8_t>(static_cast<const uint8_t*>(m),
                                        [size](const uint8_t* p) {
                                          ::munmap(const_cast<uint8_t*>(p), size_t(size));
                                        });
}

}  // namespace

std::map<std::string, Tensor> load_safetensors(const std::string& path, bool keep_stored) {
  std::ifstream in(path, std::ios::binary);
  PA_CHECK(in, "load_safetensors: cannot open ", path);
  in.seekg(0, std::ios::end);
  const uint64_t size = uint64_t(in.tellg());
  in.seekg(0);
  PA_CHECK(size >= 8, "load_safetensors: ", path, ": truncated file (", size, " bytes)");
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  PA_CHECK(n <= size - 8 && n <= kMaxHeader, "load_safetensors: ", path, ": header length ", n,
           " exceeds the file (", size, " bytes)");
  std::string header(size_t(n), '\0');
  in.read(header.data(), std::streamsize(n));
  PA_CHECK(in, "load_safetensors: ", path, ": cannot read the header");
  const uint64_t data_size = size - 8 - n;

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception& e) {
    fail("load_safetensors: ", path, ": header is not valid JSON: ", e.what());
  }
  PA_CHECK(j.is_object(), "load_safetensors: ", path, ": header is not a JSON object");

  std::vector<Entry> entries;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string& name = it.key();
    const auto& v = it.value();
    PA_CHECK(v.is_object() && v.contains("dtype") && v["dtype"].is_string() && v.contains("shape") &&
                 v["shape"].is_array() && v.contains("data_offsets") &&
                 v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
             "load_safetensors: ", path, ": tensor '", name,
             "': entry needs dtype, shape and data_offsets [begin, end]");
    Entry e{name, parse_st_dtype(v["dtype"].get<std::string>(), path, name), {}, 0, 0};
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      PA_CHECK(d.is_number_unsigned() && d.get<uint64_t>() < (uint64_t(1) << 40), "load_safetensors: ",
               path, ": tensor '", name, "': bad shape ", v["shape"].dump());
      const uint64_t dd = d.get<uint64_t>();
      PA_CHECK(dd == 0 || numel <= (uint64_t(1) << 42) / dd, "load_safetensors: ", path,
               ": tensor '", name, "': shape ", v["shape"].dump(), " is too large");
      numel *= dd;
      e.shape.push_back(int64_t(dd));
    }
    const auto& off = v["data_offsets"];
    PA_CHECK(off[0].is_number_unsigned() && off[1].is_number_unsigned(), "load_safetensors: ", path,
             ": tensor '", name, "': data_offsets must be non-negative integers");
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    PA_CHECK(e.begin <= e.end && e.end <= data_size, "load_safetensors: ", path, ": tensor '", name,
             "': data_offsets [", e.begin, ", ", e.end, "] extend beyond the data section (",
             data_size, " bytes)");
    PA_CHECK(e.end - e.begin == numel * dtype_size(e.dtype), "load_safetensors: ", path,
             ": tensor '", name, "': data_offsets span ", e.end - e.begin, " bytes but shape ",
             v["shape"].dump(), " of ", v["dtype"].get<std::string>(), " needs ",
             numel * dtype_size(e.dtype));
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < entries.size(); ++i)
    PA_CHECK(entries[i].begin >= entries[i - 1].end || entries[i - 1].begin == entries[i - 1].end,
             "load_safetensors: ", path, ": tensor '", entries[i].name, "' overlaps tensor '",
             entries[i - 1].name, "'");

  std::map<std::string, Tensor> out;
  if (keep_stored) {
    const std::shared_ptr<const uint8_t> map = map_file(path, size);
    for (const Entry& e : entries) {
      const uint8_t* at = map.get() + 8 + n + e.begin;
      const size_t elem = dtype_size(e.dtype);
      if (reinterpret_cast<uintptr_t>(at) % elem == 0) {
        // Shares the mapping; const_cast: Tensor's storage is mutable by type, the pages are not
        // written (a write would fault on the read-only mapping rather than change the file).
        std::shared_ptr<void> view(map, const_cast<uint8_t*>(at));
        out.emplace(e.name, Tensor::wrap(std::move(view), e.shape, e.dtype, Device::cpu));
      } else {
        Tensor t = Tensor::empty(e.shape, e.dtype);
        std::memcpy(t.data(), at, size_t(e.end - e.begin));
        out.emplace(e.name, std::move(t));
      }
    }
    return out;
  }
  std::vector<char> buf;
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, DType::f32);
    buf.resize(size_t(e.end - e.begin));
    in.seekg(std::streamoff(8 + n + e.begin));
    in.read(buf.data(), std::streamsize(buf.size()));
    PA_CHECK(in, "load_safetensors: ", path, ": tensor '", e.name, "': read failed");
    float* dst = t.data_as<float>();
    for (int64_t i = 0; i < t.numel(); ++i) dst[i] = load_as_f32(buf.data(), e.dtype, i);
    out.emplace(e.name, std::move(t));
  }
  return out;
}

}  // namespace pagedattn
