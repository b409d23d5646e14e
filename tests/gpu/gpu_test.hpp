// Shared by the GPU tests: skip where there is no CUDA device.
#pragma once

#include <gtest/gtest.h>

#include "ddiloco/gpu/check.hpp"

/// First statement of every GPU test: on a machine with the toolkit but no GPU (CI, the
/// CPU dev boxes) the test is reported as skipped, not failed.
#define DDILOCO_REQUIRE_GPU()                                              \
  do {                                                                     \
    if (!::ddiloco::gpu::cuda_device_available())                          \
      GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount found none";     \
  } while (0)
