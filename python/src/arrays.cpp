#include "arrays.h"

#include <sstream>

namespace pagedattn::python {

namespace {

constexpr uint8_t kFloat = uint8_t(nb::dlpack::dtype_code::Float);
constexpr uint8_t kBfloat = uint8_t(nb::dlpack::dtype_code::Bfloat);
constexpr uint8_t kInt = uint8_t(nb::dlpack::dtype_code::Int);
constexpr uint8_t kUInt = uint8_t(nb::dlpack::dtype_code::UInt);
constexpr uint8_t kFp8 = uint8_t(nb::dlpack::dtype_code::Float8_E4M3FN);

std::string dtype_str(const nb::dlpack::dtype& t) {
  std::string kind;
  switch (t.code) {
    case kFloat:
      kind = "float";
      break;
    case kBfloat:
      kind = "bfloat";
      break;
    case kInt:
      kind = "int";
      break;
    case kUInt:
      kind = "uint";
      break;
    case uint8_t(nb::dlpack::dtype_code::Bool):
      return "bool";
    case uint8_t(nb::dlpack::dtype_code::Complex):
      kind = "complex";
      break;
    default:
      kind = "dlpack-code-" + std::to_string(int(t.code)) + "-";
  }
  return kind + std::to_string(int(t.bits));
}

}  // namespace

std::string place_name(const Place& p) {
  return p.device == Device::cpu ? "cpu" : "cuda:" + std::to_string(p.device_id);
}

void type_error(const char* op, const std::string& message) {
  throw nb::type_error((std::string(op) + ": " + message).c_str());
}

void value_error(const char* op, const std::string& message) {
  throw nb::value_error((std::string(op) + ": " + message).c_str());
}

DType float_dtype(const Array& a, const char* op, const char* arg, bool allow_fp8) {
  const nb::dlpack::dtype t = a.dtype();
  if (t.lanes == 1) {
    if (t.code == kFloat && t.bits == 32) return DType::f32;
    if (t.code == kFloat && t.bits == 16) return DType::f16;
    if (t.code == kBfloat && t.bits == 16) return DType::bf16;
    if (allow_fp8 && t.bits == 8 && (t.code == kFp8 || t.code == kUInt)) return DType::fp8_e4m3;
  }
  type_error(op, std::string(arg) + " must be float32, float16 or bfloat16" +
                     (allow_fp8 ? " (or float8_e4m3fn / uint8 bytes of fp8 e4m3)" : "") + ", got " +
                     dtype_str(t));
}

Place place_of(const Array& a, const char* op, const char* arg) {
  const int t = a.device_type();
  if (t == nb::device::cpu::value || t == nb::device::cuda_host::value) {
    return {Device::cpu, 0};
  }
  if (t == nb::device::cuda::value || t == nb::device::cuda_managed::value) {
    return {Device::cuda, int32_t(a.device_id())};
  }
  value_error(op, std::string(arg) + " must be in CPU or CUDA memory, got DLPack device type " +
                      std::to_string(t));
}

void check_contiguous(const Array& a, const char* op, const char* arg) {
  int64_t expected = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    // NOTE: a dimension of extent 1 may carry any stride (torch reports several conventions).
    if (a.shape(i) != 1 && a.stride(i) != expected) {
      value_error(op, std::string(arg) + " must be contiguous (row-major), got shape " +
                          shape_str(a) +
                          " with strides that skip elements; pass a contiguous "
                          "copy (.contiguous() / np.ascontiguousarray)");
    }
    expected *= int64_t(a.shape(i));
  }
}

void check_ndim(const Array& a, size_t ndim, const char* op, const char* arg, const char* what) {
  if (a.ndim() != ndim) {
    value_error(op, std::string(arg) + " must have " + std::to_string(ndim) + " dimensions " +
                        what + ", got shape " + shape_str(a));
  }
}

std::vector<int64_t> shape_of(const Array& a) {
  std::vector<int64_t> s(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) s[i] = int64_t(a.shape(i));
  return s;
}

std::string shape_str(const Array& a) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < a.ndim(); ++i) os << (i ? ", " : "") << a.shape(i);
  os << (a.ndim() == 1 ? ",)" : ")");
  return os.str();
}

const int32_t* host_int32(const Array& a, size_t ndim, const char* op, const char* arg,
                          const char* what) {
  const nb::dlpack::dtype t = a.dtype();
  if (!(t.code == kInt && t.bits == 32 && t.lanes == 1)) {
    type_error(op, std::string(arg) + " must be int32, got " + dtype_str(t));
  }
  check_ndim(a, ndim, op, arg, what);
  if (place_of(a, op, arg).device != Device::cpu) {
    value_error(op, std::string(arg) +
                        " must be in host memory (the batch metadata is read on "
                        "the host), got " +
                        place_name(place_of(a, op, arg)));
  }
  check_contiguous(a, op, arg);
  return static_cast<const int32_t*>(a.data());
}

const float* float32_vector(const Array& a, int64_t n, const Place& where, const char* op,
                            const char* arg) {
  const nb::dlpack::dtype t = a.dtype();
  if (!(t.code == kFloat && t.bits == 32 && t.lanes == 1)) {
    type_error(op, std::string(arg) + " must be float32, got " + dtype_str(t));
  }
  if (a.ndim() != 1 || int64_t(a.shape(0)) != n) {
    value_error(op, std::string(arg) + " must have shape (" + std::to_string(n) +
                        ",) (one scale per KV head), got " + shape_str(a));
  }
  check_contiguous(a, op, arg);
  const Place p = place_of(a, op, arg);
  if (!(p == where)) {
    value_error(op, std::string(arg) + " must be on " + place_name(where) +
                        " with the pools, got " + place_name(p));
  }
  return static_cast<const float*>(a.data());
}

nb::dlpack::dtype dlpack_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return nb::dtype<float>();
    case DType::f16:
      return {kFloat, 16, 1};
    case DType::bf16:
      return {kBfloat, 16, 1};
    case DType::fp8_e4m3:
      return nb::dtype<uint8_t>();
  }
  return nb::dtype<uint8_t>();
}

}  // namespace pagedattn::python
