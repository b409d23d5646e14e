// The GPT-2 layers on CPU: forward and backward, the reference every other path is checked
// against.
//
// Conventions (as in llm.c, whose layout we follow):
//   * B = batch (sequences), T = sequence length, C = channels (n_embd), NH = heads,
//     hs = C / NH head size, V = vocabulary size, N = B*T rows.
//   * All tensors are dense row-major arrays of the scalar type S (float for training, double
//     for the finite-difference gradient checks); shapes are given as (dim0, dim1, ...).
//   * Linear weights have PyTorch's nn.Linear layout (OUT, IN): y = x·Wᵀ + b.
//   * Backward functions ACCUMULATE (+=) into parameter gradients, so one zeroing per step is
//     enough. Input gradients are overwritten unless the comment says "accumulates": the two
//     functions that feed the residual stream (layernorm_backward, encoder's consumer) add into
//     it, which is how the residual branch's gradient is summed without an extra buffer.
// Threads: elementwise loops use OpenMP; products go through CBLAS (OpenBLAS' OpenMP build).
#pragma once

#include <cstdint>

namespace ddiloco::layers {

/// Token + position embedding. out(B,T,C) = wte[tokens[b,t]] + wpe[t].
/// tokens(B,T) int32 in [0, V); wte(V,C); wpe(≥T,C).
template <typename S>
void encoder_forward(S* out, const int32_t* tokens, const S* wte, const S* wpe, int B, int T,
                     int C);
/// Accumulates dwte(V,C) and dwpe(T,C) from dout(B,T,C).
template <typename S>
void encoder_backward(S* dwte, S* dwpe, const S* dout, const int32_t* tokens, int B, int T,
                      int C);

/// LayerNorm over the last dimension (Ba, Hinton et al. 2016), eps = 1e-5 as in GPT-2:
///   mean = Σx/C, rstd = 1/sqrt(Σ(x-mean)²/C + eps), out = (x-mean)·rstd·w + b.
/// inp, out (N,C); w, b (C); saves mean(N), rstd(N) for the backward pass.
template <typename S>
void layernorm_forward(S* out, S* mean, S* rstd, const S* inp, const S* w, const S* b, int N,
                       int C);
/// dinp ACCUMULATES: with x̂ = (x-mean)·rstd and g = dout·w,
///   dx += rstd · (g − mean(g) − x̂ · mean(g·x̂));  dw += Σ_N dout·x̂;  db += Σ_N dout.
template <typename S>
void layernorm_backward(S* dinp, S* dw, S* db, const S* dout, const S* inp, const S* w,
                        const S* mean, const S* rstd, int N, int C);

/// out(N,OUT) = inp(N,IN) · w(OUT,IN)ᵀ + bias(OUT); bias may be null.
template <typename S>
void matmul_forward(S* out, const S* inp, const S* w, const S* bias, int N, int IN, int OUT);
/// dinp(N,IN) = dout·w (overwritten; skipped when dinp is null); dw(OUT,IN) += doutᵀ·inp;
/// dbias(OUT) += Σ_N dout (skipped when null).
template <typename S>
void matmul_backward(S* dinp, S* dw, S* dbias, const S* dout, const S* inp, const S* w, int N,
                     int IN, int OUT);

/// Causal multi-head self-attention (Vaswani et al. 2017, GPT-2 masking).
/// qkv(B,T,3C) holds Q | K | V per position, head h at columns h*hs..h*hs+hs of each third.
/// att(B,NH,T,T) receives the softmax probabilities P = softmax(Q·Kᵀ/√hs + causal mask), zero
/// above the diagonal; out(B,T,C) = P·V with heads concatenated.
/// Row blocks of 64 queries only touch the keys they can see, so the products cost about
/// half of the dense T×T ones.
template <typename S>
void attention_forward(S* out, S* att, const S* qkv, int B, int T, int C, int NH);
/// dqkv(B,T,3C) overwritten from dout(B,T,C), using the saved qkv and att.
///   dP = dout·Vᵀ, dV = Pᵀ·dout, dS = P ⊙ (dP − rowsum(P ⊙ dP)),
///   dQ = dS·K/√hs, dK = dSᵀ·Q/√hs.
/// Each OpenMP thread keeps a 64×T scratch matrix (thread-local) for one block of queries.
template <typename S>
void attention_backward(S* dqkv, const S* dout, const S* qkv, const S* att, int B, int T, int C,
                        int NH);

/// GELU, tanh approximation as in GPT-2 (Hendrycks & Gimpel 2016):
///   gelu(x) = x/2 · (1 + tanh(√(2/π)·(x + 0.044715·x³))).
template <typename S>
void gelu_forward(S* out, const S* inp, long n);
/// dinp = d gelu(inp)/d inp · dout (overwritten).
template <typename S>
void gelu_backward(S* dinp, const S* inp, const S* dout, long n);

/// out = a + b elementwise (residual connection).
template <typename S>
void residual_forward(S* out, const S* a, const S* b, long n);

/// Softmax + cross-entropy, fused. logits(N,V) are replaced in place by the probabilities;
/// losses(N) receive -log p[target] (natural log, nats). Returns the mean loss over N.
/// targets(N) in [0, V).
template <typename S>
S softmax_crossentropy_forward(S* logits_to_probs, S* losses, const int32_t* targets, int N,
                               int V);
/// Turns probs(N,V) into dlogits in place for the loss mean over N rows:
///   dlogits = (probs − onehot(target)) · scale, where scale = 1/N for a mean.
template <typename S>
void softmax_crossentropy_backward(S* probs_to_dlogits, const int32_t* targets, int N, int V,
                                   S scale);

}  // namespace ddiloco::layers
