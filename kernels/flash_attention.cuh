// Launchers of the fused head-size-64 attention kernels (flash_attention.cu), used by
// attention.cu's attention_forward_flash / attention_backward_flash. Tensors are head-major
// (B·NH, T, 64) bf16; lse and delta (B·NH, T) fp32; T a multiple of 64.
#pragma once

#include <cuda_runtime.h>

#include "ddiloco/gpu/kernels.hpp"

namespace ddiloco::gpu::detail {

/// y = softmax(scale·q·kᵀ + causal mask)·v; lse = logsumexp of each scaled, masked row.
void flash_forward(const bf16* q, const bf16* k, const bf16* v, bf16* y, float* lse, int BNH,
                   int T, float scale, cudaStream_t stream);
/// dq, dk, dv from dy, recomputing P = exp(scale·q·kᵀ − lse); delta from flash_delta.
void flash_backward(const bf16* q, const bf16* k, const bf16* v, const bf16* dy,
                    const float* lse, const float* delta, bf16* dq, bf16* dk, bf16* dv, int BNH,
                    int T, float scale, cudaStream_t stream, OpProfiler* prof = nullptr);
/// delta (B,NH,T) = Σ_d dout·out per head, from the (B,T,C) attention output and its gradient.
void flash_delta(float* delta, const bf16* dout, const bf16* out, int B, int T, int NH,
                 cudaStream_t stream);

}  // namespace ddiloco::gpu::detail
