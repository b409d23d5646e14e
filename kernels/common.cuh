// Device helpers shared by the kernels: warp/block reductions, bf16 vector loads, launch math.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ddiloco/gpu/check.hpp"
#include "ddiloco/gpu/kernels.hpp"

namespace ddiloco::gpu::detail {

constexpr int kWarp = 32;

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = kWarp / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ double warp_sum(double x) {
  for (int o = kWarp / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
  for (int o = kWarp / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

/// Sum over the whole block (blockDim.x a multiple of 32, ≤ 1024); every thread gets it.
/// `shared` holds ≥ 32 values of T; the function syncs before reusing it.
template <typename T>
__device__ __forceinline__ T block_sum(T x, T* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  x = warp_sum(x);
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  T total = lane < warps ? shared[lane] : T(0);
  return warp_sum(total);
}

__device__ __forceinline__ float block_max(float x, float* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  float m = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(m);
}

/// Eight bf16 in one 16-byte load/store (callers guarantee 16-byte alignment).
struct alignas(16) Bf16x8 {
  __nv_bfloat16 v[8];
};

__device__ __forceinline__ Bf16x8 load8(const __nv_bfloat16* p) {
  Bf16x8 r;
  *reinterpret_cast<uint4*>(&r) = *reinterpret_cast<const uint4*>(p);
  return r;
}
__device__ __forceinline__ void store8(__nv_bfloat16* p, const Bf16x8& x) {
  *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&x);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline unsigned blocks_for(size_t n, int threads) {
  const size_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

/// Grid size for grid-stride loops: enough blocks to fill the device several times over,
/// never more than the work needs.
inline unsigned grid_stride_blocks(size_t n, int threads) {
  static int sms = [] {
    int dev = 0, count = 0;
    DDILOCO_CUDA_CHECK(cudaGetDevice(&dev));
    DDILOCO_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev));
    return count;
  }();
  const size_t want = static_cast<size_t>(sms) * 8;
  const size_t need = (n + threads - 1) / threads;
  return static_cast<unsigned>(need < 1 ? 1 : (need < want ? need : want));
}

}  // namespace ddiloco::gpu::detail

namespace ddiloco::gpu::detail {

/// VW consecutive bf16 → fp32 (VW = 8: one 16-byte load, 16-byte aligned; VW = 1: scalar).
template <int VW>
__device__ __forceinline__ void load_f(const __nv_bfloat16* p, float* out) {
  if constexpr (VW == 8) {
    const Bf16x8 x = load8(p);
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = __bfloat162float(x.v[k]);
  } else {
#pragma unroll
    for (int k = 0; k < VW; ++k) out[k] = __bfloat162float(p[k]);
  }
}
template <int VW>
__device__ __forceinline__ void store_f(__nv_bfloat16* p, const float* in) {
  if constexpr (VW == 8) {
    Bf16x8 x;
#pragma unroll
    for (int k = 0; k < 8; ++k) x.v[k] = __float2bfloat16_rn(in[k]);
    store8(p, x);
  } else {
#pragma unroll
    for (int k = 0; k < VW; ++k) p[k] = __float2bfloat16_rn(in[k]);
  }
}

}  // namespace ddiloco::gpu::detail
