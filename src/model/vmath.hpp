// Vectorised fp32 kernels for the elementwise parts of the model (GELU, softmax's exp).
//
// glibc's expf/tanhf are scalar calls that the compiler cannot vectorise without -ffast-math,
// and they took ~15 % of a training step. These versions are plain arithmetic the compiler
// vectorises, built for AVX-512, AVX2 and baseline x86-64 and picked at load time
// (target_clones), so one binary runs everywhere and uses the widest units available.
// Each function is serial: callers parallelise over chunks with OpenMP.
#pragma once

namespace ddiloco::vmath {

/// e^x for float, relative error ≤ 2e-7 (≈2 ulp) on [-87, 88]; inputs beyond are clamped
/// (e^-87 ≈ 1.6e-38, e^88 ≈ 1.7e38). Cephes-style: x = n·ln2 + r, |r| ≤ ln2/2, degree-6
/// polynomial for e^r, 2^n built in the exponent bits.
float exp(float x);

/// out[i] = gelu(inp[i]) with GPT-2's tanh approximation, tanh(u) = 1 − 2/(e^{2u} + 1).
void gelu_forward(float* out, const float* inp, long n);
/// dinp[i] = gelu'(inp[i]) · dout[i] (dinp may alias dout).
void gelu_backward(float* dinp, const float* inp, const float* dout, long n);
/// x[i] ← e^{x[i] − shift}; returns Σ x[i] (after the update), accumulated in float lanes.
float exp_shift_sum(float* x, long n, float shift);
/// max_i x[i] (n ≥ 1).
float max(const float* x, long n);

}  // namespace ddiloco::vmath
