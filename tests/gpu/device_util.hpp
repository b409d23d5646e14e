// Helpers for the GPU tests: device arrays, bf16 rounding on the host, error measures.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ddiloco/gpu/check.hpp"
#include "ddiloco/rng.hpp"

namespace ddiloco::gpu::test {

/// Owning device array of n T, filled from / read back to host vectors (synchronous).
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    DDILOCO_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(n, 1) * sizeof(T)));
    DDILOCO_CUDA_CHECK(cudaMemset(p_, 0, std::max<size_t>(n, 1) * sizeof(T)));
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  void upload(const std::vector<T>& host) {
    DDILOCO_CUDA_CHECK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    DDILOCO_CUDA_CHECK(cudaDeviceSynchronize());
    DDILOCO_CUDA_CHECK(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_;
};

inline float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

/// n values N(0, scale²), rounded to bf16 so the CPU reference and the GPU see the same inputs.
inline std::vector<float> random_bf16_values(size_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = round_bf16(static_cast<float>(scale * rng.normal()));
  return v;
}

inline std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16_rn(v[i]);
  return out;
}

inline std::vector<float> to_float(const std::vector<__nv_bfloat16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __bfloat162float(v[i]);
  return out;
}

/// max|got − want| / max|want|: the error relative to the tensor's scale, the measure the
/// bf16 tolerances are stated in (a bf16 value carries 8 significant bits, rel. 2⁻⁹ ≈ 2e-3
/// per rounding). NaN anywhere gives +inf.
inline double scaled_error(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  double scale = 0, err = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, static_cast<double>(std::abs(want[i])));
    const double e = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(e <= err)) err = std::isnan(e) ? INFINITY : e;
  }
  return scale > 0 ? err / scale : err;
}

}  // namespace ddiloco::gpu::test
