// The KV budget: how many pages a config's tokens, MiB or fraction of free memory buy, and which
// dtype the cache holds (src/engine/kv_budget.cpp, kv_memory.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "pagedattn/dtype.h"
#include "pagedattn/engine_config.h"
#include "pagedattn/model_file.h"

namespace pagedattn {

// Pages for a config (validates the budget fields; throws Error naming the one
// at fault).
int32_t kv_num_pages(const EngineConfig& config, const ModelConfig& model, DType kv_dtype);
// --kv-cache-memory: MiB ("512", any value >= 1), a fraction ("0.5", in (0, 1)) or a percentage
// ("50%") of free memory. Exactly one of the fields is set. Throws Error ("kv_cache_memory: ...").
struct KvMemorySpec {
  double mib = 0;
  double fraction = 0;
};
KvMemorySpec parse_kv_cache_memory(const std::string& text);
// Bytes of MemAvailable in /proc/meminfo's text.
int64_t parse_mem_available(const std::string& meminfo);
// Free memory: cudaMemGetInfo's free bytes on CUDA, MemAvailable on the CPU.
int64_t free_memory_bytes(Device device);
// MiB that a fraction of free_bytes buys (validates the fraction).
double kv_fraction_mib(double fraction, int64_t free_bytes);
// "auto" -> the compute dtype of device's runner (f32 on the CPU, bf16 on CUDA), else parse_dtype.
DType resolve_kv_dtype(const std::string& name, Device device = Device::cpu);

}  // namespace pagedattn
