// Causal multi-head self-attention through cuDNN's fused flash attention (SDPA), forward and
// backward, bf16 in and out with fp32 softmax statistics: run.gpu_attention: cudnn, the path
// llm.c takes (llmc/cudnn_att.cpp) — there through the C++ cudnn_frontend, here through
// cuDNN's backend graph API (cudnn_graph.h) directly, since the frontend is not installed.
//
// Each (B,T,C,NH) and direction gets an operation graph of matmul, pointwise and reduction
// nodes in the shape the cuDNN frontend lowers its sdpa / sdpa_backward nodes to (see
// sdpa_shape.hpp for the sources), which cuDNN's runtime fusion engines compile into one
// FlashAttention-2 kernel (Dao 2023, arXiv:2307.08691); an execution plan is chosen from
// cuDNN's heuristics (mode A, then the fallback list) and cached by shape: the first call for
// a shape builds (slow: seconds with runtime compilation), later ones only execute.
//
// Only in builds where CMake found cuDNN 9 (DDILOCO_HAVE_CUDNN; cmake/cuda.cmake). The header
// has no cuDNN types, so GptCuda and the tests include it either way.
// Errors: ddiloco::Error for shapes cuDNN cannot run (gpu::check_sdpa's message), misaligned
// pointers, no engine for the graph, and every failing cuDNN/CUDA call (call, cuDNN's status
// and last error message, file:line).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

namespace ddiloco::gpu {

/// The loaded cuDNN's version, cudnnGetVersion() (91900 = 9.19.0). Needs no GPU.
long cudnn_runtime_version();

class CudnnAttention {
 public:
  /// A cuDNN handle bound to `stream` (cudnnCreate: needs a device). Throws Error.
  explicit CudnnAttention(cudaStream_t stream);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  /// out (B,T,C) bf16 ← softmax(Q·Kᵀ/√hs + causal mask)·V per head (layers::attention_forward),
  /// with Q, K, V read in place from qkv (B,T,3C) bf16; stats (B,NH,T) fp32 ← each scaled,
  /// masked score row's log-sum-exp, kept for backward. hs = C/NH. All pointers device
  /// memory, 16-byte aligned. Enqueued on the stream; returns without waiting (the first call
  /// for a shape builds its plan and may synchronise to grow the workspace).
  void forward(__nv_bfloat16* out, float* stats, const __nv_bfloat16* qkv, int B, int T, int C,
               int NH);
  /// dqkv (B,T,3C) bf16, overwritten: dQ, dK, dV from dout (B,T,C), the forward's qkv, out and
  /// stats (FlashAttention-2's backward: P recomputed from the stats, D = rowsum(dO ⊙ O),
  /// dS = P ⊙ (dO·Vᵀ − D)/√hs, dV = Pᵀ·dO, dK = dSᵀ·Q, dQ = dS·K). Same rules as forward.
  void backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                const __nv_bfloat16* out, const float* stats, int B, int T, int C, int NH);

  /// Cached execution plans (one per shape and direction run so far).
  size_t plans() const;
  /// Device workspace held, bytes (the largest any plan run so far needed).
  size_t workspace_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddiloco::gpu
