// paged_attention_reference: the oracle. Gathers each sequence's K/V to dense (dequantised, fp8
// times its head's scale), then a plain two-pass softmax in double precision, one query at a time.
// Written for clarity, not speed.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention_internal.h"
#include "pagedattn/attention.h"
#include "pagedattn/error.h"

namespace pagedattn {

void paged_attention_reference(const QKVTensor& q, const PagedKVView& kv, const BatchLayout& batch,
                               const AttentionOptions& opt, QKVTensor& out) {
  validate_paged_attention(q, kv, batch, opt, out);
  detail::check_host_fp8_scales(kv);

  const int32_t Hq = q.num_heads, Hk = kv.num_kv_heads, D = kv.head_dim, P = kv.page_size;
  const int32_t group = Hq / Hk;
  const double scale = detail::attention_scale(opt, D);
  const bool fp8 = kv.dtype == DType::fp8_e4m3;

  std::vector<double> k, v, logits, acc(static_cast<size_t>(D));
  for (int32_t b = 0; b < batch.num_seqs; ++b) {
    const int32_t q0 = batch.q_indptr[b], q_len = batch.q_indptr[b + 1] - q0;
    const int32_t L = batch.kv_len[b];
    if (q_len == 0) continue;
    // Gather: k, v are [L][Hk][D].
    k.assign(size_t(L) * Hk * D, 0.0);
    v.assign(size_t(L) * Hk * D, 0.0);
    for (int32_t p = 0; p < L; ++p) {
      const int32_t page = batch.block_table[int64_t(b) * batch.max_pages_per_seq + p / P];
      for (int32_t g = 0; g < Hk; ++g) {
        const int64_t src = kv.offset(page, g, p % P);
        const double ks = fp8 ? kv.k_scale[g] : 1.0, vs = fp8 ? kv.v_scale[g] : 1.0;
        for (int32_t d = 0; d < D; ++d) {
          const size_t dst = (size_t(p) * Hk + g) * D + d;
          k[dst] = double(load_as_f32(kv.k_pages, kv.dtype, src + d)) * ks;
          v[dst] = double(load_as_f32(kv.v_pages, kv.dtype, src + d)) * vs;
        }
      }
    }
    logits.assign(size_t(L), 0.0);
    for (int32_t j = 0; j < q_len; ++j) {
      const int64_t pos = int64_t(L) - q_len + j;
      for (int32_t h = 0; h < Hq; ++h) {
        const int32_t g = h / group;
        const int64_t qrow = (int64_t(q0 + j) * Hq + h) * D;
        // Pass 1: logits and their max.
        double max_logit = -std::numeric_limits<double>::infinity();
        bool any = false;
        for (int32_t t = 0; t < L; ++t) {
          const bool visible =
              (!opt.causal || t <= pos) && (opt.window == 0 || t > pos - opt.window);
          if (!visible) {
            logits[size_t(t)] = -std::numeric_limits<double>::infinity();
            continue;
          }
          double dot = 0.0;
          const double* kr = &k[(size_t(t) * Hk + g) * D];
          for (int32_t d = 0; d < D; ++d)
            dot += double(load_as_f32(q.data, q.dtype, qrow + d)) * kr[d];
          double x = dot * scale;
          if (opt.softcap > 0.f) x = opt.softcap * std::tanh(x / opt.softcap);
          logits[size_t(t)] = x;
          max_logit = std::max(max_logit, x);
          any = true;
        }
        // Pass 2: normalised weights times V.
        std::fill(acc.begin(), acc.end(), 0.0);
        double sum = 0.0;
        if (any) {
          for (int32_t t = 0; t < L; ++t) {
            if (logits[size_t(t)] == -std::numeric_limits<double>::infinity()) continue;
            const double w = std::exp(logits[size_t(t)] - max_logit);
            sum += w;
            const double* vr = &v[(size_t(t) * Hk + g) * D];
            for (int32_t d = 0; d < D; ++d) acc[size_t(d)] += w * vr[d];
          }
        }
        const int64_t orow = (int64_t(q0 + j) * Hq + h) * D;
        for (int32_t d = 0; d < D; ++d)
          store_from_f32(out.data, out.dtype, orow + d, any ? float(acc[size_t(d)] / sum) : 0.f);
      }
    }
  }
}

}  // namespace pagedattn
