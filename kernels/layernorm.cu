// LayerNorm forward and backward (layers::layernorm_forward/backward), one warp per row.
// Rows of C bf16 are read with 16-byte loads when C % 8 == 0 and the pointers are aligned
// (VW = 8), else element by element (VW = 1). Statistics and all sums are fp32.
#include <initializer_list>

#include "common.cuh"

namespace ddiloco::gpu {
namespace {

using detail::kWarp;
using detail::load_f;
using detail::store_f;
using detail::warp_sum;

constexpr int kRowsPerBlock = 8;  // warps per block
constexpr float kEps = 1e-5f;

template <int VW>
__global__ void layernorm_forward_kernel(bf16* out, float* mean, float* rstd, const bf16* inp,
                                         const bf16* w, const bf16* b, int N, int C) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= N) return;
  const bf16* x = inp + static_cast<size_t>(row) * C;
  float buf[VW];
  float s = 0.0f;
  for (int c = lane * VW; c < C; c += kWarp * VW) {
    load_f<VW>(x + c, buf);
#pragma unroll
    for (int k = 0; k < VW; ++k) s += buf[k];
  }
  const float m = warp_sum(s) / C;
  // Second pass for the variance: Σ(x−m)² is exact where E[x²]−m² would cancel.
  float v = 0.0f;
  for (int c = lane * VW; c < C; c += kWarp * VW) {
    load_f<VW>(x + c, buf);
#pragma unroll
    for (int k = 0; k < VW; ++k) v += (buf[k] - m) * (buf[k] - m);
  }
  const float r = rsqrtf(warp_sum(v) / C + kEps);
  bf16* y = out + static_cast<size_t>(row) * C;
  float wv[VW], bv[VW];
  for (int c = lane * VW; c < C; c += kWarp * VW) {
    load_f<VW>(x + c, buf);
    load_f<VW>(w + c, wv);
    load_f<VW>(b + c, bv);
#pragma unroll
    for (int k = 0; k < VW; ++k) buf[k] = (buf[k] - m) * r * wv[k] + bv[k];
    store_f<VW>(y + c, buf);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// Each block walks rows with a stride of gridDim.x·8 and keeps its dw/db partial sums in
// shared memory (2·C floats) when they fit (kSharedMaxC), else adds straight to global.
constexpr int kSharedMaxC = 6144;  // 48 KiB of dw + db

template <int VW, bool kShared>
__global__ void layernorm_backward_kernel(bf16* dinp, float* dw, float* db, const bf16* dout,
                                          const bf16* inp, const bf16* w, const float* mean,
                                          const float* rstd, int N, int C) {
  extern __shared__ float smem[];
  float* sdw = kShared ? smem : dw;
  float* sdb = kShared ? smem + C : db;
  if constexpr (kShared) {
    for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) smem[c] = 0.0f;
    __syncthreads();
  }
  const int lane = threadIdx.x % kWarp;
  for (int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp; row < N;
       row += gridDim.x * kRowsPerBlock) {
    const size_t off = static_cast<size_t>(row) * C;
    const float m = mean[row], r = rstd[row];
    float xv[VW], dv[VW], wv[VW];
    // Pass 1: mean(g) and mean(g·x̂) with g = dout·w.
    float sg = 0.0f, sgx = 0.0f;
    for (int c = lane * VW; c < C; c += kWarp * VW) {
      load_f<VW>(inp + off + c, xv);
      load_f<VW>(dout + off + c, dv);
      load_f<VW>(w + c, wv);
#pragma unroll
      for (int k = 0; k < VW; ++k) {
        const float g = dv[k] * wv[k];
        sg += g;
        sgx += g * (xv[k] - m) * r;
      }
    }
    const float mg = warp_sum(sg) / C, mgx = warp_sum(sgx) / C;
    // Pass 2: dx (accumulated into the bf16 residual gradient), dw, db.
    float di[VW];
    for (int c = lane * VW; c < C; c += kWarp * VW) {
      load_f<VW>(inp + off + c, xv);
      load_f<VW>(dout + off + c, dv);
      load_f<VW>(w + c, wv);
      load_f<VW>(dinp + off + c, di);
#pragma unroll
      for (int k = 0; k < VW; ++k) {
        const float xh = (xv[k] - m) * r;
        di[k] += r * (dv[k] * wv[k] - mg - xh * mgx);
        atomicAdd(sdw + c + k, dv[k] * xh);
        atomicAdd(sdb + c + k, dv[k]);
      }
      store_f<VW>(dinp + off + c, di);
    }
  }
  if constexpr (kShared) {
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      atomicAdd(dw + c, sdw[c]);
      atomicAdd(db + c, sdb[c]);
    }
  }
}

bool vectorisable(int C, std::initializer_list<const void*> ptrs) {
  if (C % 8 != 0) return false;
  for (const void* p : ptrs)
    if (!detail::aligned16(p)) return false;
  return true;
}

}  // namespace

void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* w,
                       const bf16* b, int N, int C, cudaStream_t stream) {
  const unsigned grid = detail::blocks_for(N, kRowsPerBlock);
  const int threads = kRowsPerBlock * kWarp;
  if (vectorisable(C, {out, inp, w, b}))
    layernorm_forward_kernel<8><<<grid, threads, 0, stream>>>(out, mean, rstd, inp, w, b, N, C);
  else
    layernorm_forward_kernel<1><<<grid, threads, 0, stream>>>(out, mean, rstd, inp, w, b, N, C);
  DDILOCO_CUDA_CHECK_LAUNCH();
}

void layernorm_backward(bf16* dinp, float* dw, float* db, const bf16* dout, const bf16* inp,
                        const bf16* w, const float* mean, const float* rstd, int N, int C,
                        cudaStream_t stream) {
  // Enough blocks to fill the GPU, few enough that the per-block flush of dw/db (2·C atomics)
  // stays small against the N·C work.
  const unsigned grid = detail::grid_stride_blocks(static_cast<size_t>(N), kRowsPerBlock) / 4 + 1;
  const int threads = kRowsPerBlock * kWarp;
  const bool vec = vectorisable(C, {dinp, dout, inp, w});
  if (C <= kSharedMaxC) {
    const size_t shared = 2 * static_cast<size_t>(C) * sizeof(float);
    if (vec)
      layernorm_backward_kernel<8, true><<<grid, threads, shared, stream>>>(
          dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    else
      layernorm_backward_kernel<1, true><<<grid, threads, shared, stream>>>(
          dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  } else {
    if (vec)
      layernorm_backward_kernel<8, false><<<grid, threads, 0, stream>>>(dinp, dw, db, dout, inp,
                                                                       w, mean, rstd, N, C);
    else
      layernorm_backward_kernel<1, false><<<grid, threads, 0, stream>>>(dinp, dw, db, dout, inp,
                                                                       w, mean, rstd, N, C);
  }
  DDILOCO_CUDA_CHECK_LAUNCH();
}

}  // namespace ddiloco::gpu
