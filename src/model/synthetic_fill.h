// The values of a synthetic model's weights: a counter-based hash of (seed, tensor id, element
// index), so any element can be computed alone, on the host or on a device, with the same result
// (make_hashed_synthetic_model_file on the host, LlamaModelCuda's fill kernel on the device).
// Compiled as C++17 by nvcc as well: no C++20 here.
#pragma once

#include <cstdint>

#include "pagedattn/dtype.h"  // PA_HD

namespace pagedattn::synthetic {

// splitmix64's output function (Steele, Lea, Flood 2014): a bijection that mixes every input bit.
PA_HD uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// One key per (seed, tensor): element i of the tensor is element i of the splitmix64 stream that
// starts at the key.
PA_HD uint64_t tensor_key(uint64_t seed, uint32_t tensor_id) {
  return mix64(mix64(seed + 0x9e3779b97f4a7c15ull) ^ (uint64_t(tensor_id) * 0xd1b54a32d192ed03ull));
}

// Uniform in [center - half_width, center + half_width].
// NOTE: x has 24 significant bits and half_width 24, so their product is exact in double; a
// fused multiply-add (which nvcc emits by default) then rounds the same as separate operations,
// and host and device agree bit for bit.
PA_HD float value(uint64_t key, uint64_t index, float center, float half_width) {
  const uint64_t h = mix64(key + (index + 1) * 0x9e3779b97f4a7c15ull);
  const double u = double(h >> 11) * 0x1.0p-53;  // [0, 1), exact
  const float x = float(2.0 * u - 1.0);          // [-1, 1] (1 - 2^-52 rounds up to 1)
  return float(double(center) + double(half_width) * double(x));
}

}  // namespace pagedattn::synthetic
