// cuDNN's fused attention (gpu/cudnn_attention.hpp) against the CPU reference layers, forward
// and backward, as test_kernels.cpp checks the cublas and flash paths: same random bf16
// inputs on both sides, error max|gpu − cpu| / max|cpu| per tensor (test::scaled_error),
// tolerance kAttn = 3e-2 for the reasons given there (here the scores stay fp32 inside the
// fused kernel and only P is rounded to bf16 before P·V, as in the flash path). Also: the
// plan cache, the deterministic backward, the log-sum-exp statistics, and the refusals.
// Every test skips without a GPU; in a build without cuDNN the one test left says so.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "ddiloco/error.hpp"
#include "ddiloco/gpu/cudnn_attention.hpp"
#include "ddiloco/gpu/gpt_cuda.hpp"
#include "ddiloco/gpu/kernels.hpp"
#include "ddiloco/sdpa_shape.hpp"
#include "ddiloco/layers.hpp"
#include "device_util.hpp"
#include "gpu_test.hpp"

namespace ddiloco::gpu {
namespace {

#if DDILOCO_HAVE_CUDNN

using test::DeviceArray;
using test::random_bf16_values;
using test::scaled_error;
using test::to_bf16;
using test::to_float;

constexpr double kAttn = 3e-2;

struct Shape {
  int B, T, C, NH;
};
std::ostream& operator<<(std::ostream& os, const Shape& s) {
  return os << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH;
}

// Columns [part·C, (part+1)·C) of the rows of a (N, 3C) tensor: dQ, dK or dV of dqkv.
std::vector<float> third(const std::vector<float>& x, size_t N, int C, int part) {
  std::vector<float> r;
  for (size_t row = 0; row < N; ++row)
    for (int c = 0; c < C; ++c) r.push_back(x[row * 3 * C + static_cast<size_t>(part) * C + c]);
  return r;
}

// Skips shapes the loaded cuDNN cannot run (e.g. T % 128 ≠ 0 before 9.15.1).
#define DDILOCO_SKIP_UNLESS_CUDNN_RUNS(B, T, C, NH)                                     \
  do {                                                                                 \
    const std::string why_ = sdpa_unsupported(sdpa_layout(B, T, C, NH), SdpaDtype::bfloat16, \
                                              true, cudnn_runtime_version());          \
    if (!why_.empty()) GTEST_SKIP() << why_;                                           \
  } while (0)

class GpuCudnnAttention : public ::testing::TestWithParam<Shape> {};

// Head sizes 32, 64 and 128; T a multiple of 64 and not (100, 40); GPT-2's 12 heads.
TEST_P(GpuCudnnAttention, ForwardBackwardMatchCpu) {
  DDILOCO_REQUIRE_GPU();
  const auto [B, T, C, NH] = GetParam();
  DDILOCO_SKIP_UNLESS_CUDNN_RUNS(B, T, C, NH);
  const size_t N = static_cast<size_t>(B) * T, NC = N * C;
  const auto qkv = random_bf16_values(3 * NC, 31);
  const auto dout = random_bf16_values(NC, 32);
  std::vector<float> out(NC), att(static_cast<size_t>(B) * NH * T * T), dqkv(3 * NC);
  layers::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  layers::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);

  DeviceArray<bf16> d_qkv(to_bf16(qkv)), d_out(NC), d_dout(to_bf16(dout)), d_dqkv(3 * NC);
  DeviceArray<float> d_stats(static_cast<size_t>(B) * NH * T);
  CudnnAttention attn(nullptr);
  attn.forward(d_out.get(), d_stats.get(), d_qkv.get(), B, T, C, NH);
  attn.backward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_stats.get(), B, T, C, NH);
  EXPECT_LE(scaled_error(to_float(d_out.download()), out), kAttn) << "out";
  const auto g = to_float(d_dqkv.download());
  for (int part = 0; part < 3; ++part)
    EXPECT_LE(scaled_error(third(g, N, C, part), third(dqkv, N, C, part)), kAttn)
        << "d" << "qkv"[part];
  // Row 0 of head 0 sees only its own key: lse = q₀·k₀/√hs.
  double s = 0;
  for (int d = 0; d < C / NH; ++d) s += static_cast<double>(qkv[d]) * qkv[C + d];
  EXPECT_NEAR(d_stats.download()[0], s / std::sqrt(C / NH), 2e-2 * std::max(1.0, std::abs(s)));
  std::printf("cudnn attention %d,%d,%d,%d: out err %.3g, dqkv err %.3g, workspace %zu B\n", B, T,
              C, NH, scaled_error(to_float(d_out.download()), out), scaled_error(g, dqkv),
              attn.workspace_bytes());
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuCudnnAttention,
                         ::testing::Values(Shape{2, 64, 128, 2}, Shape{2, 128, 64, 1},
                                           Shape{1, 256, 768, 12}, Shape{1, 1024, 128, 2},
                                           Shape{3, 100, 96, 3}, Shape{2, 40, 256, 2}));

// One plan per shape and direction, built once; the backward is deterministic (llm.c's
// choice): the same inputs give bit-identical gradients.
TEST(GpuCudnnAttentionCache, PlansAreCachedByShapeAndBackwardIsDeterministic) {
  DDILOCO_REQUIRE_GPU();
  const int B = 2, T = 128, C = 128, NH = 2;
  const size_t NC = static_cast<size_t>(B) * T * C;
  DeviceArray<bf16> qkv(to_bf16(random_bf16_values(3 * NC, 41))), out(NC),
      dout(to_bf16(random_bf16_values(NC, 42))), dqkv(3 * NC);
  DeviceArray<float> stats(static_cast<size_t>(B) * NH * T);
  CudnnAttention attn(nullptr);
  EXPECT_EQ(attn.plans(), 0u);
  attn.forward(out.get(), stats.get(), qkv.get(), B, T, C, NH);
  attn.forward(out.get(), stats.get(), qkv.get(), B, T, C, NH);
  EXPECT_EQ(attn.plans(), 1u);
  attn.backward(dqkv.get(), dout.get(), qkv.get(), out.get(), stats.get(), B, T, C, NH);
  const auto once = to_float(dqkv.download());
  attn.backward(dqkv.get(), dout.get(), qkv.get(), out.get(), stats.get(), B, T, C, NH);
  EXPECT_EQ(attn.plans(), 2u);
  const auto again = to_float(dqkv.download());
  size_t differ = 0;
  for (size_t i = 0; i < once.size(); ++i) differ += once[i] != again[i];
  EXPECT_EQ(differ, 0u) << "the deterministic backward gave different gradients";
  attn.forward(out.get(), stats.get(), qkv.get(), 1, T, C, NH);  // another batch: a new plan
  EXPECT_EQ(attn.plans(), 3u);
  EXPECT_GE(attn.workspace_bytes(),
            static_cast<size_t>(sdpa_layout(B, T, C, NH).engine_workspace_offset));
}

TEST(GpuCudnnAttentionCache, RefusesWhatCudnnCannotRun) {
  DDILOCO_REQUIRE_GPU();
  DeviceArray<bf16> buf(3 * 2 * 64 * 36 + 8);
  DeviceArray<float> stats(2 * 3 * 64);
  CudnnAttention attn(nullptr);
  // Head size 12: not a multiple of 8.
  EXPECT_THROW(attn.forward(buf.get(), stats.get(), buf.get(), 2, 64, 36, 3), Error);
  // A backward pass over one position.
  EXPECT_THROW(attn.backward(buf.get(), buf.get(), buf.get(), buf.get(), stats.get(), 2, 1, 32, 2),
               Error);
  // Pointers the descriptors' 16-byte alignment does not hold for.
  EXPECT_THROW(attn.forward(buf.get() + 1, stats.get(), buf.get(), 1, 64, 32, 2), Error);
  EXPECT_EQ(attn.plans(), 0u) << "nothing was built for refused calls";
}

TEST(GpuCudnnAttentionCache, KindIsBuiltAndNamed) {
  DDILOCO_REQUIRE_GPU();
  EXPECT_TRUE(attention_kind_built(AttentionKind::cudnn));
  EXPECT_EQ(parse_attention_kind("cudnn"), AttentionKind::cudnn);
  EXPECT_GE(cudnn_runtime_version(), kCudnnMinVersion);
}

#else  // built without cuDNN

TEST(GpuCudnnAttentionCache, KindIsNotBuilt) {
  DDILOCO_REQUIRE_GPU();
  EXPECT_FALSE(attention_kind_built(AttentionKind::cudnn));
  EXPECT_THROW(parse_attention_kind("cudnn"), Error);
  GTEST_SKIP() << "built without cuDNN 9: the cudnn attention path is not in this build";
}

#endif

}  // namespace
}  // namespace ddiloco::gpu
