// Softmax + cross-entropy fused with its backward (llm.c's fused_classifier), and the mean of
// the per-position losses. The (N,V) logits are the largest activation of a GPT-2 step
// (V = 50304), so they are never copied: read once into registers and written once when a row
// fits (V ≤ 53248 with 16-byte rows), else read twice (statistics, then gradient).
#include <cmath>

#include "common.cuh"

namespace ddiloco::gpu {
namespace {

using detail::load_f;
using detail::store_f;

constexpr int kThreads = 512;

template <int VW>
__global__ void softmax_crossentropy_kernel(float* losses, bf16* logits, const int32_t* targets,
                                            int V, int ld, float dloss_scale) {
  __shared__ float shared[32];
  const int row = blockIdx.x;
  bf16* z = logits + static_cast<size_t>(row) * ld;
  const int target = targets[row];
  // Read before the block reductions' barriers: the gradient pass below overwrites it.
  const float z_target = __bfloat162float(z[target]);
  float buf[VW];
  float mx = -INFINITY, sum = 0.0f;
  for (int c = threadIdx.x * VW; c < V; c += blockDim.x * VW) {
    load_f<VW>(z + c, buf);
#pragma unroll
    for (int k = 0; k < VW; ++k) {
      if (c + k >= V) break;
      if (buf[k] > mx) {
        sum *= expf(mx - buf[k]);
        mx = buf[k];
      }
      sum += expf(buf[k] - mx);
    }
  }
  const float row_max = detail::block_max(mx, shared);
  sum = mx == -INFINITY ? 0.0f : sum * expf(mx - row_max);
  const float total = detail::block_sum(sum, shared);
  if (threadIdx.x == 0) losses[row] = logf(total) + row_max - z_target;
  if (dloss_scale == 0.0f) return;
  const float inv = 1.0f / total;
  for (int c = threadIdx.x * VW; c < V; c += blockDim.x * VW) {
    load_f<VW>(z + c, buf);
#pragma unroll
    for (int k = 0; k < VW; ++k) {
      const float p = expf(buf[k] - row_max) * inv;
      // Columns in [V, ld) of the last chunk: 0 rather than whatever was there.
      buf[k] = c + k < V ? (p - (c + k == target ? 1.0f : 0.0f)) * dloss_scale : 0.0f;
    }
    store_f<VW>(z + c, buf);  // VW = 8 only when ld % 8 == 0: a chunk ends inside the row
  }
}

// 16-byte rows (ld % 8 == 0) of V ≤ kThreads·8·NCH columns: the thread's NCH chunks are loaded
// into registers once (as bf16, all loads issued up front), then the block max, the sum of
// exponentials and the gradient are computed from the registers: one read + one write of
// the logits instead of two reads + one write, and no data-dependent branch (the per-element
// online update above diverged and cost up to two exponentials per element in its first
// pass). Same formulas (expf, fp32) as softmax_crossentropy_kernel; only the order of the sum
// differs.
template <int NCH>
__global__ void __launch_bounds__(kThreads) softmax_crossentropy_regs_kernel(float* losses, bf16* logits,
                                                 const int32_t* targets, int V, int ld,
                                                 float dloss_scale) {
  __shared__ float shared[32];
  const int row = blockIdx.x;
  bf16* z = logits + static_cast<size_t>(row) * ld;
  const int target = targets[row];
  const float z_target = __bfloat162float(z[target]);
  detail::Bf16x8 r[NCH];
#pragma unroll
  for (int j = 0; j < NCH; ++j) {
    const int c = (j * kThreads + static_cast<int>(threadIdx.x)) * 8;
    if (c < V) r[j] = detail::load8(z + c);
  }
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < NCH; ++j) {
    const int c = (j * kThreads + static_cast<int>(threadIdx.x)) * 8;
    if (c < V) {
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (c + k < V) mx = fmaxf(mx, __bfloat162float(r[j].v[k]));
    }
  }
  const float row_max = detail::block_max(mx, shared);
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < NCH; ++j) {
    const int c = (j * kThreads + static_cast<int>(threadIdx.x)) * 8;
    if (c < V) {
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (c + k < V) sum += expf(__bfloat162float(r[j].v[k]) - row_max);
    }
  }
  const float total = detail::block_sum(sum, shared);
  if (threadIdx.x == 0) losses[row] = logf(total) + row_max - z_target;
  if (dloss_scale == 0.0f) return;
  const float inv = 1.0f / total;
#pragma unroll
  for (int j = 0; j < NCH; ++j) {
    const int c = (j * kThreads + static_cast<int>(threadIdx.x)) * 8;
    if (c < V) {
      float buf[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float p = expf(__bfloat162float(r[j].v[k]) - row_max) * inv;
        // Columns in [V, ld) of the last chunk: 0 rather than whatever was there.
        buf[k] = c + k < V ? (p - (c + k == target ? 1.0f : 0.0f)) * dloss_scale : 0.0f;
      }
      store_f<8>(z + c, buf);  // ld % 8 == 0: a chunk ends inside the row
    }
  }
}
constexpr int kClassifierRegChunks = 13;  // V ≤ 512·8·13 = 53248 (GPT-2: 50257 / 50304)

__global__ void mean_kernel(float* mean, const float* x, int n) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = detail::block_sum(s, shared);
  if (threadIdx.x == 0) *mean = static_cast<float>(s / n);
}

}  // namespace

void softmax_crossentropy(float* losses, bf16* logits, const int32_t* targets, int N, int V,
                          int ld, float dloss_scale, cudaStream_t stream) {
  if (ld < V) throw_error("softmax_crossentropy: row stride smaller than the vocabulary");
  // 16-byte chunks need 16-byte aligned rows; the last chunk may run into [V, ld), which
  // exists when ld % 8 == 0 (ld ≥ V rounded up to 8).
  if (ld % 8 == 0 && detail::aligned16(logits) && V <= kThreads * 8 * kClassifierRegChunks)
    softmax_crossentropy_regs_kernel<kClassifierRegChunks>
        <<<N, kThreads, 0, stream>>>(losses, logits, targets, V, ld, dloss_scale);
  else if (ld % 8 == 0 && detail::aligned16(logits))
    softmax_crossentropy_kernel<8><<<N, kThreads, 0, stream>>>(losses, logits, targets, V, ld,
                                                               dloss_scale);
  else
    softmax_crossentropy_kernel<1><<<N, kThreads, 0, stream>>>(losses, logits, targets, V, ld,
                                                               dloss_scale);
  DDILOCO_CUDA_CHECK_LAUNCH();
}

void mean_loss(float* mean, const float* losses, int N, cudaStream_t stream) {
  mean_kernel<<<1, 1024, 0, stream>>>(mean, losses, N);
  DDILOCO_CUDA_CHECK_LAUNCH();
}

}  // namespace ddiloco::gpu
