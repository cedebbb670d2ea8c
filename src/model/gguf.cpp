// GGUF reader: a bounds-checked cursor over a memory-mapped (or in-memory) file image.
//
// Layout (little-endian): magic "GGUF", version u32 (2 or 3), tensor_count u64, kv_count u64,
// kv_count x {key string, type u32, value}, tensor_count x {name string, n_dims u32, ne[n_dims] u64,
// type u32, offset u64}, padding to general.alignment, then the data section. A string is a u64
// length and that many bytes; an array is {element type u32, count u64, elements}.
#include "pagedattn/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "pagedattn/error.h"

namespace pagedattn {

namespace {

constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 8;

// Sizes of ggml types this reader can bound-check (supported ones are also dequantisable).
struct TypeTraits {
  uint32_t id;
  const char* name;
  int64_t block;
  int64_t bytes;
};
constexpr TypeTraits kTypes[] = {
    {0, "F32", 1, 4},       {1, "F16", 1, 2},       {2, "Q4_0", 32, 18},   {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},    {7, "Q5_1", 32, 24},    {8, "Q8_0", 32, 34},   {9, "Q8_1", 32, 36},
    {10, "Q2_K", 256, 84},  {11, "Q3_K", 256, 110}, {12, "Q4_K", 256, 144}, {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210}, {15, "Q8_K", 256, 292}, {24, "I8", 1, 1},      {25, "I16", 1, 2},
    {20, "IQ4_NL", 32, 18}, {26, "I32", 1, 4},      {27, "I64", 1, 8},     {28, "F64", 1, 8},
    {30, "BF16", 1, 2},
};

const TypeTraits* find_type(uint32_t id) {
  for (const auto& t : kTypes)
    if (t.id == id) return &t;
  return nullptr;
}

// Minimum encoded size of one value of a type (used to reject absurd counts before allocating).
uint64_t min_value_bytes(GGUFType t) {
  switch (t) {
    case GGUFType::uint8: case GGUFType::int8: case GGUFType::boolean: return 1;
    case GGUFType::uint16: case GGUFType::int16: return 2;
    case GGUFType::uint32: case GGUFType::int32: case GGUFType::float32: return 4;
    case GGUFType::uint64: case GGUFType::int64: case GGUFType::float64: return 8;
    case GGUFType::string: return 8;
    case GGUFType::array: return 12;
  }
  return 1;
}

class Cursor {
 public:
  Cursor(const uint8_t* p, uint64_t size, const std::string& file) : p_(p), size_(size), file_(file) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  template <class T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const std::string& what) {
    const uint64_t n = read<uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), size_t(n));
    pos_ += n;
    return s;
  }
  void need(uint64_t n, const std::string& what) const {
    if (n > left())
      fail("gguf: ", file_, ": truncated file reading ", what, " at offset ", pos_, " (needs ", n,
           " bytes, ", left(), " left)");
  }

 private:
  const uint8_t* p_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& file_;
};

bool valid_type(uint32_t t) { return t <= uint32_t(GGUFType::float64); }

GGUFValue read_value(Cursor& c, GGUFType type, const std::string& key, const std::string& file,
                     int depth);

void read_array(Cursor& c, GGUFValue& v, const std::string& key, const std::string& file, int depth) {
  PA_CHECK(depth < kMaxArrayDepth, "gguf: ", file, ": key '", key, "': arrays nested deeper than ",
           kMaxArrayDepth);
  const uint32_t et = c.read<uint32_t>("array type of '" + key + "'");
  PA_CHECK(valid_type(et), "gguf: ", file, ": key '", key, "': unknown array element type ", et);
  v.array_type = GGUFType(et);
  const uint64_t n = c.read<uint64_t>("array length of '" + key + "'");
  PA_CHECK(n <= c.left() / min_value_bytes(v.array_type), "gguf: ", file, ": key '", key,
           "': array length ", n, " exceeds the file");
  const std::string what = "elements of '" + key + "'";
  switch (v.array_type) {
    case GGUFType::string:
      v.strings.reserve(size_t(n));
      for (uint64_t i = 0; i < n; ++i) v.strings.push_back(c.read_string(what));
      break;
    case GGUFType::float32:
      v.floats.reserve(size_t(n));
      for (uint64_t i = 0; i < n; ++i) v.floats.push_back(c.read<float>(what));
      break;
    case GGUFType::float64:
      v.floats.reserve(size_t(n));
      for (uint64_t i = 0; i < n; ++i) v.floats.push_back(c.read<double>(what));
      break;
    case GGUFType::array:
      v.items.reserve(size_t(n));
      for (uint64_t i = 0; i < n; ++i)
        v.items.push_back(read_value(c, GGUFType::array, key, file, depth + 1));
      break;
    default:
      v.ints.reserve(size_t(n));
      for (uint64_t i = 0; i < n; ++i) {
        GGUFValue e = read_value(c, v.array_type, key, file, depth + 1);
        v.ints.push_back(e.i);
      }
  }
}

GGUFValue read_value(Cursor& c, GGUFType type, const std::string& key, const std::string& file,
                     int depth) {
  GGUFValue v;
  v.type = type;
  const std::string what = "value of '" + key + "'";
  switch (type) {
    case GGUFType::uint8: v.u = c.read<uint8_t>(what); v.i = int64_t(v.u); break;
    case GGUFType::int8: v.i = c.read<int8_t>(what); break;
    case GGUFType::uint16: v.u = c.read<uint16_t>(what); v.i = int64_t(v.u); break;
    case GGUFType::int16: v.i = c.read<int16_t>(what); break;
    case GGUFType::uint32: v.u = c.read<uint32_t>(what); v.i = int64_t(v.u); break;
    case GGUFType::int32: v.i = c.read<int32_t>(what); break;
    case GGUFType::uint64: v.u = c.read<uint64_t>(what); v.i = int64_t(v.u); break;
    case GGUFType::int64: v.i = c.read<int64_t>(what); break;
    case GGUFType::float32: v.f = c.read<float>(what); break;
    case GGUFType::float64: v.f = c.read<double>(what); break;
    case GGUFType::boolean: {
      const uint8_t b = c.read<uint8_t>(what);
      PA_CHECK(b <= 1, "gguf: ", file, ": key '", key, "': bool value ", int(b), " is not 0 or 1");
      v.u = b;
      v.i = b;
      break;
    }
    case GGUFType::string: v.s = c.read_string(what); break;
    case GGUFType::array: read_array(c, v, key, file, depth); break;
  }
  return v;
}

}  // namespace

std::string_view gguf_type_name(GGUFType t) {
  static constexpr std::string_view kNames[] = {"uint8",   "int8",   "uint16", "int16", "uint32",
                                                "int32",   "float32", "bool",  "string", "array",
                                                "uint64",  "int64",  "float64"};
  return uint32_t(t) <= 12 ? kNames[uint32_t(t)] : "unknown";
}

bool GGUFValue::is_integer() const {
  switch (type) {
    case GGUFType::uint8: case GGUFType::int8: case GGUFType::uint16: case GGUFType::int16:
    case GGUFType::uint32: case GGUFType::int32: case GGUFType::uint64: case GGUFType::int64:
      return true;
    default: return false;
  }
}

size_t GGUFValue::array_size() const {
  if (type != GGUFType::array) return 0;
  return ints.size() + floats.size() + strings.size() + items.size();
}

std::string ggml_type_name(uint32_t type) {
  const TypeTraits* t = find_type(type);
  return t ? std::string(t->name) : "type " + std::to_string(type);
}

bool ggml_type_supported(uint32_t type) {
  switch (GGMLType(type)) {
    case GGMLType::f32: case GGMLType::f16: case GGMLType::bf16: case GGMLType::q8_0:
    case GGMLType::q4_0: case GGMLType::q4_1: case GGMLType::q4_k: case GGMLType::q6_k:
    case GGMLType::q5_0: case GGMLType::q5_1: case GGMLType::q5_k:
    case GGMLType::q2_k: case GGMLType::q3_k: case GGMLType::iq4_nl:
      return find_type(type) != nullptr;
  }
  return false;
}

int64_t ggml_block_size(GGMLType t) {
  const TypeTraits* tt = find_type(uint32_t(t));
  PA_CHECK(tt, "ggml_block_size: unknown type ", uint32_t(t));
  return tt->block;
}

int64_t ggml_block_bytes(GGMLType t) {
  const TypeTraits* tt = find_type(uint32_t(t));
  PA_CHECK(tt, "ggml_block_bytes: unknown type ", uint32_t(t));
  return tt->bytes;
}

int64_t GGUFTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

std::vector<int64_t> GGUFTensorInfo::shape() const { return {ne.rbegin(), ne.rend()}; }

GGUFFile GGUFFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  PA_CHECK(fd >= 0, "gguf: cannot open ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("gguf: ", path, " is not a regular file");
  }
  GGUFFile f;
  f.path_ = path;
  f.size_ = uint64_t(st.st_size);
  if (f.size_ == 0) {
    ::close(fd);
    fail("gguf: ", path, ": empty file");
  }
  void* m = mmap(nullptr, size_t(f.size_), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  PA_CHECK(m != MAP_FAILED, "gguf: cannot map ", path, ": ", std::strerror(errno));
  const size_t len = size_t(f.size_);
  f.base_ = std::shared_ptr<const uint8_t>(static_cast<const uint8_t*>(m),
                                           [len](const uint8_t* p) { munmap((void*)p, len); });
  f.mapped_ = true;
  f.parse();
  return f;
}

GGUFFile GGUFFile::from_bytes(std::vector<uint8_t> bytes, const std::string& name) {
  GGUFFile f;
  f.path_ = name;
  f.size_ = bytes.size();
  auto holder = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  f.base_ = std::shared_ptr<const uint8_t>(holder, holder->data());
  f.parse();
  return f;
}

void GGUFFile::parse() {
  Cursor c(base_.get(), size_, path_);
  const uint32_t magic = c.read<uint32_t>("magic");
  PA_CHECK(magic == 0x46554747u, "gguf: ", path_, ": bad magic (not a GGUF file)");
  version_ = c.read<uint32_t>("version");
  PA_CHECK(version_ == 2 || version_ == 3, "gguf: ", path_, ": unsupported version ", version_,
           " (expected 2 or 3)");
  const uint64_t n_tensors = c.read<uint64_t>("tensor_count");
  const uint64_t n_kv = c.read<uint64_t>("kv_count");
  // A key-value pair takes at least 13 bytes, a tensor info at least 24.
  PA_CHECK(n_kv <= c.left() / 13, "gguf: ", path_, ": kv_count ", n_kv, " exceeds the file");
  PA_CHECK(n_tensors <= c.left() / 24, "gguf: ", path_, ": tensor_count ", n_tensors,
           " exceeds the file");

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = c.read_string("key " + std::to_string(k));
    const uint32_t t = c.read<uint32_t>("type of '" + key + "'");
    PA_CHECK(valid_type(t), "gguf: ", path_, ": key '", key, "': unknown value type ", t);
    GGUFValue v = read_value(c, GGUFType(t), key, path_, 0);
    PA_CHECK(!metadata_.count(key), "gguf: ", path_, ": duplicate key '", key, "'");
    metadata_.emplace(std::move(key), std::move(v));
  }
  if (const GGUFValue* a = find("general.alignment")) {
    PA_CHECK(a->is_integer() && a->i > 0 && (a->i & (a->i - 1)) == 0 && a->i <= (1 << 20), "gguf: ",
             path_, ": key 'general.alignment': must be a power of two, got ",
             a->is_integer() ? std::to_string(a->i) : std::string(gguf_type_name(a->type)));
    alignment_ = uint64_t(a->i);
  }

  tensors_.reserve(size_t(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GGUFTensorInfo ti;
    ti.name = c.read_string("tensor name " + std::to_string(k));
    const std::string what = "info of tensor '" + ti.name + "'";
    const uint32_t nd = c.read<uint32_t>(what);
    PA_CHECK(nd >= 1 && nd <= kMaxDims, "gguf: ", path_, ": tensor '", ti.name, "': n_dims ", nd,
             " (expected 1..", kMaxDims, ")");
    uint64_t numel = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      const uint64_t n = c.read<uint64_t>(what);
      PA_CHECK(n >= 1 && n < (uint64_t(1) << 40) && numel <= (uint64_t(1) << 42) / n, "gguf: ", path_,
               ": tensor '", ti.name, "': absurd dimension ne[", d, "] = ", n);
      numel *= n;
      ti.ne.push_back(int64_t(n));
    }
    ti.type = c.read<uint32_t>(what);
    const TypeTraits* tt = find_type(ti.type);
    PA_CHECK(tt, "gguf: ", path_, ": tensor '", ti.name, "': unknown ggml type ", ti.type);
    PA_CHECK(ti.ne[0] % tt->block == 0, "gguf: ", path_, ": tensor '", ti.name, "': ne[0] = ",
             ti.ne[0], " is not a multiple of the ", tt->name, " block size ", tt->block);
    ti.nbytes = numel / uint64_t(tt->block) * uint64_t(tt->bytes);
    ti.offset = c.read<uint64_t>(what);
    PA_CHECK(ti.offset % alignment_ == 0, "gguf: ", path_, ": tensor '", ti.name, "': offset ",
             ti.offset, " is not a multiple of the alignment ", alignment_);
    PA_CHECK(!tensor_index_.count(ti.name), "gguf: ", path_, ": duplicate tensor '", ti.name, "'");
    tensor_index_.emplace(ti.name, tensors_.size());
    tensors_.push_back(std::move(ti));
  }
  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (n_tensors > 0) {
    PA_CHECK(data_offset_ <= size_, "gguf: ", path_, ": truncated file: data section at offset ",
             data_offset_, " is beyond the end (", size_, " bytes)");
  }
  const uint64_t data_size = size_ >= data_offset_ ? size_ - data_offset_ : 0;
  for (const auto& ti : tensors_) {
    PA_CHECK(ti.offset <= data_size && ti.nbytes <= data_size - ti.offset, "gguf: ", path_,
             ": tensor '", ti.name, "' (offset ", ti.offset, ", ", ti.nbytes,
             " bytes) extends beyond the end of the file (data section holds ", data_size, " bytes)");
  }
}

const GGUFValue* GGUFFile::find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GGUFValue& GGUFFile::get(const std::string& key) const {
  const GGUFValue* v = find(key);
  PA_CHECK(v, "gguf: ", path_, ": missing key '", key, "'");
  return *v;
}

int64_t GGUFFile::get_int(const std::string& key) const {
  const GGUFValue& v = get(key);
  PA_CHECK(v.is_integer(), "gguf: ", path_, ": key '", key, "' is ", gguf_type_name(v.type),
           ", expected an integer");
  return v.i;
}

double GGUFFile::get_float(const std::string& key) const {
  const GGUFValue& v = get(key);
  if (v.is_integer()) return double(v.i);
  PA_CHECK(v.is_float(), "gguf: ", path_, ": key '", key, "' is ", gguf_type_name(v.type),
           ", expected a number");
  return v.f;
}

bool GGUFFile::get_bool(const std::string& key) const {
  const GGUFValue& v = get(key);
  PA_CHECK(v.type == GGUFType::boolean, "gguf: ", path_, ": key '", key, "' is ",
           gguf_type_name(v.type), ", expected bool");
  return v.u != 0;
}

const std::string& GGUFFile::get_string(const std::string& key) const {
  const GGUFValue& v = get(key);
  PA_CHECK(v.type == GGUFType::string, "gguf: ", path_, ": key '", key, "' is ",
           gguf_type_name(v.type), ", expected string");
  return v.s;
}

int64_t GGUFFile::get_int(const std::string& key, int64_t dflt) const {
  return has(key) ? get_int(key) : dflt;
}
double GGUFFile::get_float(const std::string& key, double dflt) const {
  return has(key) ? get_float(key) : dflt;
}
bool GGUFFile::get_bool(const std::string& key, bool dflt) const {
  return has(key) ? get_bool(key) : dflt;
}
std::string GGUFFile::get_string(const std::string& key, const std::string& dflt) const {
  return has(key) ? get_string(key) : dflt;
}

const GGUFTensorInfo* GGUFFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const uint8_t* GGUFFile::tensor_data(const GGUFTensorInfo& info) const {
  return base_.get() + data_offset_ + info.offset;
}

std::shared_ptr<const uint8_t> GGUFFile::tensor_bytes(const GGUFTensorInfo& info) const {
  return std::shared_ptr<const uint8_t>(base_, tensor_data(info));
}

Tensor GGUFFile::load_f32(const GGUFTensorInfo& info) const {
  PA_CHECK(ggml_type_supported(info.type), "gguf: ", path_, ": tensor '", info.name,
           "': unsupported type ", ggml_type_name(info.type),
           " (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, "
           "Q6_K)");
  Tensor t = Tensor::empty(info.shape(), DType::f32);
  const GGMLType type = GGMLType(info.type);
  const int64_t row = info.ne[0];
  const int64_t rows = info.numel() / row;
  const int64_t row_bytes = row / ggml_block_size(type) * ggml_block_bytes(type);
  const uint8_t* src = tensor_data(info);
  float* dst = t.data_as<float>();
  for (int64_t r = 0; r < rows; ++r) dequantize_row(type, src + r * row_bytes, dst + r * row, row);
  return t;
}

}  // namespace pagedattn
