// GPT-2 on one GPU: the CPU model's architecture and ParameterLayout (ddiloco/model.hpp), in
// bf16 with fp32 master weights, fp32 gradients and fp32 AdamW state.
//
// Memory (all on the current CUDA device when the object is built):
//   * parameters: fp32 master copy (layout order, one flat buffer — the syncer's fragments are
//     ranges of it) and the bf16 copy the forward/backward passes read, refreshed by every
//     AdamW step and set_parameters();
//   * gradients: fp32, flat, same layout; accumulated (+=) by backward();
//   * AdamW first/second moments: fp32;
//   * activations: bf16 (LayerNorm statistics and losses fp32), sized for the largest (B,T)
//     seen, like the CPU model.
// Every method enqueues on the model's one stream and returns without waiting, except the
// ones documented as synchronising (they copy to the host). Header free of CUDA types so host
// code and tests can use it without the toolkit's headers.
// Errors: ddiloco::Error for bad arguments, CUDA/cuBLAS failures (call and file:line).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "ddiloco/model.hpp"
#include "ddiloco/optim.hpp"

namespace ddiloco::gpu {

class OpProfiler;  // ddiloco/gpu/profiler.hpp

/// How attention is computed (kernels.hpp):
///   cublas: strided-batched cuBLAS GEMMs + softmax kernels, the (B,NH,T,T) probabilities
///           stored per layer in bf16 (llm.c's non-cuDNN path); any shape.
///   flash:  fused FlashAttention-2-style kernels, only a (B,NH,T) log-sum-exp per layer;
///           needs head size 64 and T a multiple of 64 (Error otherwise). Far less memory
///           traffic at T = 1024, but its WMMA kernels ran slower than cublas on an H200.
///   cublas_inplace: the same math and the same (B,NH,T,T) probabilities as cublas, but the
///           products read Q, K, V and write y, dQ, dK, dV directly in the (B,T,3C)/(B,T,C)
///           activations through pointer-array batched GEMMs: no permute copies, and the
///           attention scratch shrinks to the backward's (B,NH,T,T) gradient. Any shape
///           (head size not a multiple of 8 or T not a multiple of 4: the cublas path runs).
///   cudnn:  cuDNN's fused flash attention (gpu/cudnn_attention.hpp) reading Q, K, V in place
///           from the (B,T,3C) activations and writing y and dQ, dK, dV in place; like flash
///           only a (B,NH,T) log-sum-exp per layer. Only in builds with cuDNN 9
///           (attention_kind_built); head size a multiple of 8 and ≤ 128, T ≥ 2 for backward
///           (sdpa_shape.hpp; Error otherwise). Built and tested without a GPU, not yet
///           measured.
enum class AttentionKind { cublas, flash, cublas_inplace, cudnn };
/// Every kind, in the order bench gpu --compare runs them (those attention_kind_built).
inline constexpr AttentionKind kAttentionKinds[] = {
    AttentionKind::cublas, AttentionKind::cublas_inplace, AttentionKind::flash,
    AttentionKind::cudnn};
/// "cublas" | "cublas_inplace" | "flash" | "cudnn": the names bench gpu --attention takes
/// (the run config's run.gpu_attention offers auto, cublas, flash and cudnn).
std::string attention_kind_name(AttentionKind kind);
/// Is `kind` in this build? All but cudnn always; cudnn where CMake found cuDNN 9.
bool attention_kind_built(AttentionKind kind);
/// The kind named `name` (attention_kind_name's spelling) among those built; Error naming the
/// ones this build has else (and, for cudnn in a build without it, saying so).
AttentionKind parse_attention_kind(std::string_view name);

/// ZeRO stage 1 on a unit's GPUs (units.zero = 1, include/ddiloco/zero.hpp): this rank's AdamW
/// moments cover the flat buffer's elements [lo, lo + n) only, and the fp32 parameter, bf16
/// parameter and gradient buffers hold `padded` ≥ num_parameters() elements, the tail zeros,
/// so that NCCL's reduce-scatter and all-gather see R equal pieces of padded / R. n = 0 with
/// padded = 0 (the default): the whole buffer, unpadded.
struct OptimizerShard {
  size_t lo = 0, n = 0, padded = 0;
};

class GptCuda {
 public:
  /// Allocates parameters, gradients and AdamW state (for `shard`'s elements) on the current
  /// device (throws Error when that fails, when `shard` does not fit the model, or when
  /// `attention` is not attention_kind_built or cannot run the config's head size) and zeroes
  /// them; call init_weights or set_parameters next.
  explicit GptCuda(const GptConfig& config, const AdamWConfig& adamw = {},
                   AttentionKind attention = AttentionKind::cublas, OptimizerShard shard = {});
  ~GptCuda();
  GptCuda(const GptCuda&) = delete;
  GptCuda& operator=(const GptCuda&) = delete;

  const GptConfig& config() const;
  const ParameterLayout& layout() const;
  size_t num_parameters() const;
  AttentionKind attention() const;
  /// GELU fused into the MLP's GEMMs: the fc GEMM's cuBLASLt epilogue adds the bias, stores
  /// GELU's input for backward and applies GELU; the fc_proj input-gradient GEMM's epilogue
  /// multiplies by GELU's derivative (kernels.hpp matmul_forward/backward with pre_gelu;
  /// llm.c's gelu_fusion = 2). Off (the default until a GPU measurement shows the fused path
  /// faster: bench gpu --compare): separate GEMMs and GELU kernels. Same math; the fused path
  /// rounds to bf16 once where the separate kernels round twice. Takes effect at the next
  /// forward pass; switched between a forward and its backward, the backward uses the other
  /// path on the same saved activations, which is still correct.
  void set_gelu_fusion(bool on);
  bool gelu_fusion() const;
  /// How many fused GEMMs cuBLASLt had no algorithm for on this device; each ran as separate
  /// GEMM + GELU kernels instead (0 on Hopper is expected; reported by bench gpu).
  long fused_epilogue_fallbacks() const;

  /// The CPU model's GPT-2 initialisation (Gpt<float>::init_weights): same seed, same fp32
  /// weights. Synchronises.
  void init_weights(uint64_t seed);
  /// fp32 master parameters [offset, offset + host.size()) ← host; the bf16 copy follows.
  /// Synchronises (host memory may be reused on return).
  void set_parameters(std::span<const float> host, size_t offset = 0);
  /// host ← fp32 master parameters [offset, offset + host.size()). Synchronises.
  void get_parameters(std::span<float> host, size_t offset = 0) const;
  /// host ← fp32 gradients [offset, offset + host.size()). Synchronises.
  void get_gradients(std::span<float> host, size_t offset = 0) const;

  /// Forward pass on host tokens/targets (B,T), int32 in [0, V), validated on the host
  /// (Error otherwise, before any device work). Computes the loss and, when `for_backward`,
  /// the loss gradient w.r.t. the logits in place (softmax and cross-entropy are fused), so
  /// backward() can follow. Returns the mean cross-entropy in nats. Synchronises.
  float forward(const int32_t* tokens, const int32_t* targets, int B, int T,
                bool for_backward = true);
  /// Same on device tokens/targets (B,T) without validation or synchronisation: the hot path
  /// of a training step. The mean loss stays on the device (loss()).
  void forward_device(const int32_t* tokens, const int32_t* targets, int B, int T,
                      bool for_backward = true);
  /// Mean loss of the last forward pass. Synchronises.
  float loss() const;
  /// Per-position losses (B,T) of the last forward pass, nats. Synchronises.
  void get_losses(std::span<float> host) const;

  /// Gradients ← 0.
  void zero_grad();
  /// Accumulates d(mean loss)/d(parameters) of the last forward pass into the gradients.
  /// Needs a forward pass with for_backward; once per forward pass (Error otherwise).
  void backward();

  /// Global gradient norm and clip coefficient min(1, max_norm/(norm+1e-6)) on the device
  /// (max_norm ≤ 0: no clipping); the next step() applies the coefficient. No sync.
  void clip_grad_norm(float max_norm);
  /// Sharded (OptimizerShard): clip_grad_norm in two halves around the caller's all-reduce
  /// (sum, float64) of the kGradNormPartials partial sums at norm_partials_device(), which
  /// shard_grad_sum_squares() writes for this rank's shard of the gradients. No sync.
  void shard_grad_sum_squares();
  double* norm_partials_device();
  size_t norm_partials() const;  ///< how many (kernels.hpp kGradNormPartials)
  void clip_from_partials(float max_norm);
  /// The norm computed by the last clip_grad_norm, before clipping. Synchronises.
  float grad_norm() const;
  /// One AdamW step (ddiloco::AdamW's math) with learning rate lr > 0 on the fp32 master
  /// weights of the optimizer's shard (all of them unless sharded), using the clip coefficient
  /// of a clip_grad_norm since the last step (if any); then refreshes the shard's bf16 copy.
  /// The gradients themselves are left unscaled.
  void step(double lr);
  const OptimizerShard& shard() const;
  int64_t step_count() const;
  /// Forget AdamW's moments and step count.
  void reset_optimizer();
  /// host ← AdamW's fp32 first/second moments (shard().n each — num_parameters() unsharded —,
  /// layout order), the state a checkpoint holds. Synchronises. Error when a span has the
  /// wrong size.
  void get_optimizer_state(std::span<float> m, std::span<float> v) const;
  /// AdamW's moments ← host (shard().n each) and its step count ← step (≥ 0), e.g. a
  /// resumed checkpoint's. Synchronises. Error when a span has the wrong size or step < 0.
  void set_optimizer_state(std::span<const float> m, std::span<const float> v, int64_t step);

  /// The mean loss of the last forward pass and the norm of the last clip_grad_norm, read with
  /// one synchronisation (the trainer's one host wait per step). Error before any forward pass.
  void read_loss_and_grad_norm(float& loss, float& grad_norm) const;
  /// Device pointer to the mean loss (one fp32) of the last forward pass, e.g. to all-reduce
  /// it with the gradients; valid until the next forward pass with a larger (B,T).
  float* loss_device();

  /// Device pointers (fp32, num_parameters() elements, shard().padded when sharded) for
  /// collectives (NCCL all-reduce of gradients, fragment exchange); use them on stream() or
  /// after synchronize().
  float* parameters_device();
  float* gradients_device();
  /// After changing parameters_device() directly: refresh the bf16 copy from fp32.
  void refresh_bf16();
  /// The model's cudaStream_t, as void* to keep CUDA types out of this header.
  void* stream() const;
  void synchronize() const;
  /// Times every operation of forward/backward/clip/step/zero_grad on `profiler` (which must
  /// record on stream() and outlive its use); nullptr (the default) turns it off again. Off,
  /// the passes record nothing and never synchronise. For `ddiloco bench gpu --profile`.
  void set_profiler(OpProfiler* profiler);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddiloco::gpu
