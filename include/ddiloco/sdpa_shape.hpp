// The host side of cuDNN's fused attention (run.gpu_attention: cudnn): which shapes cuDNN's
// scaled-dot-product-attention (SDPA) graphs accept, and the 4-D tensor views through which
// those graphs read our activations in place. Plain C++ without CUDA or cuDNN headers, and
// part of the CPU library (src/train/sdpa_shape.cpp) for that reason: config validation
// (gpu::validate) and the unit tests run it on machines that have neither; the cuDNN graphs
// (src/gpu/cudnn_attention.cpp) are built from exactly these views.
//
// Conventions: B batch, T sequence length, C channels, NH heads, hs = C/NH head size. qkv is
// (B,T,3C) bf16 with Q, K, V in thirds and head h at columns h·hs of each third (layers.hpp,
// llm.c's (B,T,3,NH,hs)); the attention output and its gradient are (B,T,C). Causal, scale
// 1/√hs, no dropout or bias.
//
// Sources:
//   * the graphs: cuDNN Developer Guide, Graph API, "Specialized Runtime Fusion Engines",
//     fused flash attention fprop and bprop
//     (https://docs.nvidia.com/deeplearning/cudnn/developer/graph-api.html), built as the
//     cuDNN frontend lowers its sdpa / sdpa_backward nodes (cudnn-frontend,
//     include/cudnn_frontend/node/scaled_dot_product_flash_attention.h: CompositeSDPANode,
//     CompositeSDPABackwardNode; softmax.h; diagonal_band_mask.h);
//   * the limits: the SDPA support matrix (https://docs.nvidia.com/cudnn/operations/Attention.md)
//     and the frontend's checks (node/sdpa_support_surface.h and the backward node's
//     pre_validate_node);
//   * the math: FlashAttention-2 (Dao 2023, arXiv:2307.08691), which these engines implement;
//   * the in-place strides over (B,T,3,NH,hs): llm.c, llmc/cudnn_att.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace ddiloco::gpu {

/// Element type of Q, K, V, O and their gradients.
enum class SdpaDtype { bfloat16, float16, float32 };

/// One tensor as a cuDNN backend tensor descriptor sees it: dimensions and strides in
/// elements, and the offset in elements of element (0,0,0,0) from the start of the buffer it
/// lives in (0 for tensors that are never in memory).
struct SdpaTensor {
  std::array<int64_t, 4> dims{}, strides{};
  int64_t offset = 0;
  /// Offset in elements of element (i0,i1,i2,i3) from the buffer's start.
  int64_t at(int64_t i0, int64_t i1, int64_t i2, int64_t i3) const {
    return offset + i0 * strides[0] + i1 * strides[1] + i2 * strides[2] + i3 * strides[3];
  }
};

/// The tensors of the causal SDPA forward and backward graphs for one (B,T,C,NH).
struct SdpaLayout {
  int B = 0, T = 0, C = 0, NH = 0, hs = 0;
  float scale = 0;  ///< 1/√hs, applied to Q·Kᵀ
  /// In qkv (B,T,3C): Q, K, V as (B,NH,T,hs), at offsets 0, C, 2C; dQ, dK, dV the same places
  /// in dqkv (B,T,3C).
  SdpaTensor q, k, v;
  /// Kᵀ and Vᵀ as (B,NH,hs,T): the same memory as k and v with the last two axes swapped,
  /// the operand order of the backend's matmuls (S = Q·Kᵀ, dP = dO·Vᵀ).
  SdpaTensor k_t, v_t;
  /// In out (B,T,C): O as (B,NH,T,hs); dO the same in dout (B,T,C).
  SdpaTensor o;
  /// (B,NH,T,1) fp32, dense: per query row, the log-sum-exp of its scaled, masked scores
  /// (max + log Σ exp), what the forward saves for the backward (the flash path's lse).
  SdpaTensor stats;
  /// Never in memory (virtual in the graphs), fp32: the scores S and their chain (B,NH,T,T)
  /// dense; scores_t the same memory order read as (B,NH,Tkv,Tq), the transposes Pᵀ and dSᵀ
  /// that dV = Pᵀ·dO and dK = dSᵀ·Q take; rows (B,NH,T,1) for per-row reductions; do_o
  /// (B,NH,T,hs) for dO ⊙ O (the stride pattern the frontend gives it).
  SdpaTensor scores, scores_t, rows, do_o;
  /// The backward's Σ_d dO ⊙ O per row, (B,NH,T,1) fp32, is a real tensor of the graph kept
  /// at the start of the workspace; the engine's own workspace follows at
  /// engine_workspace_offset (softmax_sum_bytes rounded up to 256 bytes). Bytes.
  int64_t softmax_sum_bytes = 0, engine_workspace_offset = 0;
};

/// The views above for causal self-attention over qkv (B,T,3C) with NH heads. Throws Error
/// when B, T, C or NH is < 1 or NH does not divide C. Pure arithmetic: no limits of cuDNN
/// are checked here (sdpa_unsupported does).
SdpaLayout sdpa_layout(int B, int T, int C, int NH);

/// cuDNN's version number as cudnnGetVersion() returns it for cuDNN 9 (major·10000 +
/// minor·100 + patch: 91900 = 9.19.0).
constexpr long kCudnnMinVersion = 90000;

/// Why cuDNN's fused SDPA cannot run `layout` with `dtype` inputs at runtime version
/// `cudnn_version` (forward only, or forward and backward with `backward`); "" when it can.
/// The limits, each the strictest over the GPUs cuDNN's flash engines run on (sm80 and
/// newer), since a configuration is checked before a device is chosen:
///   * dtype fp16 or bf16 (the engines' MMA types; fp32 has no fused SDPA);
///   * cuDNN ≥ 9.0 (the backend graphs below), not 9.10.0 or 9.10.1 (broken SDPA releases);
///   * head size a multiple of 8 and ≤ 128 (Ampere/Ada's backward limit; Hopper's is 256).
///     A multiple of 8 also makes every head and row of the views above start 16 bytes
///     apart, the alignment their descriptors declare (the buffers themselves must be
///     16-byte aligned: CudnnAttention checks the pointers);
///   * backward: T ≥ 2 (s_q = s_kv = 1 is refused), and with cuDNN ≤ 9.15.0 T a multiple of
///     128 (older backward engines need a padding mask there, which this path does not build).
std::string sdpa_unsupported(const SdpaLayout& layout, SdpaDtype dtype, bool backward,
                             long cudnn_version);

/// sdpa_unsupported, thrown: Error "cuDNN attention (B=…, T=…, C=…, NH=…): <reason>".
void check_sdpa(const SdpaLayout& layout, SdpaDtype dtype, bool backward, long cudnn_version);

}  // namespace ddiloco::gpu
