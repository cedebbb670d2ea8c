// The KV budget: how many pages a config's tokens or MiB buy, and the cache
// dtype.
#include <algorithm>
#include <cmath>
#include <limits>

#include "pagedattn/engine.h"
#include "pagedattn/error.h"

namespace pagedattn {

DType resolve_kv_dtype(const std::string &name, Device device) {
  if (name == "auto") return device == Device::cuda ? DType::bf16 : DType::f32;
  try {
    return parse_dtype(name);
  } catch (const Error &) {
    fail("Engine: kv_cache_dtype '", name, "' is not one of auto, f32, f16, bf16, fp8");
  }
}

int32_t kv_num_pages(const EngineConfig &config, const ModelConfig &model, DType kv_dtype) {
  PA_CHECK(config.page_size >= 1 && config.page_size <= 1024,
           "Engine: page_size must be in [1, 1024], got ", config.page_size);
  PA_CHECK(config.kv_cache_tokens >= 0, "Engine: kv_cache_tokens must be >= 0, got ",
           config.kv_cache_tokens);
  PA_CHECK(std::isfinite(config.kv_cache_memory_mib) && config.kv_cache_memory_mib >= 0,
           "Engine: kv_cache_memory must be >= 0 MiB, got ", config.kv_cache_memory_mib);
  PA_CHECK(std::isfinite(config.kv_cache_memory_fraction) && config.kv_cache_memory_fraction >= 0 &&
               config.kv_cache_memory_fraction <= 1,
           "Engine: kv_cache_memory_fraction must be in (0, 1] (0: off), got ",
           config.kv_cache_memory_fraction);
  PA_CHECK(model.num_layers > 0 && model.num_kv_heads > 0 && model.head_dim > 0,
           "Engine: model config has no layers, KV heads or head_dim");
  int64_t pages = 0;
  const int64_t bs = config.page_size;
  if (config.kv_cache_tokens > 0) {
    pages = (config.kv_cache_tokens + bs - 1) / bs;
  } else {
    const double mib =
        config.kv_cache_memory_mib > 0 ? config.kv_cache_memory_mib : EngineConfig::kDefaultKvMiB;
    const double page_bytes = 2.0 * model.num_layers * model.num_kv_heads * model.head_dim *
                              double(config.page_size) * double(dtype_size(kv_dtype));
    pages = int64_t(std::floor(mib * 1024.0 * 1024.0 / page_bytes));
    PA_CHECK(pages >= 1, "Engine: kv_cache_memory of ", mib, " MiB holds no page of ", page_bytes,
             " bytes");
    if (config.kv_cache_memory_mib == 0) {
      // The default: no more than every sequence at its longest context needs.
      const int64_t len =
          config.max_model_len > 0 ? config.max_model_len : model.max_position_embeddings;
      const int64_t seqs = std::max<int32_t>(config.max_num_seqs, 1);
      if (len > 0) pages = std::min(pages, seqs * ((len + bs - 1) / bs));
    }
  }
  PA_CHECK(pages <= std::numeric_limits<int32_t>::max(), "Engine: the KV budget asks for ", pages,
           " pages, more than page ids can address");
  return int32_t(pages);
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds(std::move(upper_bounds)), counts(bounds.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds.size() && value > bounds[i]) ++i;
  ++counts[i];
  sum += value;
  ++count;
}

}  // namespace pagedattn
