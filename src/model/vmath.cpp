#include "model/vmath.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
#define DDILOCO_CLONES __attribute__((target_clones("avx512f", "avx2,fma", "default")))
#else
#define DDILOCO_CLONES
#endif

namespace ddiloco::vmath {

namespace {

// Inlined into each clone so that it is vectorised for that clone's instruction set.
[[gnu::always_inline]] inline float exp_inline(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // Round x/ln2 to the nearest integer by adding and removing 1.5·2^23 (vectorises on every
  // x86-64, unlike nearbyint without SSE4.1).
  constexpr float kRound = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  // r = x − n·ln2 with ln2 split in two for accuracy (Cody-Waite).
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

constexpr float kGeluK = 0.7978845608028654f;  // √(2/π)
constexpr float kGeluC = 0.044715f;

}  // namespace

float exp(float x) { return exp_inline(x); }

DDILOCO_CLONES void gelu_forward(float* out, const float* inp, long n) {
#pragma omp simd
  for (long i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kGeluK * (x + kGeluC * x * x * x);
    const float t = 1.0f - 2.0f / (exp_inline(2.0f * u) + 1.0f);
    out[i] = 0.5f * x * (1.0f + t);
  }
}

DDILOCO_CLONES void gelu_backward(float* dinp, const float* inp, const float* dout, long n) {
#pragma omp simd
  for (long i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kGeluK * (x + kGeluC * x * x * x);
    const float t = 1.0f - 2.0f / (exp_inline(2.0f * u) + 1.0f);
    const float sech2 = 1.0f - t * t;
    const float grad =
        0.5f * (1.0f + t) + 0.5f * x * sech2 * kGeluK * (1.0f + 3.0f * kGeluC * x * x);
    dinp[i] = grad * dout[i];
  }
}

DDILOCO_CLONES float exp_shift_sum(float* x, long n, float shift) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (long i = 0; i < n; ++i) {
    x[i] = exp_inline(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

DDILOCO_CLONES float max(const float* x, long n) {
  float m = x[0];
#pragma omp simd reduction(max : m)
  for (long i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

}  // namespace ddiloco::vmath
