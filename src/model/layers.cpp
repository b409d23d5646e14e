// CPU reference implementation of the GPT-2 layers. The math of each layer is stated in
// include/ddiloco/layers.hpp next to its declaration; comments here explain choices.
#include "ddiloco/layers.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "model/gemm.hpp"
#include "model/vmath.hpp"

namespace ddiloco::layers {

using detail::gemm;
using detail::gemm_serial;

namespace {
// Query rows per block in attention: small enough that the skipped upper triangle is a real
// saving, large enough that each GEMM still runs near peak.
constexpr int kQueryBlock = 64;

// Columns per task when a reduction runs over the N rows of an (N,C) matrix: each thread owns
// a stripe of columns, so no atomics and no per-thread copies of the result are needed.
constexpr int kColumnStripe = 32;

// Elementwise work is split in chunks this large so each OpenMP task runs a vectorised kernel.
constexpr long kChunk = 4096;

// Softmax of p[0..n) in place (n ≥ 1).
template <typename S>
void softmax_row(S* p, int n) {
  if constexpr (std::is_same_v<S, float>) {
    const float inv = 1.0f / vmath::exp_shift_sum(p, n, vmath::max(p, n));
    for (int j = 0; j < n; ++j) p[j] *= inv;
  } else {
    S maxval = p[0];
    for (int j = 1; j < n; ++j) maxval = std::max(maxval, p[j]);
    S sum = 0;
    for (int j = 0; j < n; ++j) {
      p[j] = std::exp(p[j] - maxval);
      sum += p[j];
    }
    const S inv = S(1) / sum;
    for (int j = 0; j < n; ++j) p[j] *= inv;
  }
}
}  // namespace

template <typename S>
void encoder_forward(S* out, const int32_t* tokens, const S* wte, const S* wpe, int B, int T,
                     int C) {
#pragma omp parallel for schedule(static)
  for (long n = 0; n < static_cast<long>(B) * T; ++n) {
    const S* w = wte + static_cast<long>(tokens[n]) * C;
    const S* p = wpe + (n % T) * C;
    S* o = out + n * C;
    for (int c = 0; c < C; ++c) o[c] = w[c] + p[c];
  }
}

template <typename S>
void encoder_backward(S* dwte, S* dwpe, const S* dout, const int32_t* tokens, int B, int T,
                      int C) {
  // Rows of dwte are shared by equal tokens, so stripe the columns across threads instead of
  // the rows; each thread walks all positions for its columns.
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += kColumnStripe) {
    const int c1 = std::min(C, c0 + kColumnStripe);
    for (long n = 0; n < static_cast<long>(B) * T; ++n) {
      const S* d = dout + n * C;
      S* w = dwte + static_cast<long>(tokens[n]) * C;
      S* p = dwpe + (n % T) * C;
      for (int c = c0; c < c1; ++c) {
        w[c] += d[c];
        p[c] += d[c];
      }
    }
  }
}

template <typename S>
void layernorm_forward(S* out, S* mean, S* rstd, const S* inp, const S* w, const S* b, int N,
                       int C) {
  constexpr S eps = S(1e-5);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const S* x = inp + static_cast<long>(n) * C;
    S m = 0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    S v = 0;
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= C;
    const S s = S(1) / std::sqrt(v + eps);
    S* o = out + static_cast<long>(n) * C;
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

template <typename S>
void layernorm_backward(S* dinp, S* dw, S* db, const S* dout, const S* inp, const S* w,
                        const S* mean, const S* rstd, int N, int C) {
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      const long row = static_cast<long>(n) * C;
      const S* x = inp + row;
      const S* d = dout + row;
      S g_mean = 0, gx_mean = 0;
      for (int c = 0; c < C; ++c) {
        const S xhat = (x[c] - mean[n]) * rstd[n];
        const S g = d[c] * w[c];
        g_mean += g;
        gx_mean += g * xhat;
      }
      g_mean /= C;
      gx_mean /= C;
      S* dx = dinp + row;
      for (int c = 0; c < C; ++c) {
        const S xhat = (x[c] - mean[n]) * rstd[n];
        dx[c] += rstd[n] * (d[c] * w[c] - g_mean - xhat * gx_mean);
      }
    }
#pragma omp for schedule(static)
    for (int c0 = 0; c0 < C; c0 += kColumnStripe) {
      const int c1 = std::min(C, c0 + kColumnStripe);
      for (int n = 0; n < N; ++n) {
        const long row = static_cast<long>(n) * C;
        for (int c = c0; c < c1; ++c) {
          const S xhat = (inp[row + c] - mean[n]) * rstd[n];
          dw[c] += dout[row + c] * xhat;
          db[c] += dout[row + c];
        }
      }
    }
  }
}

template <typename S>
void matmul_forward(S* out, const S* inp, const S* w, const S* bias, int N, int IN, int OUT) {
  S beta = 0;
  if (bias != nullptr) {
    // Seed the output with the bias and let the GEMM accumulate onto it.
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) std::memcpy(out + static_cast<long>(n) * OUT, bias, OUT * sizeof(S));
    beta = 1;
  }
  gemm(false, true, N, OUT, IN, S(1), inp, IN, w, IN, beta, out, OUT);
}

template <typename S>
void matmul_backward(S* dinp, S* dw, S* dbias, const S* dout, const S* inp, const S* w, int N,
                     int IN, int OUT) {
  if (dinp != nullptr) gemm(false, false, N, IN, OUT, S(1), dout, OUT, w, IN, S(0), dinp, IN);
  gemm(true, false, OUT, IN, N, S(1), dout, OUT, inp, IN, S(1), dw, IN);
  if (dbias != nullptr) {
#pragma omp parallel for schedule(static)
    for (int o0 = 0; o0 < OUT; o0 += kColumnStripe) {
      const int o1 = std::min(OUT, o0 + kColumnStripe);
      for (int n = 0; n < N; ++n) {
        const S* d = dout + static_cast<long>(n) * OUT;
        for (int o = o0; o < o1; ++o) dbias[o] += d[o];
      }
    }
  }
}

template <typename S>
void attention_forward(S* out, S* att, const S* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const S scale = S(1) / std::sqrt(static_cast<S>(hs));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const S* q = qkv + static_cast<long>(b) * T * C3 + h * hs;
      const S* k = q + C;
      const S* v = q + 2 * C;
      S* P = att + (static_cast<long>(b) * NH + h) * T * T;
      S* o = out + static_cast<long>(b) * T * C + h * hs;
      for (int r0 = 0; r0 < T; r0 += kQueryBlock) {
        const int rows = std::min(kQueryBlock, T - r0);
        const int keys = r0 + rows;  // queries r0.. see keys 0..keys-1 at most
        S* Pb = P + static_cast<long>(r0) * T;
        gemm_serial(false, true, rows, keys, hs, scale, q + static_cast<long>(r0) * C3, C3, k,
                    C3, S(0), Pb, T);
        for (int i = 0; i < rows; ++i) {
          const int t = r0 + i;
          S* p = Pb + static_cast<long>(i) * T;
          softmax_row(p, t + 1);
          for (int j = t + 1; j < T; ++j) p[j] = 0;  // masked: future positions
        }
        gemm_serial(false, false, rows, hs, keys, S(1), Pb, T, v, C3, S(0),
                    o + static_cast<long>(r0) * C, C);
      }
    }
  }
}

template <typename S>
void attention_backward(S* dqkv, const S* dout, const S* qkv, const S* att, int B, int T, int C,
                        int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const S scale = S(1) / std::sqrt(static_cast<S>(hs));
#pragma omp parallel
  {
    // dP / dS for one block of query rows.
    thread_local std::vector<S> scratch;
    scratch.resize(static_cast<size_t>(kQueryBlock) * T);
    S* dP = scratch.data();
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < NH; ++h) {
        const long base = static_cast<long>(b) * T * C3 + h * hs;
        const S* q = qkv + base;
        const S* k = q + C;
        const S* v = q + 2 * C;
        S* dq = dqkv + base;
        S* dk = dq + C;
        S* dv = dq + 2 * C;
        for (int t = 0; t < T; ++t) {
          std::fill_n(dk + static_cast<long>(t) * C3, hs, S(0));
          std::fill_n(dv + static_cast<long>(t) * C3, hs, S(0));
        }
        const S* P = att + (static_cast<long>(b) * NH + h) * T * T;
        const S* dO = dout + static_cast<long>(b) * T * C + h * hs;
        for (int r0 = 0; r0 < T; r0 += kQueryBlock) {
          const int rows = std::min(kQueryBlock, T - r0);
          const int keys = r0 + rows;
          const S* Pb = P + static_cast<long>(r0) * T;
          const S* dOb = dO + static_cast<long>(r0) * C;
          gemm_serial(false, true, rows, keys, hs, S(1), dOb, C, v, C3, S(0), dP, T);
          gemm_serial(true, false, keys, hs, rows, S(1), Pb, T, dOb, C, S(1), dv, C3);
          for (int i = 0; i < rows; ++i) {
            const int t = r0 + i;
            const S* p = Pb + static_cast<long>(i) * T;
            S* d = dP + static_cast<long>(i) * T;
            S dot = 0;
            for (int j = 0; j <= t; ++j) dot += p[j] * d[j];
            for (int j = 0; j <= t; ++j) d[j] = p[j] * (d[j] - dot);
            for (int j = t + 1; j < keys; ++j) d[j] = 0;
          }
          gemm_serial(false, false, rows, hs, keys, scale, dP, T, k, C3, S(0),
                      dq + static_cast<long>(r0) * C3, C3);
          gemm_serial(true, false, keys, hs, rows, scale, dP, T,
                      q + static_cast<long>(r0) * C3, C3, S(1), dk, C3);
        }
      }
    }
  }
}

template <typename S>
void gelu_forward(S* out, const S* inp, long n) {
  if constexpr (std::is_same_v<S, float>) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i += kChunk) vmath::gelu_forward(out + i, inp + i, std::min(kChunk, n - i));
  } else {
    const S k = std::sqrt(S(2) / S(M_PI));
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) {
      const S x = inp[i];
      out[i] = S(0.5) * x * (S(1) + std::tanh(k * (x + S(0.044715) * x * x * x)));
    }
  }
}

template <typename S>
void gelu_backward(S* dinp, const S* inp, const S* dout, long n) {
  if constexpr (std::is_same_v<S, float>) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i += kChunk)
      vmath::gelu_backward(dinp + i, inp + i, dout + i, std::min(kChunk, n - i));
  } else {
    const S k = std::sqrt(S(2) / S(M_PI));
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) {
      const S x = inp[i];
      const S th = std::tanh(k * (x + S(0.044715) * x * x * x));
      const S grad = S(0.5) * (S(1) + th) +
                     S(0.5) * x * (S(1) - th * th) * k * (S(1) + S(3 * 0.044715) * x * x);
      dinp[i] = grad * dout[i];
    }
  }
}

template <typename S>
void residual_forward(S* out, const S* a, const S* b, long n) {
#pragma omp parallel for schedule(static)
  for (long i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename S>
S softmax_crossentropy_forward(S* logits_to_probs, S* losses, const int32_t* targets, int N,
                               int V) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    S* p = logits_to_probs + static_cast<long>(n) * V;
    // −log softmax in log-sum-exp form: exact even when p[target] underflows.
    const S target_logit = p[targets[n]];
    S maxval = p[0];
    for (int v = 1; v < V; ++v) maxval = std::max(maxval, p[v]);
    S sum = 0;
    if constexpr (std::is_same_v<S, float>) {
      sum = vmath::exp_shift_sum(p, V, maxval);
    } else {
      for (int v = 0; v < V; ++v) sum += p[v] = std::exp(p[v] - maxval);
    }
    const S inv = S(1) / sum;
    for (int v = 0; v < V; ++v) p[v] *= inv;
    losses[n] = std::log(sum) + maxval - target_logit;
  }
  // Summed in row order after the loop rather than by an OpenMP reduction, whose partial sums
  // follow the threads' partition: the mean is then the same for any thread count.
  double total = 0;
  for (int n = 0; n < N; ++n) total += losses[n];
  return static_cast<S>(total / N);
}

template <typename S>
void softmax_crossentropy_backward(S* probs_to_dlogits, const int32_t* targets, int N, int V,
                                   S scale) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    S* p = probs_to_dlogits + static_cast<long>(n) * V;
    p[targets[n]] -= S(1);
    for (int v = 0; v < V; ++v) p[v] *= scale;
  }
}

#define DDILOCO_INSTANTIATE_LAYERS(S)                                                          \
  template void encoder_forward<S>(S*, const int32_t*, const S*, const S*, int, int, int);     \
  template void encoder_backward<S>(S*, S*, const S*, const int32_t*, int, int, int);          \
  template void layernorm_forward<S>(S*, S*, S*, const S*, const S*, const S*, int, int);      \
  template void layernorm_backward<S>(S*, S*, S*, const S*, const S*, const S*, const S*,      \
                                      const S*, int, int);                                     \
  template void matmul_forward<S>(S*, const S*, const S*, const S*, int, int, int);            \
  template void matmul_backward<S>(S*, S*, S*, const S*, const S*, const S*, int, int, int);   \
  template void attention_forward<S>(S*, S*, const S*, int, int, int, int);                    \
  template void attention_backward<S>(S*, const S*, const S*, const S*, int, int, int, int);   \
  template void gelu_forward<S>(S*, const S*, long);                                           \
  template void gelu_backward<S>(S*, const S*, const S*, long);                                \
  template void residual_forward<S>(S*, const S*, const S*, long);                             \
  template S softmax_crossentropy_forward<S>(S*, S*, const int32_t*, int, int);                \
  template void softmax_crossentropy_backward<S>(S*, const int32_t*, int, int, S);

DDILOCO_INSTANTIATE_LAYERS(float)
DDILOCO_INSTANTIATE_LAYERS(double)

}  // namespace ddiloco::layers
