// The KV budget as a fraction of free memory: parsing --kv-cache-memory and reading free memory
// (cudaMemGetInfo on CUDA, MemAvailable of /proc/meminfo on the CPU).
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "pagedattn/engine.h"
#include "pagedattn/error.h"

#ifdef PAGEDATTN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace pagedattn {

KvMemorySpec parse_kv_cache_memory(const std::string &text) {
  std::string s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  const bool percent = !s.empty() && s.back() == '%';
  if (percent) s.pop_back();
  PA_CHECK(!s.empty(), "kv_cache_memory: '", text, "' is empty");
  errno = 0;
  char *end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  PA_CHECK(end == s.c_str() + s.size() && errno == 0 && std::isfinite(v), "kv_cache_memory: '",
           text, "' is not a number of MiB, a fraction (0.5) or a percentage (50%)");
  KvMemorySpec spec;
  if (percent) {
    PA_CHECK(v > 0 && v <= 100, "kv_cache_memory: percentage '", text, "' is not in (0, 100]");
    spec.fraction = v / 100.0;
  } else if (v > 0 && v < 1) {
    spec.fraction = v;
  } else {
    PA_CHECK(v >= 1, "kv_cache_memory: '", text,
             "' must be a fraction in (0, 1), a percentage or at least 1 MiB");
    spec.mib = v;
  }
  return spec;
}

int64_t parse_mem_available(const std::string &meminfo) {
  std::istringstream in(meminfo);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    int64_t kib = -1;
    std::string unit;
    fields >> kib >> unit;
    PA_CHECK(kib >= 0 && unit == "kB", "parse_mem_available: malformed line '", line, "'");
    return kib * 1024;
  }
  fail("parse_mem_available: no MemAvailable line");
}

int64_t free_memory_bytes(Device device) {
  if (device == Device::cuda) {
#ifdef PAGEDATTN_HAVE_CUDA
    size_t free_b = 0, total_b = 0;
    const cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
    PA_CHECK(e == cudaSuccess, "free_memory_bytes: cudaMemGetInfo: ", cudaGetErrorString(e));
    return int64_t(free_b);
#else
    fail("free_memory_bytes: pagedattn was built without CUDA support");
#endif
  }
  std::ifstream f("/proc/meminfo");
  PA_CHECK(f.good(), "free_memory_bytes: cannot read /proc/meminfo");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_mem_available(ss.str());
}

double kv_fraction_mib(double fraction, int64_t free_bytes) {
  PA_CHECK(std::isfinite(fraction) && fraction > 0 && fraction <= 1,
           "Engine: kv_cache_memory_fraction must be in (0, 1], got ", fraction);
  PA_CHECK(free_bytes >= 0, "Engine: free memory must be >= 0 bytes, got ", free_bytes);
  return fraction * double(free_bytes) / (1024.0 * 1024.0);
}

}  // namespace pagedattn
