// The GPT-2 layers on the GPU: bf16 activations, fp32 master weights and gradients, fp32
// arithmetic inside every kernel. The CPU layers (ddiloco/layers.hpp) are the reference and
// define the math; these follow the same conventions:
//   * B = batch, T = sequence length, C = channels, NH = heads, hs = C/NH, V = vocabulary,
//     N = B·T rows. Dense row-major arrays; shapes written (dim0, dim1, ...).
//   * Linear weights are (OUT, IN): y = x·Wᵀ + b.
//   * Backward functions ACCUMULATE (+=) into parameter gradients (fp32), so one zeroing per
//     step is enough; input gradients are overwritten unless the comment says "accumulates".
//   * Activations and their gradients are bf16 (`bf16` below); LayerNorm statistics, losses,
//     parameter gradients, AdamW state and master weights are fp32. Every kernel loads bf16,
//     computes in fp32 and rounds once on store (round-to-nearest-even).
//   * Every function enqueues work on `stream` and returns without synchronising; launch
//     errors throw ddiloco::Error (DDILOCO_CUDA_CHECK_LAUNCH), asynchronous faults surface at
//     the next synchronising call. All pointers are device pointers unless stated.
// Layouts and algorithms follow llm.c's train_gpt2.cu (Karpathy 2024), non-cuDNN path.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>

#include "ddiloco/gpu/profiler.hpp"

namespace ddiloco::gpu {

using bf16 = __nv_bfloat16;

// ------------------------------------------------------------------------------------ BLAS

/// One operand of a pointer-array batched GEMM over B·NH problems: problem i = b·NH + h
/// (b < B, h < NH) reads or writes the matrix at base + b·b_stride + h·h_stride, strides in
/// BYTES (for layouts like attention's heads inside (B,T,3C) rows, where i does not map to
/// a single stride).
struct BatchedOperand {
  const void* base;
  long long b_stride, h_stride;
};

/// Device arrays of pointers for cublasGemmBatchedEx, cached (src/gpu/batched_pointers.cpp).
/// get() returns device memory holding the B·NH pointers of a, then of b, then of c (3·B·NH
/// pointers back to back, in that order), built on the host and uploaded on the first request
/// for that (a, b, c, B, NH) — one stream synchronisation — and returned as is afterwards, so
/// a steady state whose buffers do not move does no host→device copies. Past kMaxEntries the
/// cache is emptied first (after synchronising the stream, since GEMMs still queued may read
/// the arrays). The arrays stay valid until then or the cache's destruction; each is only ever
/// used by GEMMs enqueued on the stream passed to get(). Not thread-safe.
class BatchedPointerCache {
 public:
  static constexpr size_t kMaxEntries = 4096;
  BatchedPointerCache() = default;
  ~BatchedPointerCache();
  BatchedPointerCache(const BatchedPointerCache&) = delete;
  BatchedPointerCache& operator=(const BatchedPointerCache&) = delete;

  void* const* get(cudaStream_t stream, const BatchedOperand& a, const BatchedOperand& b,
                   const BatchedOperand& c, int B, int NH);
  size_t size() const { return arrays_.size(); }

 private:
  // (a.base, a.b_stride, a.h_stride, b..., c..., B, NH)
  using Key = std::tuple<uintptr_t, long long, long long, uintptr_t, long long, long long,
                         uintptr_t, long long, long long, int, int>;
  void clear();
  std::map<Key, void**> arrays_;  // device allocations of 3·B·NH pointers
  cudaStream_t stream_ = nullptr;  // the stream of the GEMMs that use them (one per context)
};

/// What cuBLASLt's epilogue does to the fp32 product P = op(A)·op(B) (+ beta·C) before D is
/// stored (cuBLAS docs, cublasLtEpilogue_t). `aux` is a bf16 matrix of D's shape and leading
/// dimension (ldd, a multiple of 8 elements).
///   none:          D = P
///   bias:          D = P + bias(m) broadcast over columns
///   gelu_aux_bias: aux = P + bias, D = gelu(P + bias)   (GELU's tanh form, as layers::gelu)
///   dgelu:         D = P ⊙ gelu'(aux)                    (aux: GELU's saved input)
enum class Epilogue : int { none = 0, bias = 1, gelu_aux_bias = 2, dgelu = 3 };

/// cuBLAS and cuBLASLt handles bound to one stream, a workspace, and a cache of cuBLASLt
/// matmul plans (descriptors + the heuristic's algorithm) keyed by shape, transposes, output
/// type, epilogue and pointer alignment, so the heuristic runs once per distinct GEMM instead
/// of once per call. Not thread-safe; one per stream. Throws Error on any CUDA/cuBLAS failure.
class BlasContext {
 public:
  explicit BlasContext(cudaStream_t stream, size_t workspace_bytes = 32u << 20);
  ~BlasContext();
  BlasContext(const BlasContext&) = delete;
  BlasContext& operator=(const BlasContext&) = delete;

  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  /// Per-operation timing of the launchers that take this context (matmul_backward's
  /// dgrad/wgrad/bias, attention's sub-steps); nullptr (the default) = off, no cost.
  void set_profiler(OpProfiler* profiler) { profiler_ = profiler; }
  OpProfiler* profiler() const { return profiler_; }
  /// The cached device pointer arrays of a pointer-array batched GEMM on this context's
  /// stream (BatchedPointerCache::get): A's B·NH pointers, then B's, then C's.
  void* const* batched_pointers(const BatchedOperand& a, const BatchedOperand& b,
                                const BatchedOperand& c, int B, int NH) {
    return pointer_cache_.get(stream_, a, b, c, B, NH);
  }
  /// How many pointer-array sets the cache holds (steady state: constant from step to step).
  size_t batched_pointer_arrays() const { return pointer_cache_.size(); }

  /// Column-major GEMM through cuBLASLt, fp32 accumulation (CUBLAS_COMPUTE_32F):
  ///   D(m,n) = epilogue(op(A)·op(B) + beta·D)
  /// A, B bf16; op(A) is (m,k), op(B) is (k,n); lda/ldb are the stored leading dimensions.
  /// D is bf16 (d_fp32 = false) or fp32 (d_fp32 = true); with beta ≠ 0 it is read as C too.
  /// bias (bf16, length m) for Epilogue::bias and gelu_aux_bias, aux (bf16, (m,n), leading
  /// dimension ldd) for gelu_aux_bias (written) and dgelu (read); every epilogue but none
  /// needs a bf16 D (Error otherwise).
  /// Returns true once the GEMM is enqueued. When cuBLASLt has no algorithm for the
  /// combination: Error; or, with `optional` true, false with nothing enqueued (the caller
  /// then runs the unfused kernels; optional_misses() counts these). Any other cuBLASLt
  /// failure is an Error either way.
  bool gemm(bool trans_a, bool trans_b, int m, int n, int k, const bf16* A, int lda,
            const bf16* B, int ldb, void* D, bool d_fp32, int ldd, float beta,
            Epilogue epilogue = Epilogue::none, const bf16* bias = nullptr,
            const bf16* aux = nullptr, bool optional = false);
  /// How many optional gemm() calls found no algorithm (each ran unfused instead).
  long optional_misses() const { return optional_misses_; }

 private:
  struct Plan;
  using Key = std::tuple<int, int, int, int, int, int, int, int, int, int, int, int, int, int,
                         int, int>;
  Plan* plan(const Key& key, const void* bias, const void* aux);

  cudaStream_t stream_;
  cublasHandle_t cublas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_;
  std::map<Key, Plan*> plans_;  // nullptr: cuBLASLt has no algorithm for the key
  long optional_misses_ = 0;
  OpProfiler* profiler_ = nullptr;
  BatchedPointerCache pointer_cache_;  // freed after the destructor's body (members last)
};

/// out(N,OUT) = inp(N,IN) · w(OUT,IN)ᵀ + bias(OUT). bf16 in and out, fp32 accumulation; the
/// bias is added in the GEMM's epilogue. bias may be nullptr. ld_out: row stride of out in
/// elements (≥ OUT; 0 = OUT), e.g. logits padded to a multiple of 128 columns so that every
/// row is 16-byte aligned whatever the vocabulary.
/// With pre_gelu (N,OUT) bf16 (dense rows, needs a bias): the MLP's up
/// projection and its GELU in one GEMM (Epilogue::gelu_aux_bias, llm.c's gelu_fusion):
/// pre_gelu = inp·wᵀ + bias, out = gelu(inp·wᵀ + bias) — GELU of the fp32 sum, so out may
/// differ from gelu_forward(pre_gelu) by one bf16 rounding. Falls back to the GEMM into
/// pre_gelu and gelu_forward when OUT % 8 ≠ 0 (cuBLASLt's aux leading dimension) or cuBLASLt
/// has no fused algorithm (BlasContext::optional_misses counts the latter).
void matmul_forward(BlasContext& blas, bf16* out, const bf16* inp, const bf16* w,
                    const bf16* bias, int N, int IN, int OUT, int ld_out = 0,
                    bf16* pre_gelu = nullptr);
/// dinp(N,IN) = dout(N,OUT)·w (bf16, overwritten; skipped when dinp is nullptr);
/// dw(OUT,IN) += doutᵀ·inp (fp32, accumulated by the GEMM with beta = 1);
/// dbias(OUT) += Σ_N dout (fp32; skipped when nullptr). ld_dout: row stride of dout (0 = OUT).
/// With pre_gelu (N,IN) bf16 (the GELU input whose output was this layer's inp; dense
/// rows): dinp = (dout·w) ⊙ gelu'(pre_gelu), the GELU backward applied in the GEMM's
/// epilogue (Epilogue::dgelu) to the fp32 product — one bf16 rounding instead of two. Falls
/// back to the GEMM and gelu_backward when IN % 8 ≠ 0 or cuBLASLt has no fused algorithm.
void matmul_backward(BlasContext& blas, bf16* dinp, float* dw, float* dbias, const bf16* dout,
                     const bf16* inp, const bf16* w, int N, int IN, int OUT, int ld_dout = 0,
                     const bf16* pre_gelu = nullptr);

// ------------------------------------------------------------------------- embeddings

/// out(B,T,C) = wte[tokens[b,t]] + wpe[t]. tokens (B,T) int32 in [0,V) (not checked here: the
/// model validates them on the host); wte (V,C), wpe (≥T,C) bf16.
void encoder_forward(bf16* out, const int32_t* tokens, const bf16* wte, const bf16* wpe, int B,
                     int T, int C, cudaStream_t stream);
/// dwte(V,C) += scatter of dout(B,T,C) by token; dwpe(T,C) += Σ_B dout. fp32 atomics, so the
/// summation order (and the last bits) varies from run to run.
void encoder_backward(float* dwte, float* dwpe, const bf16* dout, const int32_t* tokens, int B,
                      int T, int C, cudaStream_t stream);

// -------------------------------------------------------------------------- LayerNorm

/// LayerNorm over C, eps 1e-5 (layers::layernorm_forward). inp, out (N,C) bf16; w, b (C) bf16;
/// mean, rstd (N) fp32 saved for backward. One warp per row.
void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* w,
                       const bf16* b, int N, int C, cudaStream_t stream);
/// dinp (N,C) bf16 ACCUMULATES rstd·(g − mean(g) − x̂·mean(g·x̂)) with g = dout·w;
/// dw, db (C) fp32 accumulate Σ_N dout·x̂ and Σ_N dout (per-warp partial sums in shared
/// memory without atomics, summed per block in a fixed order, then one fp32 atomic per column
/// and block; global atomics per element when 16·C floats exceed the shared memory). dout, inp (N,C) bf16; w (C) bf16; mean, rstd (N) fp32.
void layernorm_backward(bf16* dinp, float* dw, float* db, const bf16* dout, const bf16* inp,
                        const bf16* w, const float* mean, const float* rstd, int N, int C,
                        cudaStream_t stream);

// --------------------------------------------------------------------- elementwise

/// GELU, tanh approximation (layers::gelu_forward); n elements, bf16. inp == out allowed.
void gelu_forward(bf16* out, const bf16* inp, long n, cudaStream_t stream);
/// dinp = gelu'(inp)·dout, bf16, overwritten; dinp == dout allowed (in place).
void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, long n, cudaStream_t stream);
/// gelu_backward over (N,OUT) fused with the bias gradient of the layer that produced inp:
/// dinp = gelu'(inp)·dout (bf16, overwritten; dinp == dout allowed) and dbias(OUT) += Σ_N dinp
/// (fp32 column sums of the bf16-rounded dinp, what bias_backward would compute from it), in
/// one pass. Rows dense (stride OUT).
void gelu_backward_bias(bf16* dinp, float* dbias, const bf16* inp, const bf16* dout, int N,
                        int OUT, cudaStream_t stream);
/// out = a + b (residual connection), bf16, n elements; out may alias a or b.
void residual_forward(bf16* out, const bf16* a, const bf16* b, long n, cudaStream_t stream);
/// dbias(OUT) += Σ_N dout(N,OUT): column sums of a bf16 matrix (row stride ld ≥ OUT) into
/// fp32 (the bias gradient of a Linear layer).
void bias_backward(float* dbias, const bf16* dout, int N, int OUT, int ld, cudaStream_t stream);
/// dst = bf16(src) (round to nearest even), n elements.
void fp32_to_bf16(bf16* dst, const float* src, size_t n, cudaStream_t stream);
/// dst = float(src), n elements (exact).
void bf16_to_fp32(float* dst, const bf16* src, size_t n, cudaStream_t stream);

// ------------------------------------------------------------------------- attention

/// Scratch an attention layer needs beside its inputs and outputs, bf16:
///   q, k, v, y:  (B, NH, T, hs) each — 4·B·T·C elements from attention_scratch_elems(B,T,C)
/// (the backward pass uses them as dy, dq, dk, dv plus a (B,NH,T,T) datt, see below).
size_t attention_forward_scratch_elems(int B, int T, int C);
size_t attention_backward_scratch_elems(int B, int T, int C, int NH);

/// Causal multi-head self-attention (layers::attention_forward) as in llm.c's non-cuDNN path:
///   1. permute qkv(B,T,3,NH,hs) → q, k, v (B,NH,T,hs);
///   2. att = q·kᵀ, a strided-batched bf16 GEMM over B·NH (cuBLAS, fp32 accumulate);
///   3. att = softmax(att/√hs + causal mask) in place, one warp per row, fp32 math, zeros
///      above the diagonal (so the next GEMM may read full rows);
///   4. y = att·v (batched GEMM); 5. out(B,T,C) = y with heads concatenated.
/// The products are split into causal blocks of blk = attention_causal_split(T) rows (the last
/// block takes the remainder up to T): row t of a block that ends at column e < T only sees
/// columns < e, so att[t][s] for s ≥ e is never written (nor read by the backward); every
/// other entry holds the probability, exactly 0 above the diagonal.
/// qkv (B,T,3C) bf16 as in layers.hpp; att (B,NH,T,T) bf16, kept for backward; out (B,T,C).
/// scratch: attention_forward_scratch_elems(B,T,C) bf16 elements.
void attention_forward(BlasContext& blas, bf16* out, bf16* att, const bf16* qkv, bf16* scratch,
                       int B, int T, int C, int NH);
/// dqkv (B,T,3C) bf16 overwritten from dout (B,T,C), the saved qkv and att:
///   dP = dY·Vᵀ, dV = Pᵀ·dY, dS = P ⊙ (dP − rowsum(P ⊙ dP))/√hs, dQ = dS·K, dK = dSᵀ·Q.
/// scratch: attention_backward_scratch_elems(B,T,C,NH) bf16 elements.
void attention_backward(BlasContext& blas, bf16* dqkv, const bf16* dout, const bf16* qkv,
                        const bf16* att, bf16* scratch, int B, int T, int C, int NH);

/// True when the in-place launchers below run in place for the shape: head size C/NH a
/// multiple of 8 and T a multiple of 4, so that every head's pointer is 16-byte aligned (the
/// pointer-array GEMMs need it: cuBLAS cannot inspect pointers that live in device memory).
bool attention_inplace_supported(int T, int C, int NH);
/// Scratch of the in-place launchers, bf16 elements: forward 0, backward B·NH·T·T (datt);
/// for shapes that are not attention_inplace_supported, those of the permuting launchers
/// they fall back to (attention_forward_scratch_elems / attention_backward_scratch_elems).
size_t attention_forward_inplace_scratch_elems(int B, int T, int C, int NH);
size_t attention_backward_inplace_scratch_elems(int B, int T, int C, int NH);

/// attention_forward without the permute copies: the same causal split, GEMMs, softmax and
/// (B,NH,T,T) probabilities, but the products read Q, K, V straight from qkv (B,T,3C) and
/// write y straight into out (B,T,C) through pointer-array batched GEMMs
/// (cublasGemmBatchedEx; arrays cached in blas, BatchedPointerCache). In llm.c's column-major
/// view head (b,h) of Q is an (hs,T) matrix with leading dimension 3C at
/// qkv + b·T·3C + h·hs (K: + C, V: + 2C), of y an (hs,T) matrix with ld C at
/// out + b·T·C + h·hs. Same arguments and results as attention_forward (the products and
/// the softmax are the same; only the addressing differs). qkv, out, att 16-byte aligned
/// (Error otherwise). scratch: attention_forward_inplace_scratch_elems(B,T,C,NH) elements
/// (none when attention_inplace_supported(T,C,NH); otherwise this runs attention_forward).
void attention_forward_inplace(BlasContext& blas, bf16* out, bf16* att, const bf16* qkv,
                               bf16* scratch, int B, int T, int C, int NH);
/// attention_backward without the permute copies: dY read straight from dout (B,T,C), Q, K,
/// V from qkv, dQ, dK, dV written straight into dqkv (B,T,3C) (ld 3C, as Q, K, V above).
/// Overwrites dqkv. scratch: attention_backward_inplace_scratch_elems(B,T,C,NH) elements, the
/// (B,NH,T,T) datt when attention_inplace_supported (otherwise this runs attention_backward).
/// All buffers 16-byte aligned (Error otherwise).
void attention_backward_inplace(BlasContext& blas, bf16* dqkv, const bf16* dout, const bf16* qkv,
                                const bf16* att, bf16* scratch, int B, int T, int C, int NH);

/// True when the fused path below handles the shape: head size C/NH == 64 and T % 64 == 0.
bool attention_flash_supported(int T, int C, int NH);
/// Fused causal attention (kernels/flash_attention.cu, FlashAttention-2's algorithm on WMMA
/// bf16 tensor cores): same inputs and output as attention_forward, but instead of the
/// (B,NH,T,T) probabilities it saves lse (B,NH,T) fp32, the log-sum-exp of each scaled,
/// masked score row, from which the backward pass recomputes them. Needs
/// attention_flash_supported (throws Error otherwise). scratch:
/// attention_forward_scratch_elems(B,T,C) bf16 elements.
/// prof (optional): times the permute, kernel and unpermute steps as nested ranges.
void attention_forward_flash(bf16* out, float* lse, const bf16* qkv, bf16* scratch, int B, int T,
                             int C, int NH, cudaStream_t stream, OpProfiler* prof = nullptr);
/// dqkv (B,T,3C) from dout (B,T,C), the saved qkv, the forward output out (B,T,C) and lse.
/// scratch: attention_backward_scratch_elems(B,T,C,NH) bf16 elements (only 7·B·T·C are
/// used); delta: B·NH·T fp32 of scratch.
void attention_backward_flash(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                              const float* lse, bf16* scratch, float* delta, int B, int T, int C,
                              int NH, cudaStream_t stream, OpProfiler* prof = nullptr);

/// Block size of attention_forward's causal split: ⌊T/4⌋ rounded down to a multiple of 8, at
/// least 8 (0 = no split, for T < 16); ⌊T/blk⌋ blocks, the last ending at T.
int attention_causal_split(int T);

/// The softmax step alone, in place: rows (B·NH·T) of length T, row r = (bh, t) keeps
/// columns ≤ t: att = softmax(scale·att) there, 0 above. Exposed for the tests.
void attention_softmax_forward(bf16* att, int BNH, int T, float scale, cudaStream_t stream);
/// In place: datt ← scale · P ⊙ (datt − Σ_{i≤t} P_i·datt_i) on columns ≤ t, 0 above.
void attention_softmax_backward(bf16* datt, const bf16* att, int BNH, int T, float scale,
                                cudaStream_t stream);

// ------------------------------------------------------------------- loss (classifier)

/// Softmax + cross-entropy over logits (N,V) bf16 with row stride ld ≥ V, fused with its
/// backward (llm.c's fused_classifier): losses(N) fp32 receive −log softmax(logits)[target]
/// (nats); when dloss_scale ≠ 0 the logits are replaced IN PLACE by
/// (softmax − onehot(target))·dloss_scale (bf16), i.e. d(Σ_n dloss_scale·loss_n)/d logits —
/// 1/N for the mean loss — and the padding columns [V, ld) are set to 0. The logits never need
/// a second (N,V) buffer and are read twice, not three times. One block per row.
void softmax_crossentropy(float* losses, bf16* logits, const int32_t* targets, int N, int V,
                          int ld, float dloss_scale, cudaStream_t stream);
/// *mean = Σ losses / N (fp32, accumulated in double), one block. Device scalar out.
void mean_loss(float* mean, const float* losses, int N, cudaStream_t stream);

// -------------------------------------------------------------------------- optimizer

/// Global gradient norm and clipping coefficient, on the device (no host sync):
///   norm_out[0] = √Σ g² (sum in double, fp32 out); scale_out[0] = min(1, max_norm/(norm+1e-6))
///   when max_norm > 0, else 1 (torch.nn.utils.clip_grad_norm_, ddiloco::clip_grad_norm).
/// Deterministic: the same gradients give bit-identical results on every run and rank (a
/// fixed grid of kGradNormPartials blocks whose partials are added in a fixed order), which
/// keeps the ranks of a unit bit-identical.
/// accum: kGradNormPartials doubles of device scratch. grads (n) fp32. prof (optional): times
/// the sum of squares and the clip-coefficient kernel as nested ranges.
constexpr int kGradNormPartials = 1024;
void grad_norm_and_clip_scale(float* norm_out, float* scale_out, double* accum,
                              const float* grads, size_t n, float max_norm,
                              cudaStream_t stream, OpProfiler* prof = nullptr);
/// The two halves of grad_norm_and_clip_scale, for a gradient sharded over ranks (units.zero =
/// 1): each rank writes the kGradNormPartials partial sums Σ g² of its shard into accum, the
/// ranks sum them element-wise (an NCCL all-reduce of float64), and every rank then turns the
/// same sums into the same norm and coefficient. The partials' grouping differs from the
/// unsharded buffer's, so the norm equals the unsharded one to double rounding, not bit for bit.
void grad_sum_squares(double* accum, const float* grads, size_t n, cudaStream_t stream);
void clip_scale_from_partials(float* norm_out, float* scale_out, const double* accum, float max_norm,
                              cudaStream_t stream);

/// AdamW step (ddiloco::AdamW, torch.optim.AdamW) on fp32 master weights, with the clip
/// coefficient applied on the fly (g = grads·grad_scale[0]; grads are not modified):
///   m ← β1·m + (1−β1)·g,  v ← β2·v + (1−β2)·g²,
///   θ ← θ − lr·( m/bc1 / (√(v/bc2) + ε) + λ·θ ),  λ = weight_decay where decay_mask[i] ≠ 0;
/// then params_bf16 = bf16(θ), the copy the forward pass reads. bc1 = 1−β1ᵗ, bc2 = 1−β2ᵗ
/// are computed on the host (t counts from 1). grad_scale may be nullptr (= 1).
void adamw_step(float* params, bf16* params_bf16, const float* grads, float* m, float* v,
                const uint8_t* decay_mask, size_t n, float lr, float beta1, float beta2,
                float bc1, float bc2, float eps, float weight_decay, const float* grad_scale,
                cudaStream_t stream);

}  // namespace ddiloco::gpu
