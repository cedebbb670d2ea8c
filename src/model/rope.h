// Rotary position embeddings, Hugging Face convention (rotate_half: dimension i pairs with
// i + head_dim / 2), with the rope_theta and the frequency scaling (linear, Llama 3's, YaRN) of
// the model config.
#pragma once

#include <cstdint>
#include <vector>

#include "pagedattn/model_file.h"

namespace pagedattn {

// The rotary frequencies [head_dim / 2]: theta^(-2i / head_dim), rescaled per rope_scaling
// ("linear": divided by factor; "llama3": low frequencies divided by factor, a smooth blend
// between the two wavelength bounds; "yarn": divided by factor below beta_slow rotations over the
// pretraining context, kept above beta_fast, a ramp between). Throws Error for an odd head_dim,
// an unknown scaling type or parameters out of range.
std::vector<double> rope_inv_freq(int32_t head_dim, float theta, const RopeScaling& scaling);

// The factor applied to the cos/sin tables: YaRN's attention factor (given, or 0.1 ln(factor) + 1,
// or the ratio of that with mscale and mscale_all_dim), 1 for the other scalings.
double rope_attention_factor(const RopeScaling& scaling);

// cos/sin tables for the given positions, times `scale` (rope_attention_factor): cos, sin
// [num_tokens, head_dim / 2].
void rope_tables(const std::vector<double>& inv_freq, const int32_t* positions, int32_t num_tokens,
                 float* cos, float* sin, double scale = 1.0);

// Rotates x [num_tokens, num_heads, head_dim] in place with the tables of rope_tables.
void rope_apply(float* x, int32_t num_tokens, int32_t num_heads, int32_t head_dim, const float* cos,
                const float* sin);

}  // namespace pagedattn
