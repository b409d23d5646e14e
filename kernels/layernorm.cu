// LayerNorm forward and backward (layers::layernorm_forward/backward), one warp per row.
// Rows of C bf16 are read with 16-byte loads when C % 8 == 0 and the pointers are aligned
// (VW = 8), else element by element (VW = 1). Statistics and all sums are fp32.
#include <initializer_list>
#include <map>
#include <mutex>
#include <tuple>

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

// LayerNorm backward's first pass over one row (a warp, lane = its lane): the row means
// mg = mean(g) and mgx = mean(g·x̂) of g = dout·w, x̂ = (inp − m)·r, over C columns.
template <int VW>
__device__ __forceinline__ void row_grad_means(float& mg, float& mgx, const bf16* dout,
                                               const bf16* inp, const bf16* w, float m, float r,
                                               int C, int lane) {
  float xv[VW], dv[VW], wv[VW];
  float sg = 0.0f, sgx = 0.0f;
  for (int c = lane * VW; c < C; c += kWarp * VW) {
    load_f<VW>(inp + c, xv);
    load_f<VW>(dout + c, dv);
    load_f<VW>(w + c, wv);
#pragma unroll
    for (int k = 0; k < VW; ++k) {
      const float g = dv[k] * wv[k];
      sg += g;
      sgx += g * (xv[k] - m) * r;
    }
  }
  mg = warp_sum(sg) / C;
  mgx = warp_sum(sgx) / C;
}

// Backward, fast path: each block walks rows with a stride of gridDim.x·8 (one warp per row).
// Every warp owns 2·C floats of shared memory (its dw and db partial sums) and inside a warp
// each lane owns the columns it loads, so the per-element accumulation is a plain shared
// read-modify-write with no atomics and no contention; at the end the block adds its 8 warps'
// partial sums in a fixed order and flushes them with one fp32 atomic per column (2·C per
// block, gridDim.x ≈ one wave of blocks). Needs 8·2·C floats of shared memory (C ≤ ~3600 on
// sm_90); larger C takes layernorm_backward_global_kernel.
// (The previous kernel shared one dw/db array among the 8 warps and issued 2 shared fp32
// atomics per element: 0.26 ms per call on 16384×768 on the H200, ~10× the memory bound.)
// Per-warp shared partial sums are laid out so that a warp's accesses are bank-conflict free:
// the element k of the VW-vector that lane l loads at column c = j·32·VW + l·VW lives at
// j·32·VW + k·32 + l (for VW = 1 that is c itself). Each array is padded to a multiple of
// 32·VW floats. (Indexing by c directly made the 32 lanes hit 4 banks: 8-way conflicts on
// every shared read and write, ~50 of the ~80 µs per 16384×768 call on the H200.)
template <int VW>
__host__ __device__ constexpr int ln_padded(int C) {
  return (C + kWarp * VW - 1) / (kWarp * VW) * (kWarp * VW);
}
template <int VW>
__device__ __forceinline__ int ln_slot(int col) {
  const int j = col / (kWarp * VW), rem = col % (kWarp * VW);
  return j * kWarp * VW + (rem % VW) * kWarp + rem / VW;
}

template <int VW>
__global__ void layernorm_backward_kernel(bf16* dinp, float* dw, float* db, const bf16* dout,
                                          const bf16* inp, const bf16* w, const float* mean,
                                          const float* rstd, int N, int C) {
  extern __shared__ float smem[];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int CP = ln_padded<VW>(C);
  float* sdw = smem + static_cast<size_t>(warp) * 2 * CP;
  float* sdb = sdw + CP;
  // Zero the warp's whole (padded) region; only this warp touches it until __syncthreads.
  for (int i = lane; i < 2 * CP; i += kWarp) sdw[i] = 0.0f;
  __syncwarp();
  for (int row = blockIdx.x * kRowsPerBlock + warp; row < N; row += gridDim.x * kRowsPerBlock) {
    const size_t off = static_cast<size_t>(row) * C;
    const float m = mean[row], r = rstd[row];
    float xv[VW], dv[VW], wv[VW];
    // Pass 1: mean(g) and mean(g·x̂) with g = dout·w.
    float mg, mgx;
    row_grad_means<VW>(mg, mgx, dout + off, inp + off, w, m, r, C, lane);
    // Pass 2 (the row is in L1 from pass 1): dx (accumulated into the bf16 residual
    // gradient), this warp's dw, db.
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
        // c − lane·VW = j·32·VW: slot of element k is that + k·32 + lane (see ln_slot).
        const int slot = c - lane * VW + k * kWarp + lane;
        sdw[slot] += dv[k] * xh;
        sdb[slot] += dv[k];
      }
      store_f<VW>(dinp + off + c, di);
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const int slot = ln_slot<VW>(c);
    float sw = 0.0f, sb = 0.0f;
#pragma unroll
    for (int k = 0; k < kRowsPerBlock; ++k) {
      sw += smem[static_cast<size_t>(k) * 2 * CP + slot];
      sb += smem[static_cast<size_t>(k) * 2 * CP + CP + slot];
    }
    atomicAdd(dw + c, sw);
    atomicAdd(db + c, sb);
  }
}

// Backward for C too large for per-warp shared sums: dw/db accumulate with global fp32
// atomics per element (slow, correct; not taken by GPT-2 shapes).
template <int VW>
__global__ void layernorm_backward_global_kernel(bf16* dinp, float* dw, float* db,
                                                 const bf16* dout, const bf16* inp, const bf16* w,
                                                 const float* mean, const float* rstd, int N,
                                                 int C) {
  const int lane = threadIdx.x % kWarp;
  for (int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp; row < N;
       row += gridDim.x * kRowsPerBlock) {
    const size_t off = static_cast<size_t>(row) * C;
    const float m = mean[row], r = rstd[row];
    float xv[VW], dv[VW], wv[VW];
    // Pass 1: mean(g) and mean(g·x̂) with g = dout·w.
    float mg, mgx;
    row_grad_means<VW>(mg, mgx, dout + off, inp + off, w, m, r, C, lane);
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
        atomicAdd(dw + c + k, dv[k] * xh);
        atomicAdd(db + c + k, dv[k]);
      }
      store_f<VW>(dinp + off + c, di);
    }
  }
}

// One wave of the shared-memory kernel: blocks per SM from the occupancy calculator (after
// raising the kernel's dynamic shared-memory limit to what it needs), times the SM count;
// 0 when the kernel cannot run with `shared` bytes.
template <int VW>
unsigned layernorm_backward_wave(size_t shared) {
  int dev = 0, optin = 0, sms = 0;
  DDILOCO_CUDA_CHECK(cudaGetDevice(&dev));
  DDILOCO_CUDA_CHECK(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  DDILOCO_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (shared > static_cast<size_t>(optin)) return 0;
  if (shared > 48u * 1024u)
    DDILOCO_CUDA_CHECK(cudaFuncSetAttribute(layernorm_backward_kernel<VW>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(shared)));
  int per_sm = 0;
  DDILOCO_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, layernorm_backward_kernel<VW>, kRowsPerBlock * kWarp, shared));
  if (per_sm < 1) return 0;
  return static_cast<unsigned>(per_sm) * static_cast<unsigned>(sms);
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
  const int threads = kRowsPerBlock * kWarp;
  const unsigned row_blocks = detail::blocks_for(N, kRowsPerBlock);
  const bool vec = vectorisable(C, {dinp, dout, inp, w});
  const size_t shared = static_cast<size_t>(kRowsPerBlock) * 2 *
                        static_cast<size_t>(vec ? ln_padded<8>(C) : ln_padded<1>(C)) *
                        sizeof(float);
  // The wave size depends on C only through `shared`; cached per (device, VW, shared), as
  // the shared-memory attribute is set per device.
  static std::mutex mutex;
  static std::map<std::tuple<int, bool, size_t>, unsigned> waves;
  int dev = 0;
  DDILOCO_CUDA_CHECK(cudaGetDevice(&dev));
  unsigned wave = 0;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto key = std::make_tuple(dev, vec, shared);
    auto it = waves.find(key);
    if (it == waves.end())
      it = waves.emplace(key, vec ? layernorm_backward_wave<8>(shared)
                                  : layernorm_backward_wave<1>(shared))
               .first;
    wave = it->second;
  }
  if (wave > 0) {
    const unsigned grid = row_blocks < wave ? row_blocks : wave;
    if (vec)
      layernorm_backward_kernel<8><<<grid, threads, shared, stream>>>(dinp, dw, db, dout, inp, w,
                                                                     mean, rstd, N, C);
    else
      layernorm_backward_kernel<1><<<grid, threads, shared, stream>>>(dinp, dw, db, dout, inp, w,
                                                                     mean, rstd, N, C);
  } else {
    const unsigned grid = detail::grid_stride_blocks(static_cast<size_t>(N), kRowsPerBlock);
    if (vec)
      layernorm_backward_global_kernel<8><<<grid, threads, 0, stream>>>(dinp, dw, db, dout, inp,
                                                                       w, mean, rstd, N, C);
    else
      layernorm_backward_global_kernel<1><<<grid, threads, 0, stream>>>(dinp, dw, db, dout, inp,
                                                                       w, mean, rstd, N, C);
  }
  DDILOCO_CUDA_CHECK_LAUNCH();
}

}  // namespace ddiloco::gpu
