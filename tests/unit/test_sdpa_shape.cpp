// The host side of cuDNN's fused attention (sdpa_shape.hpp), without a GPU: that the 4-D
// views the cuDNN graphs are built from address our (B,T,3C) and (B,T,C) activations element
// by element, the workspace arithmetic, and every limit of cuDNN's SDPA the path checks.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include "ddiloco/error.hpp"
#include "ddiloco/sdpa_shape.hpp"

namespace ddiloco::gpu {
namespace {

constexpr long kCudnn919 = 91900;  // the version in /usr/local/cuda here and on the device image

std::string why(int B, int T, int C, int NH, bool backward = true, long version = kCudnn919,
                SdpaDtype dtype = SdpaDtype::bfloat16) {
  return sdpa_unsupported(sdpa_layout(B, T, C, NH), dtype, backward, version);
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Q, K, V of head h, position t, channel d are qkv[b][t][part·C + h·hs + d]; O is
// out[b][t][h·hs + d]; Kᵀ, Vᵀ swap (t, d). A stride or offset off by anything fails here.
TEST(SdpaShape, ViewsAddressQkvAndOutInPlace) {
  const int B = 2, T = 5, C = 24, NH = 3, hs = C / NH;
  const SdpaLayout l = sdpa_layout(B, T, C, NH);
  EXPECT_EQ(l.hs, hs);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t)
        for (int d = 0; d < hs; ++d) {
          const int64_t row3 = (static_cast<int64_t>(b) * T + t) * 3 * C + h * hs + d;
          const int64_t row1 = (static_cast<int64_t>(b) * T + t) * C + h * hs + d;
          ASSERT_EQ(l.q.at(b, h, t, d), row3);
          ASSERT_EQ(l.k.at(b, h, t, d), row3 + C);
          ASSERT_EQ(l.v.at(b, h, t, d), row3 + 2 * C);
          ASSERT_EQ(l.o.at(b, h, t, d), row1);
          ASSERT_EQ(l.k_t.at(b, h, d, t), row3 + C);
          ASSERT_EQ(l.v_t.at(b, h, d, t), row3 + 2 * C);
        }
  const std::array<int64_t, 4> bhtd{B, NH, T, hs}, bhdt{B, NH, hs, T};
  EXPECT_EQ(l.q.dims, bhtd);
  EXPECT_EQ(l.o.dims, bhtd);
  EXPECT_EQ(l.k_t.dims, bhdt);
  EXPECT_EQ(l.v_t.dims, bhdt);
}

// Each element of a dense tensor exactly once, in [0, numel).
void expect_dense(const SdpaTensor& t) {
  std::set<int64_t> seen;
  const auto& n = t.dims;
  for (int64_t a = 0; a < n[0]; ++a)
    for (int64_t b = 0; b < n[1]; ++b)
      for (int64_t c = 0; c < n[2]; ++c)
        for (int64_t d = 0; d < n[3]; ++d) seen.insert(t.at(a, b, c, d));
  const int64_t numel = n[0] * n[1] * n[2] * n[3];
  ASSERT_EQ(static_cast<int64_t>(seen.size()), numel);
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), numel - 1);
}

// The stats are read back by the backward as (B,NH,T) fp32 per layer: dense, row (b,h) then t.
TEST(SdpaShape, StatsAndScoresAreDense) {
  const SdpaLayout l = sdpa_layout(2, 7, 32, 4);
  expect_dense(l.stats);
  expect_dense(l.scores);
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 4; ++h)
      for (int t = 0; t < 7; ++t) EXPECT_EQ(l.stats.at(b, h, t, 0), (b * 4 + h) * 7 + t);
  for (int i = 0; i < 7; ++i)
    for (int j = 0; j < 7; ++j) EXPECT_EQ(l.scores_t.at(1, 3, j, i), l.scores.at(1, 3, i, j));
  EXPECT_EQ(l.rows.dims, (std::array<int64_t, 4>{2, 4, 7, 1}));
  EXPECT_FLOAT_EQ(l.scale, 1.0f / std::sqrt(8.0f));
}

// Σ dO⊙O per row lives at the start of the backward's workspace; the engine's part follows,
// 256-byte aligned.
TEST(SdpaShape, WorkspaceSplit) {
  const SdpaLayout gpt2 = sdpa_layout(16, 1024, 768, 12);
  EXPECT_EQ(gpt2.softmax_sum_bytes, 16 * 12 * 1024 * 4);
  EXPECT_EQ(gpt2.engine_workspace_offset, gpt2.softmax_sum_bytes);  // already a multiple
  const SdpaLayout small = sdpa_layout(1, 5, 24, 3);
  EXPECT_EQ(small.softmax_sum_bytes, 60);
  EXPECT_EQ(small.engine_workspace_offset, 256);
  const SdpaLayout odd = sdpa_layout(3, 100, 64, 1);
  EXPECT_EQ(odd.softmax_sum_bytes, 1200);
  EXPECT_EQ(odd.engine_workspace_offset, 1280);
}

// For every head size the path accepts, each head and row of the bf16 views starts at a
// multiple of 8 elements (16 bytes): the alignment the tensor descriptors declare.
TEST(SdpaShape, AcceptedHeadSizesGiveAlignedViews) {
  for (int hs = 8; hs <= 128; hs += 8)
    for (int NH : {1, 3, 12}) {
      const SdpaLayout l = sdpa_layout(2, 128, hs * NH, NH);
      ASSERT_EQ(sdpa_unsupported(l, SdpaDtype::bfloat16, true, kCudnn919), "") << hs;
      for (const SdpaTensor* t : {&l.q, &l.k, &l.v, &l.o}) {
        EXPECT_EQ(t->offset % 8, 0) << hs << " " << NH;
        for (int i = 0; i < 3; ++i) EXPECT_EQ(t->strides[i] % 8, 0) << hs << " " << NH;
        EXPECT_EQ(t->strides[3], 1);
      }
    }
}

TEST(SdpaShape, AcceptsGpt2Shapes) {
  EXPECT_EQ(why(16, 1024, 768, 12), "");   // GPT-2 124M, head size 64
  EXPECT_EQ(why(64, 1024, 768, 12), "");   // llm.c's micro-batch
  EXPECT_EQ(why(4, 1024, 1600, 25), "");   // GPT-2 1.5B, head size 64
  EXPECT_EQ(why(2, 100, 128, 1), "");      // head size 128, T not a multiple of 64
  EXPECT_EQ(why(2, 100, 128, 1, true, kCudnn919, SdpaDtype::float16), "");
}

TEST(SdpaShape, RefusesDtypesAndVersionsCudnnCannotRun) {
  EXPECT_TRUE(contains(why(16, 1024, 768, 12, true, kCudnn919, SdpaDtype::float32), "fp32"));
  EXPECT_TRUE(contains(why(16, 1024, 768, 12, true, 8907), "needs cuDNN 9 or newer"));
  EXPECT_TRUE(contains(why(16, 1024, 768, 12, true, 8907), "found 8.9.7"));
  EXPECT_TRUE(contains(why(16, 1024, 768, 12, false, 91000), "9.10.0 has known SDPA bugs"));
  EXPECT_TRUE(contains(why(16, 1024, 768, 12, true, 91001), "9.10.1 has known SDPA bugs"));
  EXPECT_EQ(why(16, 1024, 768, 12, true, 91002), "");
  EXPECT_EQ(why(16, 1024, 768, 12, true, kCudnnMinVersion), "");
}

TEST(SdpaShape, RefusesHeadSizesCudnnCannotRun) {
  EXPECT_EQ(why(2, 64, 36, 3), "head size n_embd/n_head must be a multiple of 8, got 12");
  EXPECT_EQ(why(2, 64, 4, 1, false), "head size n_embd/n_head must be a multiple of 8, got 4");
  EXPECT_EQ(why(2, 64, 136, 1), "head size n_embd/n_head must be ≤ 128, got 136");
  EXPECT_EQ(why(2, 64, 512, 2, false), "head size n_embd/n_head must be ≤ 128, got 256");
  EXPECT_EQ(why(2, 64, 128, 1), "");  // the limit itself
}

TEST(SdpaShape, RefusesSequenceLengthsTheBackwardCannotRun) {
  EXPECT_EQ(why(4, 1, 64, 2, false), "");  // a forward pass of one position is fine
  EXPECT_EQ(why(4, 1, 64, 2, true),
            "the backward pass needs seq_len ≥ 2 (cuDNN refuses s_q = s_kv = 1)");
  EXPECT_EQ(why(4, 2, 64, 2, true), "");
  // cuDNN ≤ 9.15.0's backward needs T % 128 == 0; the forward and newer versions do not.
  EXPECT_EQ(why(4, 1000, 64, 2, true, 91500),
            "cuDNN 9.15.0's backward needs seq_len a multiple of 128 (9.15.1 and newer do not), "
            "got 1000");
  EXPECT_EQ(why(4, 1024, 64, 2, true, 91500), "");
  EXPECT_EQ(why(4, 1000, 64, 2, false, 91500), "");
  EXPECT_EQ(why(4, 1000, 64, 2, true, 91501), "");
}

TEST(SdpaShape, BadDimensionsAndCheckThrow) {
  EXPECT_THROW(sdpa_layout(0, 8, 16, 2), Error);
  EXPECT_THROW(sdpa_layout(1, 0, 16, 2), Error);
  EXPECT_THROW(sdpa_layout(1, 8, 16, 3), Error);  // 3 does not divide 16
  EXPECT_THROW(sdpa_layout(1, 8, 16, 0), Error);
  EXPECT_NO_THROW(check_sdpa(sdpa_layout(16, 1024, 768, 12), SdpaDtype::bfloat16, true, kCudnn919));
  try {
    check_sdpa(sdpa_layout(2, 64, 36, 3), SdpaDtype::bfloat16, true, kCudnn919);
    FAIL() << "head size 12 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "cuDNN attention (B=2, T=64, C=36, NH=3): head size n_embd/n_head must be a "
              "multiple of 8, got 12");
  }
}

}  // namespace
}  // namespace ddiloco::gpu
