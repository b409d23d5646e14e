// Shared by the GPU tests: skip where there is no CUDA device.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "ddiloco/gpu/check.hpp"

/// First statement of every GPU test: on a machine with the toolkit but no GPU (CI, the
/// CPU dev boxes) the test is reported as skipped, not failed.
#define DDILOCO_REQUIRE_GPU()                                              \
  do {                                                                     \
    if (!::ddiloco::gpu::cuda_device_available())                          \
      GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount found none";     \
  } while (0)

namespace ddiloco::gpu::test {

/// Compute capability major version of the current device (9 = Hopper), 0 if unknown.
inline int device_major() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
    return 0;
  return major;
}

}  // namespace ddiloco::gpu::test
