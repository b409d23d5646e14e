// Error checks for CUDA, cuBLAS(Lt) and NCCL calls: a failing call throws ddiloco::Error
// naming the call, the library's error string and file:line.
//
// Kept free of fmt and of the CUDA headers' C++ wrappers so it compiles under nvcc and the
// host compiler alike; the throwing functions live in src/gpu/check.cpp.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace ddiloco::gpu {

/// Throw ddiloco::Error("CUDA error <name> (<string>) in <call> at <file>:<line>").
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file,
                                   int line);
/// Same for a cublasStatus_t (cuBLAS and cuBLASLt share it).
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file,
                                     int line);

/// Throw ddiloco::Error(message): for .cu files, which keep fmt (and its C++20 consteval
/// format strings, which nvcc's front end rejects) out of device compilation.
[[noreturn]] void throw_error(const char* message);

/// True when cudaGetDeviceCount reports at least one usable device. Never throws: a machine
/// without a driver reports false (tests use it to skip).
bool cuda_device_available();

}  // namespace ddiloco::gpu

#define DDILOCO_CUDA_CHECK(call)                                                   \
  do {                                                                             \
    const cudaError_t ddiloco_status_ = (call);                                    \
    if (ddiloco_status_ != cudaSuccess)                                            \
      ::ddiloco::gpu::throw_cuda_error(ddiloco_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define DDILOCO_CUBLAS_CHECK(call)                                                   \
  do {                                                                               \
    const cublasStatus_t ddiloco_status_ = (call);                                   \
    if (ddiloco_status_ != CUBLAS_STATUS_SUCCESS)                                    \
      ::ddiloco::gpu::throw_cublas_error(ddiloco_status_, #call, __FILE__, __LINE__); \
  } while (0)

/// After a kernel launch: launch-configuration errors surface here (asynchronous faults
/// surface at the next synchronising call).
#define DDILOCO_CUDA_CHECK_LAUNCH() DDILOCO_CUDA_CHECK(cudaGetLastError())
