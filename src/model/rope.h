// Rotary position embeddings, Hugging Face convention (rotate_half: dimension i pairs with
// i + head_dim / 2), with the rope_theta and Llama-3 frequency scaling of the model config.
#pragma once

#include <cstdint>
#include <vector>

#include "pagedattn/model_file.h"

namespace pagedattn {

// The rotary frequencies [head_dim / 2]: theta^(-2i / head_dim), rescaled per rope_scaling
// ("llama3": low frequencies divided by factor, a smooth blend between the two wavelength bounds).
// Throws Error for an odd head_dim or an unknown scaling type.
std::vector<double> rope_inv_freq(int32_t head_dim, float theta, const RopeScaling& scaling);

// cos/sin tables for the given positions: cos, sin [num_tokens, head_dim / 2].
void rope_tables(const std::vector<double>& inv_freq, const int32_t* positions, int32_t num_tokens,
                 float* cos, float* sin);

// Rotates x [num_tokens, num_heads, head_dim] in place with the tables of rope_tables.
void rope_apply(float* x, int32_t num_tokens, int32_t num_heads, int32_t head_dim, const float* cos,
                const float* sin);

}  // namespace pagedattn
