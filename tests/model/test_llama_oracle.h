// An independent, naive Llama-family forward in double precision: dense causal attention over one
// sequence, no paging, no BLAS, straightforward loops. The oracle of the LlamaModel tests.
#pragma once

#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "pagedattn/model_file.h"

namespace pagedattn::test {

class NaiveLlama {
 public:
  explicit NaiveLlama(const ModelFile& f) : f_(f), c_(f.config) {
    if (c_.head_dim == 0) c_.head_dim = c_.hidden_size / c_.num_q_heads;
  }

  // Logits of every position of `tokens` as one sequence: [tokens.size()][vocab].
  std::vector<std::vector<double>> logits(const std::vector<int32_t>& tokens) const {
    const size_t N = tokens.size();
    const int n = int(N), H = c_.hidden_size, D = c_.head_dim;
    const int Hq = c_.num_q_heads, Hkv = c_.num_kv_heads, I = c_.intermediate_size;
    using Mat = std::vector<std::vector<double>>;
    Mat x(N, std::vector<double>(static_cast<size_t>(H)));
    for (int t = 0; t < n; ++t) {
      for (int i = 0; i < H; ++i) x[t][i] = w("model.embed_tokens.weight")[tokens[t] * H + i];
    }
    const std::vector<double> freq = frequencies();
    for (int l = 0; l < c_.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      Mat q(N), k(N), v(N);
      for (int t = 0; t < n; ++t) {
        const std::vector<double> h = norm(x[t], w(p + "input_layernorm.weight"));
        q[t] = linear(h, p + "self_attn.q_proj", Hq * D);
        k[t] = linear(h, p + "self_attn.k_proj", Hkv * D);
        v[t] = linear(h, p + "self_attn.v_proj", Hkv * D);
        if (c_.qk_norm) {
          head_norm(q[t], Hq, w(p + "self_attn.q_norm.weight"));
          head_norm(k[t], Hkv, w(p + "self_attn.k_norm.weight"));
        }
        rotate(q[t], Hq, t, freq);
        rotate(k[t], Hkv, t, freq);
      }
      for (int t = 0; t < n; ++t) {
        std::vector<double> att(static_cast<size_t>(Hq * D), 0.0);
        for (int hq = 0; hq < Hq; ++hq) {
          const int hk = hq / (Hq / Hkv);
          const int first = c_.sliding_window > 0 ? std::max(0, t - c_.sliding_window + 1) : 0;
          std::vector<double> s;
          double mx = -1e300;
          for (int u = first; u <= t; ++u) {
            double dot = 0.0;
            for (int d = 0; d < D; ++d) dot += q[t][hq * D + d] * k[u][hk * D + d];
            s.push_back(dot / std::sqrt(double(D)));
            mx = std::max(mx, s.back());
          }
          double sum = 0.0;
          for (double& e : s) sum += (e = std::exp(e - mx));
          for (int u = first; u <= t; ++u) {
            for (int d = 0; d < D; ++d) att[hq * D + d] += s[u - first] / sum * v[u][hk * D + d];
          }
        }
        const std::vector<double> o = linear(att, p + "self_attn.o_proj", H, false);
        for (int i = 0; i < H; ++i) x[t][i] += o[i];
        const std::vector<double> h = norm(x[t], w(p + "post_attention_layernorm.weight"));
        const std::vector<double> g = linear(h, p + "mlp.gate_proj", I, false);
        const std::vector<double> up = linear(h, p + "mlp.up_proj", I, false);
        std::vector<double> a(static_cast<size_t>(I));
        for (int i = 0; i < I; ++i) a[i] = g[i] / (1.0 + std::exp(-g[i])) * up[i];
        const std::vector<double> dn = linear(a, p + "mlp.down_proj", H, false);
        for (int i = 0; i < H; ++i) x[t][i] += dn[i];
      }
    }
    const std::string head = f_.tensors.count("lm_head.weight") ? "lm_head" : "model.embed_tokens";
    Mat out(N);
    for (int t = 0; t < n; ++t) {
      out[t] = linear(norm(x[t], w("model.norm.weight")), head, c_.vocab_size, false);
    }
    return out;
  }

 private:
  const float* w(const std::string& name) const { return f_.tensors.at(name).data_as<float>(); }

  std::vector<double> norm(const std::vector<double>& x, const float* g) const {
    double ss = 0.0;
    for (double e : x) ss += e * e;
    const double r = 1.0 / std::sqrt(ss / double(x.size()) + c_.rms_norm_eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * g[i];
    return y;
  }
  void head_norm(std::vector<double>& x, int heads, const float* g) const {
    const int D = c_.head_dim;
    for (int h = 0; h < heads; ++h) {
      std::vector<double> part(x.begin() + h * D, x.begin() + (h + 1) * D);
      part = norm(part, g);
      std::copy(part.begin(), part.end(), x.begin() + h * D);
    }
  }
  std::vector<double> linear(const std::vector<double>& x, const std::string& name, int out,
                             bool maybe_bias = true) const {
    const float* W = w(name + ".weight");
    const bool bias = maybe_bias && c_.attention_bias;
    std::vector<double> y(static_cast<size_t>(out));
    for (int o = 0; o < out; ++o) {
      double s = bias ? double(w(name + ".bias")[o]) : 0.0;
      for (size_t i = 0; i < x.size(); ++i) s += double(W[o * x.size() + i]) * x[i];
      y[o] = s;
    }
    return y;
  }
  // theta^(-2i/D), then the Llama-3 rescaling written in terms of the wavelength ratio.
  std::vector<double> frequencies() const {
    const int D = c_.head_dim;
    std::vector<double> f;
    for (int i = 0; i < D / 2; ++i) f.push_back(1.0 / std::pow(double(c_.rope_theta), 2.0 * i / D));
    if (c_.rope_scaling.type != "llama3") return f;
    const RopeScaling& s = c_.rope_scaling;
    for (double& e : f) {
      const double ratio = double(s.original_max_position) * e / (2.0 * std::numbers::pi);
      if (ratio < s.low_freq_factor) {
        e = e / s.factor;
      } else if (ratio <= s.high_freq_factor) {
        const double a = (ratio - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        e = a * e + (1.0 - a) * e / s.factor;
      }
    }
    return f;
  }
  void rotate(std::vector<double>& x, int heads, int pos, const std::vector<double>& f) const {
    const int D = c_.head_dim, half = D / 2;
    for (int h = 0; h < heads; ++h) {
      double* v = x.data() + h * D;
      for (int i = 0; i < half; ++i) {
        const double c = std::cos(pos * f[i]), s = std::sin(pos * f[i]);
        const double a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = a * s + b * c;
      }
    }
  }

  const ModelFile& f_;
  ModelConfig c_;
};

}  // namespace pagedattn::test
