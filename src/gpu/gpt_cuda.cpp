// GPT-2 forward/backward/AdamW on one GPU: the layer sequence of src/model/gpt.cpp with the
// kernels of ddiloco/gpu/kernels.hpp. Host code only (the kernels live in kernels/*.cu).
#include "ddiloco/gpu/gpt_cuda.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ddiloco/error.hpp"
#include "ddiloco/gpu/check.hpp"
#include "ddiloco/gpu/cudnn_attention.hpp"
#include "ddiloco/gpu/kernels.hpp"
#include "ddiloco/sdpa_shape.hpp"
#include "model/weights.hpp"

namespace ddiloco::gpu {
namespace {

// Owning device allocation of n elements of T.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { resize(n); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void resize(size_t n) {
    release();
    if (n == 0) return;
    const cudaError_t st = cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T));
    if (st != cudaSuccess) {
      (void)cudaGetLastError();
      fail("GPU model: cannot allocate {:.2f} GiB on the device ({})",
           static_cast<double>(n * sizeof(T)) / (1u << 30), cudaGetErrorString(st));
    }
    size_ = n;
  }
  T* get() const { return ptr_; }
  size_t size() const { return size_; }

 private:
  void release() {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    size_ = 0;
  }
  T* ptr_ = nullptr;
  size_t size_ = 0;
};

// Row stride of the logits: the vocabulary rounded up to 128 (50257 → 50304, as llm.c pads
// GPT-2's), so every row starts 256-byte aligned and the LM-head GEMM gets aligned operands
// and full tiles; the padding columns are never part of the softmax.
size_t padded_vocab(int V) { return (static_cast<size_t>(V) + 127) / 128 * 128; }

using model_views::Block;
using model_views::Weights;

// Floats between two layers' (B,NH,T) log-sum-exps: rounded up to 32 so that every layer's
// starts 128-byte aligned (cuDNN's descriptors declare 16-byte alignment).
size_t lse_stride(int B, int NH, int T) {
  return (static_cast<size_t>(B) * NH * T + 31) / 32 * 32;
}

// Views of the bf16 and fp32 activation buffers for a (B,T); per-layer tensors stacked by
// layer. Every view starts at a multiple of 128 elements so GEMM operands are 256-byte
// aligned. With null bases only the totals are computed.
struct Activations {
  // bf16
  bf16 *encoded, *ln1, *qkv, *atty, *att, *residual2, *ln2, *fch, *fch_gelu, *residual3, *lnf,
      *logits, *scratch, *dresidual, *dln, *datty, *dwide;
  // fp32
  float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lnf_mean, *lnf_rstd, *losses, *loss, *lse,
      *delta;
  size_t total_bf16 = 0, total_f32 = 0;

  // flash and cudnn: no (B,NH,T,T) probabilities but a (B,NH,T) log-sum-exp per layer;
  // flash also one delta.
  Activations(const GptConfig& c, int B, int T, AttentionKind kind, bf16* hbase, float* fbase) {
    const bool flash = kind == AttentionKind::flash;
    const bool fused = flash || kind == AttentionKind::cudnn;
    const size_t L = c.n_layer, C = c.n_embd, NH = c.n_head;
    const size_t N = static_cast<size_t>(B) * T, NC = N * C;
    auto round = [](size_t n) { return (n + 127) / 128 * 128; };
    auto h = [&](size_t n) {
      bf16* p = hbase ? hbase + total_bf16 : nullptr;
      total_bf16 += round(n);
      return p;
    };
    auto f = [&](size_t n) {
      float* p = fbase ? fbase + total_f32 : nullptr;
      total_f32 += round(n);
      return p;
    };
    encoded = h(NC);
    ln1 = h(L * NC);
    qkv = h(L * 3 * NC);
    atty = h(L * NC);
    att = h(fused ? 0 : L * B * NH * T * T);
    residual2 = h(L * NC);
    ln2 = h(L * NC);
    fch = h(L * 4 * NC);
    fch_gelu = h(L * 4 * NC);
    residual3 = h(L * NC);
    lnf = h(NC);
    logits = h(N * padded_vocab(c.vocab_size));
    // Attention scratch (forward: q,k,v,y; backward: q,k,v,dy,dq,dk,dv,datt), also the
    // output of the projections before their residual add.
    // (The flash path needs no (B,NH,T,T) gradient buffer: 7·N·C covers its backward. The
    // in-place path needs no copies: the backward's datt, and N·C for the projections.
    // cuDNN reads and writes in place with its own workspace: N·C for the projections.)
    const int Ci = static_cast<int>(C), NHi = static_cast<int>(NH);
    if (kind == AttentionKind::cudnn)
      scratch = h(NC);
    else if (kind == AttentionKind::cublas_inplace)
      scratch = h(std::max({NC, attention_forward_inplace_scratch_elems(B, T, Ci, NHi),
                            attention_backward_inplace_scratch_elems(B, T, Ci, NHi)}));
    else
      scratch = h(std::max(attention_forward_scratch_elems(B, T, Ci),
                           flash ? 7 * NC : attention_backward_scratch_elems(B, T, Ci, NHi)));
    dresidual = h(NC);
    dln = h(NC);
    datty = h(NC);
    dwide = h(4 * NC);  // dfch, and dqkv (3NC)
    ln1_mean = f(L * N);
    ln1_rstd = f(L * N);
    ln2_mean = f(L * N);
    ln2_rstd = f(L * N);
    lnf_mean = f(N);
    lnf_rstd = f(N);
    losses = f(N);
    loss = f(1);
    lse = f(fused ? L * lse_stride(B, NH, T) : 0);
    delta = f(flash ? static_cast<size_t>(B) * NH * T : 0);
  }
};

}  // namespace

struct GptCuda::Impl {
  GptConfig config;
  ParameterLayout layout;
  AdamWConfig adamw;
  AttentionKind attention;
  OptimizerShard shard;  // {0, P, P} unsharded
  cudaStream_t stream = nullptr;
  std::unique_ptr<BlasContext> blas;
#if DDILOCO_HAVE_CUDNN
  std::unique_ptr<CudnnAttention> cudnn;  // attention cudnn only
#endif
  DeviceBuffer<float> params, grads, m, v;
  DeviceBuffer<bf16> params_bf16;
  DeviceBuffer<uint8_t> decay_mask;
  DeviceBuffer<float> clip;    // [0] norm, [1] coefficient
  DeviceBuffer<double> accum;  // norm scratch
  DeviceBuffer<bf16> acts_bf16;
  DeviceBuffer<float> acts_f32;
  DeviceBuffer<int32_t> tokens, targets;  // (B,T) of the last forward pass
  int B = 0, T = 0;
  bool clip_pending = false;
  bool fuse_gelu = false;  // GELU in the fc GEMMs' cuBLASLt epilogues (set_gelu_fusion)
  int64_t t = 0;  // AdamW steps taken
  OpProfiler* prof = nullptr;  // per-operation timing (bench gpu --profile); null = off
  enum class Pass { none, inference, training, backward_done } pass = Pass::none;

  Impl(const GptConfig& c, const AdamWConfig& a, AttentionKind kind, OptimizerShard sh)
      : config(c), layout((c.validate(), ParameterLayout::gpt2(c))), adamw(a), attention(kind), shard(sh) {
    const size_t P = layout.size();
    if (shard.padded == 0) shard = {0, P, P};
    if (shard.padded < P || shard.lo > P || shard.n > P - shard.lo)
      fail("GPU model: optimizer shard [{}, {}) padded to {} does not fit {} parameters", shard.lo,
           shard.lo + shard.n, shard.padded, P);
    if (kind == AttentionKind::flash && c.n_embd / c.n_head != 64)
      fail("GPU model: flash attention needs head size n_embd/n_head = 64, got {}",
           c.n_embd / c.n_head);
    if (!attention_kind_built(kind))
      fail("GPU model: attention {} is not in this build (built without cuDNN 9)",
           attention_kind_name(kind));
    DDILOCO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    blas = std::make_unique<BlasContext>(stream);
    if (kind == AttentionKind::cudnn) make_cudnn();
    // Sharded: the padding past P stays zero (nothing writes it but the collectives, which
    // carry zeros there), and the moments cover the shard only: what ZeRO-1 saves.
    const size_t padded = shard.padded, S = std::max<size_t>(shard.n, 1);
    params.resize(padded);
    grads.resize(padded);
    m.resize(S);
    v.resize(S);
    params_bf16.resize(padded);
    decay_mask.resize(P);
    clip.resize(2);
    accum.resize(kGradNormPartials);
    DDILOCO_CUDA_CHECK(cudaMemsetAsync(params.get(), 0, padded * sizeof(float), stream));
    DDILOCO_CUDA_CHECK(cudaMemsetAsync(grads.get(), 0, padded * sizeof(float), stream));
    DDILOCO_CUDA_CHECK(cudaMemsetAsync(m.get(), 0, S * sizeof(float), stream));
    DDILOCO_CUDA_CHECK(cudaMemsetAsync(v.get(), 0, S * sizeof(float), stream));
    DDILOCO_CUDA_CHECK(cudaMemsetAsync(params_bf16.get(), 0, padded * sizeof(bf16), stream));
    // AdamW decays the tensors the layout marks (matmul weights, embeddings), per element.
    std::vector<uint8_t> mask(P, 0);
    for (const auto& tv : layout.tensors())
      if (tv.weight_decay) std::fill_n(mask.begin() + static_cast<long>(tv.offset), tv.numel, 1);
    DDILOCO_CUDA_CHECK(cudaMemcpyAsync(decay_mask.get(), mask.data(), P, cudaMemcpyHostToDevice,
                                       stream));
    DDILOCO_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  ~Impl() {
#if DDILOCO_HAVE_CUDNN
    cudnn.reset();
#endif
    blas.reset();
    if (stream) cudaStreamDestroy(stream);
  }

  // The cuDNN path exists only where CMake found cuDNN (the constructor refuses the kind
  // elsewhere, before any of the #else branches could run). The head size is checked at
  // construction, like flash's; T and B at each call.
#if DDILOCO_HAVE_CUDNN
  void make_cudnn() {
    const SdpaLayout l = sdpa_layout(1, config.seq_len, config.n_embd, config.n_head);
    check_sdpa(l, SdpaDtype::bfloat16, false, cudnn_runtime_version());
    cudnn = std::make_unique<CudnnAttention>(stream);
  }
  void check_cudnn_shape(int b, int t_len, bool for_backward) const {
    // Before any device work: a backward cuDNN cannot run must not follow a forward it did.
    check_sdpa(sdpa_layout(b, t_len, config.n_embd, config.n_head), SdpaDtype::bfloat16,
               for_backward, cudnn_runtime_version());
  }
  void cudnn_forward(bf16* out, float* lse, const bf16* qkv) {
    cudnn->forward(out, lse, qkv, B, T, config.n_embd, config.n_head);
  }
  void cudnn_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                      const float* lse) {
    cudnn->backward(dqkv, dout, qkv, out, lse, B, T, config.n_embd, config.n_head);
  }
#else
  [[noreturn]] static void no_cudnn() {
    fail("GPU model: attention cudnn is not in this build (built without cuDNN 9)");
  }
  void make_cudnn() { no_cudnn(); }
  void check_cudnn_shape(int, int, bool) const { no_cudnn(); }
  void cudnn_forward(bf16*, float*, const bf16*) { no_cudnn(); }
  void cudnn_backward(bf16*, const bf16*, const bf16*, const bf16*, const float*) { no_cudnn(); }
#endif

  void ensure_activations(int b, int t_len) {
    const Activations need(config, b, t_len, attention, nullptr, nullptr);
    if (need.total_bf16 > acts_bf16.size() || need.total_f32 > acts_f32.size()) {
      DDILOCO_CUDA_CHECK(cudaStreamSynchronize(stream));  // old buffers may still be in use
      if (need.total_bf16 > acts_bf16.size()) acts_bf16.resize(need.total_bf16);
      if (need.total_f32 > acts_f32.size()) acts_f32.resize(need.total_f32);
    }
    const size_t N = static_cast<size_t>(b) * t_len;
    if (N > tokens.size()) {
      DDILOCO_CUDA_CHECK(cudaStreamSynchronize(stream));
      tokens.resize(N);
      targets.resize(N);
    }
  }

  bool flash() const { return attention == AttentionKind::flash; }
  // A (B,NH,T) log-sum-exp per layer instead of the (B,NH,T,T) probabilities.
  bool saves_lse() const { return flash() || attention == AttentionKind::cudnn; }

  Activations acts() const {
    return Activations(config, B, T, attention, acts_bf16.get(), acts_f32.get());
  }

  void check_range(size_t offset, size_t n, const char* what) const {
    if (offset > layout.size() || n > layout.size() - offset)
      fail("GPU model {}: range [{}, {}) is outside the {} parameters", what, offset, offset + n,
           layout.size());
  }

  void forward(const int32_t* tok, const int32_t* tgt, int b, int t_len, bool for_backward) {
    check_forward(tgt, b, t_len, for_backward);
    ensure_activations(b, t_len);
    B = b;
    T = t_len;
    const int N = B * T;
    Weights<bf16> w(layout, params_bf16.get(), config.n_layer);
    Activations a = acts();
    // Keep the tokens for backward (encoder) when they live in a caller's buffer.
    if (tok != tokens.get()) {
      ProfileScope ps(prof, "fwd token copy");
      DDILOCO_CUDA_CHECK(cudaMemcpyAsync(tokens.get(), tok, N * sizeof(int32_t),
                                         cudaMemcpyDeviceToDevice, stream));
    }
    {
      ProfileScope ps(prof, "fwd embedding");
      encoder_forward(a.encoded, tok, w.wte, w.wpe, B, T, config.n_embd, stream);
    }
    for (int l = 0; l < config.n_layer; ++l) forward_block(l, w.blocks[l], a);
    forward_head(w, a, tgt, for_backward);
    pass = for_backward ? Pass::training : Pass::inference;
  }

  void check_forward(const int32_t* tgt, int b, int t_len, bool for_backward) {
    if (b < 1) fail("forward: batch size must be ≥ 1, got {}", b);
    if (t_len < 1 || t_len > config.seq_len)
      fail("forward: sequence length must be in [1, model.seq_len = {}], got {}", config.seq_len,
           t_len);
    if (tgt == nullptr) fail("forward: the GPU model needs targets");
    if (flash() && !attention_flash_supported(t_len, config.n_embd, config.n_head))
      fail("forward: flash attention needs a sequence length that is a multiple of 64, got {}",
           t_len);
    if (attention == AttentionKind::cudnn) check_cudnn_shape(b, t_len, for_backward);
  }

  // Transformer block l (parameters p) on the activations of the block before it.
  void forward_block(int l, const Block<bf16>& p, const Activations& a) {
    const int C = config.n_embd, NH = config.n_head;
    const int N = B * T;
    const size_t NC = static_cast<size_t>(N) * C;
    // FLOPs of a Linear layer's GEMM: 2·N·IN·OUT.
    const double fl = 2.0 * N * C * C;
    const bf16* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * NC;
    bf16* ln1 = a.ln1 + l * NC;
    bf16* qkv = a.qkv + l * 3 * NC;
    bf16* atty = a.atty + l * NC;
    bf16* att = saves_lse() ? nullptr : a.att + static_cast<size_t>(l) * B * NH * T * T;
    float* lse = saves_lse() ? a.lse + l * lse_stride(B, NH, T) : nullptr;
    bf16* residual2 = a.residual2 + l * NC;
    bf16* ln2 = a.ln2 + l * NC;
    bf16* fch = a.fch + l * 4 * NC;
    bf16* fch_gelu = a.fch_gelu + l * 4 * NC;
    bf16* residual3 = a.residual3 + l * NC;
    {
      ProfileScope ps(prof, "fwd layernorm");
      layernorm_forward(ln1, a.ln1_mean + l * N, a.ln1_rstd + l * N, residual, p.ln1w, p.ln1b,
                        N, C, stream);
    }
    {
      ProfileScope ps(prof, "fwd matmul qkv", 3 * fl);
      matmul_forward(*blas, qkv, ln1, p.qkvw, p.qkvb, N, C, 3 * C);
    }
    {
      ProfileScope ps(prof, "fwd attention");
      if (flash())
        attention_forward_flash(atty, lse, qkv, a.scratch, B, T, C, NH, stream, prof);
      else if (attention == AttentionKind::cudnn)
        cudnn_forward(atty, lse, qkv);
      else if (attention == AttentionKind::cublas_inplace)
        attention_forward_inplace(*blas, atty, att, qkv, a.scratch, B, T, C, NH);
      else
        attention_forward(*blas, atty, att, qkv, a.scratch, B, T, C, NH);
    }
    bf16* proj = a.scratch;  // free again once attention_forward's GEMMs are enqueued
    {
      ProfileScope ps(prof, "fwd matmul attn_proj", fl);
      matmul_forward(*blas, proj, atty, p.projw, p.projb, N, C, C);
    }
    {
      ProfileScope ps(prof, "fwd residual");
      residual_forward(residual2, residual, proj, static_cast<long>(NC), stream);
    }
    {
      ProfileScope ps(prof, "fwd layernorm");
      layernorm_forward(ln2, a.ln2_mean + l * N, a.ln2_rstd + l * N, residual2, p.ln2w,
                        p.ln2b, N, C, stream);
    }
    if (fuse_gelu) {
      // fch (GELU's input, kept for backward) and fch_gelu from one GEMM's epilogue.
      ProfileScope ps(prof, "fwd matmul fc (+gelu)", 4 * fl);
      matmul_forward(*blas, fch_gelu, ln2, p.fcw, p.fcb, N, C, 4 * C, 0, fch);
    } else {
      {
        ProfileScope ps(prof, "fwd matmul fc", 4 * fl);
        matmul_forward(*blas, fch, ln2, p.fcw, p.fcb, N, C, 4 * C);
      }
      ProfileScope ps(prof, "fwd gelu");
      gelu_forward(fch_gelu, fch, static_cast<long>(4 * NC), stream);
    }
    {
      ProfileScope ps(prof, "fwd matmul fc_proj", 4 * fl);
      matmul_forward(*blas, proj, fch_gelu, p.fcprojw, p.fcprojb, N, 4 * C, C);
    }
    ProfileScope ps(prof, "fwd residual");
    residual_forward(residual3, residual2, proj, static_cast<long>(NC), stream);
  }

  // The final layernorm, the LM head and the loss (with d(loss)/d(logits) for backward).
  void forward_head(const Weights<bf16>& w, const Activations& a, const int32_t* tgt, bool for_backward) {
    const int C = config.n_embd, V = config.vocab_size;
    const int N = B * T;
    const size_t NC = static_cast<size_t>(N) * C;
    const bf16* last = a.residual3 + (config.n_layer - 1) * NC;
    {
      ProfileScope ps(prof, "fwd layernorm");
      layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, last, w.lnfw, w.lnfb, N, C, stream);
    }
    const int Vp = static_cast<int>(padded_vocab(V));
    {
      ProfileScope ps(prof, "fwd matmul lm_head", 2.0 * N * C * V);
      matmul_forward(*blas, a.logits, a.lnf, w.wte, nullptr, N, C, V, Vp);
    }
    {
      ProfileScope ps(prof, "fwd classifier (softmax+CE, dlogits)");
      softmax_crossentropy(a.losses, a.logits, tgt, N, V, Vp, for_backward ? 1.0f / N : 0.0f,
                           stream);
    }
    ProfileScope ps(prof, "fwd mean loss");
    mean_loss(a.loss, a.losses, N, stream);
  }

  void backward() {
    if (pass == Pass::backward_done)
      fail("backward: already run for this forward pass; run forward() again");
    if (pass != Pass::training)
      fail("backward: the last forward pass did not compute the loss gradient (for_backward)");
    pass = Pass::backward_done;
    Weights<bf16> w(layout, params_bf16.get(), config.n_layer);
    Weights<float> g(layout, grads.get(), config.n_layer);
    Activations a = acts();
    backward_head(w, g, a);
    for (int l = config.n_layer - 1; l >= 0; --l) {
      backward_mlp(l, w.blocks[l], g.blocks[l], a);
      backward_attention(l, w.blocks[l], g.blocks[l], a);
    }
    ProfileScope ps(prof, "bwd embedding");
    encoder_backward(g.wte, g.wpe, a.dresidual, tokens.get(), B, T, config.n_embd, stream);
  }

  // The LM head and the final layernorm, back to d(residual) of the last block.
  void backward_head(const Weights<bf16>& w, const Weights<float>& g, const Activations& a) {
    const int C = config.n_embd, V = config.vocab_size;
    const int N = B * T;
    const size_t NC = static_cast<size_t>(N) * C;
    // a.logits holds d(mean loss)/d(logits) since the fused forward.
    {
      ProfileScope ps(prof, "bwd matmul lm_head");
      matmul_backward(*blas, a.dln, g.wte, nullptr, a.logits, a.lnf, w.wte, N, C, V,
                      static_cast<int>(padded_vocab(V)));
    }
    {
      ProfileScope ps(prof, "bwd memset dresidual");
      DDILOCO_CUDA_CHECK(cudaMemsetAsync(a.dresidual, 0, NC * sizeof(bf16), stream));
    }
    const bf16* last = a.residual3 + (config.n_layer - 1) * NC;
    {
      ProfileScope ps(prof, "bwd layernorm");
      layernorm_backward(a.dresidual, g.lnfw, g.lnfb, a.dln, last, w.lnfw, a.lnf_mean,
                         a.lnf_rstd, N, C, stream);
    }
  }

  // Block l's MLP branch and its layernorm, backward (p: its parameters, d: their gradients).
  void backward_mlp(int l, const Block<bf16>& p, const Block<float>& d, const Activations& a) {
    const int C = config.n_embd;
    const int N = B * T;
    const size_t NC = static_cast<size_t>(N) * C;
    // MLP branch.
    if (fuse_gelu) {
      {
        // dwide = d(fch): GELU's backward in the dgrad GEMM's epilogue.
        ProfileScope ps(prof, "bwd matmul fc_proj (+dgelu)");
        matmul_backward(*blas, a.dwide, d.fcprojw, d.fcprojb, a.dresidual,
                        a.fch_gelu + l * 4 * NC, p.fcprojw, N, 4 * C, C, 0,
                        a.fch + l * 4 * NC);
      }
      ProfileScope ps(prof, "bwd fc bias grad");
      bias_backward(d.fcb, a.dwide, N, 4 * C, 4 * C, stream);
    } else {
      {
        ProfileScope ps(prof, "bwd matmul fc_proj");
        matmul_backward(*blas, a.dwide, d.fcprojw, d.fcprojb, a.dresidual,
                        a.fch_gelu + l * 4 * NC, p.fcprojw, N, 4 * C, C);
      }
      // fc's bias gradient comes out of the same pass over the (N,4C) gradient.
      ProfileScope ps(prof, "bwd gelu (+ fc bias grad)");
      gelu_backward_bias(a.dwide, d.fcb, a.fch + l * 4 * NC, a.dwide, N, 4 * C, stream);
    }
    {
      ProfileScope ps(prof, "bwd matmul fc");
      matmul_backward(*blas, a.dln, d.fcw, nullptr, a.dwide, a.ln2 + l * NC, p.fcw, N, C, 4 * C);
    }
    {
      ProfileScope ps(prof, "bwd layernorm");
      layernorm_backward(a.dresidual, d.ln2w, d.ln2b, a.dln, a.residual2 + l * NC, p.ln2w,
                         a.ln2_mean + l * N, a.ln2_rstd + l * N, N, C, stream);
    }
  }

  // Block l's attention branch and its layernorm, backward.
  void backward_attention(int l, const Block<bf16>& p, const Block<float>& d, const Activations& a) {
    const int C = config.n_embd, NH = config.n_head;
    const int N = B * T;
    const size_t NC = static_cast<size_t>(N) * C;
    const bf16* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * NC;
    // Attention branch.
    {
      ProfileScope ps(prof, "bwd matmul attn_proj");
      matmul_backward(*blas, a.datty, d.projw, d.projb, a.dresidual, a.atty + l * NC, p.projw,
                      N, C, C);
    }
    {
      ProfileScope ps(prof, "bwd attention");
      if (flash())
        attention_backward_flash(a.dwide, a.datty, a.qkv + l * 3 * NC, a.atty + l * NC,
                                 a.lse + l * lse_stride(B, NH, T), a.scratch,
                                 a.delta, B, T, C, NH, stream, prof);
      else if (attention == AttentionKind::cudnn)
        cudnn_backward(a.dwide, a.datty, a.qkv + l * 3 * NC, a.atty + l * NC,
                       a.lse + l * lse_stride(B, NH, T));
      else if (attention == AttentionKind::cublas_inplace)
        attention_backward_inplace(*blas, a.dwide, a.datty, a.qkv + l * 3 * NC,
                                   a.att + static_cast<size_t>(l) * B * NH * T * T, a.scratch,
                                   B, T, C, NH);
      else
        attention_backward(*blas, a.dwide, a.datty, a.qkv + l * 3 * NC,
                           a.att + static_cast<size_t>(l) * B * NH * T * T, a.scratch, B, T,
                           C, NH);
    }
    {
      ProfileScope ps(prof, "bwd matmul qkv");
      matmul_backward(*blas, a.dln, d.qkvw, d.qkvb, a.dwide, a.ln1 + l * NC, p.qkvw, N, C,
                      3 * C);
    }
    ProfileScope ps(prof, "bwd layernorm");
    layernorm_backward(a.dresidual, d.ln1w, d.ln1b, a.dln, residual, p.ln1w,
                       a.ln1_mean + l * N, a.ln1_rstd + l * N, N, C, stream);
  }
};

std::string attention_kind_name(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::cublas: return "cublas";
    case AttentionKind::flash: return "flash";
    case AttentionKind::cublas_inplace: return "cublas_inplace";
    case AttentionKind::cudnn: return "cudnn";
  }
  return "?";
}

bool attention_kind_built(AttentionKind kind) {
#if DDILOCO_HAVE_CUDNN
  (void)kind;
  return true;
#else
  return kind != AttentionKind::cudnn;
#endif
}

AttentionKind parse_attention_kind(std::string_view name) {
  std::string valid;
  for (const auto kind : kAttentionKinds) {
    if (!attention_kind_built(kind)) continue;
    if (name == attention_kind_name(kind)) return kind;
    valid += (valid.empty() ? "" : " | ") + attention_kind_name(kind);
  }
  if (name == attention_kind_name(AttentionKind::cudnn))
    fail("GPU attention 'cudnn' is not in this build (built without cuDNN 9); expected {}",
         valid);
  fail("GPU attention '{}' is unknown; expected {}", name, valid);
}

GptCuda::GptCuda(const GptConfig& config, const AdamWConfig& adamw, AttentionKind attention,
                 OptimizerShard shard)
    : impl_(std::make_unique<Impl>(config, adamw, attention, shard)) {}
GptCuda::~GptCuda() = default;

const GptConfig& GptCuda::config() const { return impl_->config; }
const ParameterLayout& GptCuda::layout() const { return impl_->layout; }
size_t GptCuda::num_parameters() const { return impl_->layout.size(); }
AttentionKind GptCuda::attention() const { return impl_->attention; }
void GptCuda::set_gelu_fusion(bool on) { impl_->fuse_gelu = on; }
bool GptCuda::gelu_fusion() const { return impl_->fuse_gelu; }
long GptCuda::fused_epilogue_fallbacks() const { return impl_->blas->optional_misses(); }

void GptCuda::init_weights(uint64_t seed) {
  // The CPU model's initialiser, so both paths start from identical weights.
  Gpt<float> cpu(impl_->config);
  cpu.init_weights(seed);
  set_parameters(cpu.parameters());
}

void GptCuda::set_parameters(std::span<const float> host, size_t offset) {
  impl_->check_range(offset, host.size(), "set_parameters");
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(impl_->params.get() + offset, host.data(),
                                     host.size() * sizeof(float), cudaMemcpyHostToDevice,
                                     impl_->stream));
  fp32_to_bf16(impl_->params_bf16.get() + offset, impl_->params.get() + offset, host.size(),
               impl_->stream);
  synchronize();
}

void GptCuda::get_parameters(std::span<float> host, size_t offset) const {
  impl_->check_range(offset, host.size(), "get_parameters");
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(host.data(), impl_->params.get() + offset,
                                     host.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                     impl_->stream));
  synchronize();
}

void GptCuda::get_gradients(std::span<float> host, size_t offset) const {
  impl_->check_range(offset, host.size(), "get_gradients");
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(host.data(), impl_->grads.get() + offset,
                                     host.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                     impl_->stream));
  synchronize();
}

float GptCuda::forward(const int32_t* tokens, const int32_t* targets, int B, int T,
                       bool for_backward) {
  if (targets == nullptr) fail("forward: the GPU model needs targets");
  if (B < 1) fail("forward: batch size must be ≥ 1, got {}", B);
  if (T < 1 || T > impl_->config.seq_len)
    fail("forward: sequence length must be in [1, model.seq_len = {}], got {}",
         impl_->config.seq_len, T);
  const int V = impl_->config.vocab_size;
  const long N = static_cast<long>(B) * T;
  for (long i = 0; i < N; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V)
      fail("forward: token {} at position {} is outside the vocabulary [0, {})", tokens[i], i, V);
    if (targets[i] < 0 || targets[i] >= V)
      fail("forward: target {} at position {} is outside the vocabulary [0, {})", targets[i], i,
           V);
  }
  impl_->ensure_activations(B, T);
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(impl_->tokens.get(), tokens, N * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, impl_->stream));
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(impl_->targets.get(), targets, N * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, impl_->stream));
  impl_->forward(impl_->tokens.get(), impl_->targets.get(), B, T, for_backward);
  return loss();
}

void GptCuda::forward_device(const int32_t* tokens, const int32_t* targets, int B, int T,
                             bool for_backward) {
  impl_->forward(tokens, targets, B, T, for_backward);
}

float GptCuda::loss() const {
  if (impl_->pass == Impl::Pass::none) fail("loss: no forward pass has run");
  float value = 0;
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(&value, impl_->acts().loss, sizeof(float),
                                     cudaMemcpyDeviceToHost, impl_->stream));
  synchronize();
  return value;
}

void GptCuda::get_losses(std::span<float> host) const {
  if (impl_->pass == Impl::Pass::none) fail("losses: no forward pass has run");
  const size_t N = static_cast<size_t>(impl_->B) * impl_->T;
  if (host.size() != N) fail("losses: expected room for {} values, got {}", N, host.size());
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(host.data(), impl_->acts().losses, N * sizeof(float),
                                     cudaMemcpyDeviceToHost, impl_->stream));
  synchronize();
}

void GptCuda::zero_grad() {
  ProfileScope ps(impl_->prof, "opt zero_grad memset");
  DDILOCO_CUDA_CHECK(cudaMemsetAsync(impl_->grads.get(), 0, impl_->layout.size() * sizeof(float),
                                     impl_->stream));
}

void GptCuda::backward() { impl_->backward(); }

void GptCuda::clip_grad_norm(float max_norm) {
  ProfileScope ps(impl_->prof, "opt grad norm + clip coefficient");
  grad_norm_and_clip_scale(impl_->clip.get(), impl_->clip.get() + 1, impl_->accum.get(),
                           impl_->grads.get(), impl_->layout.size(), max_norm, impl_->stream,
                           impl_->prof);
  impl_->clip_pending = true;
}

float GptCuda::grad_norm() const {
  float value = 0;
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(&value, impl_->clip.get(), sizeof(float),
                                     cudaMemcpyDeviceToHost, impl_->stream));
  synchronize();
  return value;
}

void GptCuda::step(double lr) {
  if (!(lr > 0)) fail("AdamW: learning rate must be > 0, got {}", lr);
  Impl& s = *impl_;
  ++s.t;
  // Bias corrections in double on the host, as ddiloco::AdamW computes them.
  const double bc1 = 1.0 - std::pow(s.adamw.beta1, static_cast<double>(s.t));
  const double bc2 = 1.0 - std::pow(s.adamw.beta2, static_cast<double>(s.t));
  ProfileScope ps(s.prof, "opt AdamW (applies clip, writes bf16 copy)");
  const size_t lo = s.shard.lo;
  adamw_step(s.params.get() + lo, s.params_bf16.get() + lo, s.grads.get() + lo, s.m.get(), s.v.get(),
             s.decay_mask.get() + lo, s.shard.n, static_cast<float>(lr),
             static_cast<float>(s.adamw.beta1), static_cast<float>(s.adamw.beta2),
             static_cast<float>(bc1), static_cast<float>(bc2), static_cast<float>(s.adamw.eps),
             static_cast<float>(s.adamw.weight_decay), s.clip_pending ? s.clip.get() + 1 : nullptr,
             s.stream);
  s.clip_pending = false;
}

int64_t GptCuda::step_count() const { return impl_->t; }

const OptimizerShard& GptCuda::shard() const { return impl_->shard; }

void GptCuda::shard_grad_sum_squares() {
  ProfileScope ps(impl_->prof, "opt grad norm: shard's sum of squares");
  grad_sum_squares(impl_->accum.get(), impl_->grads.get() + impl_->shard.lo, impl_->shard.n, impl_->stream);
}

double* GptCuda::norm_partials_device() { return impl_->accum.get(); }
size_t GptCuda::norm_partials() const { return kGradNormPartials; }

void GptCuda::clip_from_partials(float max_norm) {
  ProfileScope ps(impl_->prof, "opt clip coefficient");
  clip_scale_from_partials(impl_->clip.get(), impl_->clip.get() + 1, impl_->accum.get(), max_norm, impl_->stream);
  impl_->clip_pending = true;
}

void GptCuda::reset_optimizer() {
  const size_t bytes = impl_->shard.n * sizeof(float);
  DDILOCO_CUDA_CHECK(cudaMemsetAsync(impl_->m.get(), 0, bytes, impl_->stream));
  DDILOCO_CUDA_CHECK(cudaMemsetAsync(impl_->v.get(), 0, bytes, impl_->stream));
  impl_->t = 0;
}

void GptCuda::get_optimizer_state(std::span<float> m, std::span<float> v) const {
  const size_t P = impl_->shard.n;
  if (m.size() != P || v.size() != P)
    fail("get_optimizer_state: expected {} moments each, got {} and {}", P, m.size(), v.size());
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(m.data(), impl_->m.get(), P * sizeof(float),
                                     cudaMemcpyDeviceToHost, impl_->stream));
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(v.data(), impl_->v.get(), P * sizeof(float),
                                     cudaMemcpyDeviceToHost, impl_->stream));
  synchronize();
}

void GptCuda::set_optimizer_state(std::span<const float> m, std::span<const float> v,
                                  int64_t step) {
  const size_t P = impl_->shard.n;
  if (m.size() != P || v.size() != P)
    fail("set_optimizer_state: expected {} moments each, got {} and {}", P, m.size(), v.size());
  if (step < 0) fail("set_optimizer_state: step count must be ≥ 0, got {}", step);
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(impl_->m.get(), m.data(), P * sizeof(float),
                                     cudaMemcpyHostToDevice, impl_->stream));
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(impl_->v.get(), v.data(), P * sizeof(float),
                                     cudaMemcpyHostToDevice, impl_->stream));
  synchronize();
  impl_->t = step;
}

void GptCuda::read_loss_and_grad_norm(float& loss, float& grad_norm) const {
  if (impl_->pass == Impl::Pass::none) fail("loss: no forward pass has run");
  // Both copies on the model's stream, one wait: the step's only host synchronisation.
  float values[2] = {0, 0};
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(&values[0], impl_->acts().loss, sizeof(float),
                                     cudaMemcpyDeviceToHost, impl_->stream));
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(&values[1], impl_->clip.get(), sizeof(float),
                                     cudaMemcpyDeviceToHost, impl_->stream));
  synchronize();
  loss = values[0];
  grad_norm = values[1];
}

float* GptCuda::loss_device() {
  if (impl_->pass == Impl::Pass::none) fail("loss_device: no forward pass has run");
  return impl_->acts().loss;
}

float* GptCuda::parameters_device() { return impl_->params.get(); }
float* GptCuda::gradients_device() { return impl_->grads.get(); }

void GptCuda::refresh_bf16() {
  fp32_to_bf16(impl_->params_bf16.get(), impl_->params.get(), impl_->layout.size(),
               impl_->stream);
}

void* GptCuda::stream() const { return impl_->stream; }

void GptCuda::set_profiler(OpProfiler* profiler) {
  impl_->prof = profiler;
  impl_->blas->set_profiler(profiler);
}

void GptCuda::synchronize() const { DDILOCO_CUDA_CHECK(cudaStreamSynchronize(impl_->stream)); }

}  // namespace ddiloco::gpu
