// The memory bandwidth a benchmark compares itself with: a device-to-device copy on the current
// CUDA device, measured in the same run.
#pragma once

#include <cstddef>
#include <string>

namespace pagedattn::bench {

struct CopyBandwidth {
  std::string device;    // the GPU's name
  size_t bytes = 0;      // bytes copied per run (each read once and written once)
  double median_us = 0;  // one copy
  double gbps = 0;       // (read + written) bytes / median time, in GB/s (1e9 bytes)
};

// Copies `bytes` from one device buffer to another with cudaMemcpyAsync, `iters` times after two
// warm-up copies, each timed by CUDA events; reports the median. Throws Error without a usable
// CUDA device (or in builds without CUDA) or when a CUDA call fails.
CopyBandwidth measure_copy_bandwidth(size_t bytes = size_t(1) << 30, int iters = 10);

}  // namespace pagedattn::bench

namespace pagedattn::tools {
// NOTE: `pagedattn bench model` (tools/cmd_bench_model.cpp) names these from the CLI's namespace.
using bench::CopyBandwidth;
using bench::measure_copy_bandwidth;
}  // namespace pagedattn::tools
