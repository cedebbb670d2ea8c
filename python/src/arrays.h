// Arrays from Python (numpy, torch or anything with __dlpack__) as views the C++ API reads, and
// the checks that name the argument at fault.
//
// Every array crosses zero-copy through DLPack (nanobind's ndarray): the C++ side reads and
// writes the caller's memory. The checks raise TypeError (not an array, a dtype the operation
// cannot read) or ValueError (shape, device, contiguity), each message starting with the
// operation's name and naming the argument.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "pagedattn/dtype.h"
#include "pagedattn/tensor.h"

namespace pagedattn::python {

namespace nb = nanobind;
using Array = nb::ndarray<>;

// Where an array lives.
struct Place {
  Device device = Device::cpu;
  int32_t device_id = 0;
  bool operator==(const Place& o) const { return device == o.device && device_id == o.device_id; }
};
std::string place_name(const Place& p);  // "cpu", "cuda:0"

// Raise TypeError / ValueError with "op: message".
[[noreturn]] void type_error(const char* op, const std::string& message);
[[noreturn]] void value_error(const char* op, const std::string& message);

// The array's dtype as a pagedattn DType (f32, f16, bf16; fp8 e4m3 also from uint8 bytes when
// allow_fp8); TypeError naming arg otherwise.
DType float_dtype(const Array& a, const char* op, const char* arg, bool allow_fp8 = false);
// The array's device (CPU or CUDA); ValueError naming arg otherwise.
Place place_of(const Array& a, const char* op, const char* arg);
// ValueError unless the array is C-contiguous (row-major, no gaps).
void check_contiguous(const Array& a, const char* op, const char* arg);
// ValueError unless the array has ndim dimensions; what describes them ("[num_tokens, num_heads,
// head_dim]").
void check_ndim(const Array& a, size_t ndim, const char* op, const char* arg, const char* what);
// The shape as int64 values.
std::vector<int64_t> shape_of(const Array& a);
std::string shape_str(const Array& a);
// An int32 array with ndim dimensions, contiguous, in host memory; returns its data.
const int32_t* host_int32(const Array& a, size_t ndim, const char* op, const char* arg,
                          const char* what);
// A float32 vector of n values on `where` (fp8 scales); returns its data.
const float* float32_vector(const Array& a, int64_t n, const Place& where, const char* op,
                            const char* arg);

// The DLPack dtype of a pagedattn DType (fp8 is exported as uint8 bytes).
nb::dlpack::dtype dlpack_dtype(DType t);

}  // namespace pagedattn::python
