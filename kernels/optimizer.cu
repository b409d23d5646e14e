// AdamW on fp32 master weights and the global gradient norm for clipping, both without a
// host round trip: the clip coefficient stays on the device and AdamW reads it.
#include <cmath>

#include "common.cuh"

namespace ddiloco::gpu {
namespace {

constexpr int kThreads = 256;

// Each block writes its partial sum; the clip kernel adds them in a fixed order. The grid is
// a constant (kGradNormPartials), not sized from the device, so every rank of a unit — whose
// gradients NCCL made identical — gets a bit-identical norm and clip coefficient, and its
// replicas stay identical (global atomics would add the partials in a varying order).
__global__ void sum_squares_kernel(double* partials, const float* g, size_t n) {
  __shared__ double shared[32];
  double s = 0.0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const double x = g[i];
    s += x * x;
  }
  s = detail::block_sum(s, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// One block of kThreads: a fixed assignment of partials to threads, then block_sum's fixed tree.
__global__ void clip_scale_kernel(float* norm_out, float* scale_out, const double* partials,
                                  float max_norm) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < kGradNormPartials; i += blockDim.x) s += partials[i];
  s = detail::block_sum(s, shared);
  if (threadIdx.x != 0) return;
  const double norm = sqrt(s);
  *norm_out = static_cast<float>(norm);
  double scale = 1.0;
  if (max_norm > 0.0f) {
    const double coeff = static_cast<double>(max_norm) / (norm + 1e-6);
    if (coeff < 1.0) scale = coeff;
  }
  *scale_out = static_cast<float>(scale);
}

__global__ void adamw_kernel(float* params, bf16* params_bf16, const float* grads, float* m,
                             float* v, const uint8_t* decay_mask, size_t n, float lr,
                             float beta1, float beta2, float bc1, float bc2, float eps,
                             float weight_decay, const float* grad_scale) {
  const float gs = grad_scale != nullptr ? *grad_scale : 1.0f;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float g = grads[i] * gs;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float decay = decay_mask[i] ? weight_decay : 0.0f;
    float p = params[i];
    p -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + decay * p);
    params[i] = p;
    params_bf16[i] = __float2bfloat16_rn(p);
  }
}

}  // namespace

void grad_sum_squares(double* accum, const float* grads, size_t n, cudaStream_t stream) {
  sum_squares_kernel<<<kGradNormPartials, kThreads, 0, stream>>>(accum, grads, n);
  DDILOCO_CUDA_CHECK_LAUNCH();
}

void clip_scale_from_partials(float* norm_out, float* scale_out, const double* accum, float max_norm,
                              cudaStream_t stream) {
  clip_scale_kernel<<<1, kThreads, 0, stream>>>(norm_out, scale_out, accum, max_norm);
  DDILOCO_CUDA_CHECK_LAUNCH();
}

void grad_norm_and_clip_scale(float* norm_out, float* scale_out, double* accum,
                              const float* grads, size_t n, float max_norm,
                              cudaStream_t stream, OpProfiler* prof) {
  {
    ProfileScope ps(prof, "sum of squares");
    grad_sum_squares(accum, grads, n, stream);
  }
  ProfileScope ps(prof, "clip coefficient");
  clip_scale_from_partials(norm_out, scale_out, accum, max_norm, stream);
}

void adamw_step(float* params, bf16* params_bf16, const float* grads, float* m, float* v,
                const uint8_t* decay_mask, size_t n, float lr, float beta1, float beta2,
                float bc1, float bc2, float eps, float weight_decay, const float* grad_scale,
                cudaStream_t stream) {
  if (n == 0) return;
  adamw_kernel<<<detail::grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(
      params, params_bf16, grads, m, v, decay_mask, n, lr, beta1, beta2, bc1, bc2, eps,
      weight_decay, grad_scale);
  DDILOCO_CUDA_CHECK_LAUNCH();
}

}  // namespace ddiloco::gpu
