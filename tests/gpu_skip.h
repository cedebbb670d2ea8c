// Every GPU test starts with PA_SKIP_WITHOUT_GPU(): counted as skipped, not passed, where no CUDA
// device is usable (cuda_device_count treats any CUDA error, such as no driver, as none).
#pragma once

#include <gtest/gtest.h>

#include "pagedattn/tensor.h"

#define PA_SKIP_WITHOUT_GPU() \
  if (::pagedattn::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"
