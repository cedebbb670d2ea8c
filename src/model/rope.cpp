#include "rope.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "pagedattn/error.h"

namespace pagedattn {

namespace {

void check_yarn(const RopeScaling& s) {
  PA_CHECK(s.factor > 0.f && s.original_max_position > 0 && s.beta_fast > 0.f &&
               s.beta_slow > 0.f && std::isfinite(s.attention_factor) && std::isfinite(s.mscale) &&
               std::isfinite(s.mscale_all_dim),
           "rope: yarn rope_scaling needs factor > 0, original_max_position_embeddings > 0, "
           "beta_fast and beta_slow > 0 and finite attention_factor, mscale, mscale_all_dim");
}

// YaRN (transformers' _compute_yarn_parameters): dimensions that turn more than beta_fast times
// over the pretraining context keep their frequency, those that turn fewer than beta_slow times
// are divided by factor, a linear ramp between.
std::vector<double> yarn_inv_freq(std::vector<double> inv, int32_t head_dim, float theta,
                                  const RopeScaling& s) {
  check_yarn(s);
  const double dim = head_dim, base = theta, orig = s.original_max_position;
  auto correction_dim = [&](double rotations) {
    return dim * std::log(orig / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
  };
  double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // no zero-width ramp
  for (size_t i = 0; i < inv.size(); ++i) {
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolation = 1.0 - ramp;  // the share that keeps the frequency
    inv[i] = inv[i] / s.factor * (1.0 - extrapolation) + inv[i] * extrapolation;
  }
  return inv;
}

double yarn_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

double rope_attention_factor(const RopeScaling& scaling) {
  if (scaling.type != "yarn") return 1.0;
  check_yarn(scaling);
  if (scaling.attention_factor > 0.f) return scaling.attention_factor;
  if (scaling.mscale != 0.f && scaling.mscale_all_dim != 0.f)
    return yarn_mscale(scaling.factor, scaling.mscale) /
           yarn_mscale(scaling.factor, scaling.mscale_all_dim);
  return yarn_mscale(scaling.factor, 1.0);
}

std::vector<double> rope_inv_freq(int32_t head_dim, float theta, const RopeScaling& scaling) {
  PA_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope: head_dim must be positive and even, got ",
           head_dim);
  PA_CHECK(theta > 0.f, "rope: rope_theta must be positive, got ", theta);
  const int32_t half = head_dim / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int32_t i = 0; i < half; ++i) inv[size_t(i)] = std::pow(double(theta), -2.0 * i / head_dim);
  if (scaling.type.empty() || scaling.type == "default") return inv;
  if (scaling.type == "linear") {
    PA_CHECK(scaling.factor > 0.f, "rope: linear rope_scaling needs factor > 0, got ",
             scaling.factor);
    for (double& f : inv) f /= scaling.factor;
    return inv;
  }
  if (scaling.type == "yarn") return yarn_inv_freq(inv, head_dim, theta, scaling);
  PA_CHECK(scaling.type == "llama3", "rope: rope_scaling type '", scaling.type,
           "' is not supported (linear, llama3, yarn)");
  PA_CHECK(scaling.factor > 0.f && scaling.high_freq_factor > scaling.low_freq_factor &&
               scaling.low_freq_factor > 0.f && scaling.original_max_position > 0,
           "rope: rope_scaling needs factor > 0, high_freq_factor > low_freq_factor > 0 and "
           "original_max_position > 0");
  // Wavelengths longer than original / low_freq_factor are slowed by `factor`; shorter than
  // original / high_freq_factor kept; in between a linear blend in original / wavelength.
  const double orig = scaling.original_max_position;
  const double lo = scaling.low_freq_factor, hi = scaling.high_freq_factor;
  const double low_wavelen = orig / lo, high_wavelen = orig / hi;
  for (double& f : inv) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen > low_wavelen) {
      f /= scaling.factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (orig / wavelen - lo) / (hi - lo);
      f = (1.0 - smooth) * f / scaling.factor + smooth * f;
    }
  }
  return inv;
}

void rope_tables(const std::vector<double>& inv_freq, const int32_t* positions, int32_t num_tokens,
                 float* cos, float* sin, double scale) {
  const size_t half = inv_freq.size();
  for (int32_t t = 0; t < num_tokens; ++t) {
    for (size_t i = 0; i < half; ++i) {
      const double angle = double(positions[t]) * inv_freq[i];
      cos[size_t(t) * half + i] = float(std::cos(angle) * scale);
      sin[size_t(t) * half + i] = float(std::sin(angle) * scale);
    }
  }
}

void rope_apply(float* x, int32_t num_tokens, int32_t num_heads, int32_t head_dim, const float* cos,
                const float* sin) {
  const int32_t half = head_dim / 2;
  for (int32_t t = 0; t < num_tokens; ++t) {
    const float* c = cos + int64_t(t) * half;
    const float* s = sin + int64_t(t) * half;
    for (int32_t h = 0; h < num_heads; ++h) {
      float* v = x + (int64_t(t) * num_heads + h) * head_dim;
      for (int32_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}

}  // namespace pagedattn
