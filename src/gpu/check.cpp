// Throwing halves of the DDILOCO_*_CHECK macros (include/ddiloco/gpu/check.hpp).
#include "ddiloco/gpu/check.hpp"

#include "ddiloco/error.hpp"

namespace ddiloco::gpu {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  fail("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(status),
       cudaGetErrorString(status), call, file, line);
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  fail("cuBLAS error {} ({}) in {} at {}:{}", cublasGetStatusName(status),
       cublasGetStatusString(status), call, file, line);
}

void throw_error(const char* message) { throw Error(message); }

bool cuda_device_available() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  return count > 0;
}

}  // namespace ddiloco::gpu
