#include "pagedattn/dtype.h"

#include <string>

#include "pagedattn/error.h"

namespace pagedattn {

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "float32") return DType::f32;
  if (name == "f16" || name == "float16") return DType::f16;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "fp8" || name == "fp8_e4m3" || name == "e4m3") return DType::fp8_e4m3;
  fail("parse_dtype: unknown dtype '", std::string(name), "' (expected f32, f16, bf16 or fp8)");
}

}  // namespace pagedattn
