// OpProfiler (bench gpu --profile): nested ranges, and GptCuda instrumented steps that give
// the same results as plain ones.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ddiloco/gpu/gpt_cuda.hpp"
#include "ddiloco/gpu/profiler.hpp"
#include "ddiloco/rng.hpp"
#include "gpu_test.hpp"

namespace ddiloco::gpu {
namespace {

const OpProfiler::Row* find(const OpProfiler& p, const std::string& name) {
  for (const auto& r : p.rows())
    if (r.name == name) return &r;
  return nullptr;
}

TEST(GpuProfiler, NestedRangesAndGroups) {
  DDILOCO_REQUIRE_GPU();
  GptCuda model(GptConfig{64, 64, 1, 1, 64});  // only for its stream
  OpProfiler p(model.stream());
  for (int step = 0; step < 2; ++step) {
    {
      ProfileScope a(&p, "a");
      ProfileScope b(&p, "b", 10.0);
    }
    { ProfileScope c(&p, "c"); }
    ProfileScope off(nullptr, "ignored");  // null profiler: nothing recorded
    p.collect();
  }
  EXPECT_EQ(p.steps(), 2);
  ASSERT_EQ(p.rows().size(), 3u);
  const auto* a = find(p, "a");
  const auto* b = find(p, "a / b");
  const auto* c = find(p, "c");
  ASSERT_TRUE(a && b && c);
  EXPECT_TRUE(a->group);
  EXPECT_FALSE(b->group);
  EXPECT_EQ(b->depth, 1);
  EXPECT_EQ(b->count, 2);
  EXPECT_DOUBLE_EQ(b->flops, 20.0);
  EXPECT_GE(a->ms, 0.0);
  EXPECT_GE(a->ms + 1e-3, b->ms);
}

void run_step(GptCuda& m, const int32_t* tok, const int32_t* tgt, int B, int T) {
  m.zero_grad();
  m.forward_device(tok, tgt, B, T);
  m.backward();
  m.clip_grad_norm(1.0f);
  m.step(1e-3);
}

class GpuProfilerModel : public ::testing::TestWithParam<AttentionKind> {};

TEST_P(GpuProfilerModel, InstrumentedStepMatchesPlainStep) {
  DDILOCO_REQUIRE_GPU();
  const GptConfig config{96, 128, 2, 2, 128};
  const int B = 2, T = 128, N = B * T;
  Rng rng(3);
  std::vector<int32_t> host(2 * static_cast<size_t>(N));
  for (auto& t : host) t = static_cast<int32_t>(rng.below(config.vocab_size));
  GptCuda plain(config, {}, GetParam()), profiled(config, {}, GetParam());
  plain.init_weights(7);
  profiled.init_weights(7);
  // Device tokens via the host forward path's validation-free twin: upload once.
  int32_t* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, host.size() * sizeof(int32_t)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
            cudaSuccess);
  OpProfiler p(profiled.stream());
  profiled.set_profiler(&p);
  run_step(plain, d, d + N, B, T);
  run_step(profiled, d, d + N, B, T);
  p.collect();
  profiled.set_profiler(nullptr);
  plain.synchronize();
  cudaFree(d);

  // Same loss (the forward pass is deterministic) and the same gradient norm up to the
  // summation order of the fp32 atomics in the embedding and LayerNorm backward passes.
  float loss_a = 0, norm_a = 0, loss_b = 0, norm_b = 0;
  plain.read_loss_and_grad_norm(loss_a, norm_a);
  profiled.read_loss_and_grad_norm(loss_b, norm_b);
  EXPECT_EQ(loss_a, loss_b) << "profiling changed the forward pass";
  EXPECT_NEAR(norm_a, norm_b, 1e-4 * norm_a) << "profiling changed the backward pass";

  const bool flash = GetParam() == AttentionKind::flash;
  for (const char* name :
       {"opt zero_grad memset", "fwd embedding", "fwd layernorm", "fwd matmul qkv",
        "fwd attention", "fwd matmul lm_head", "bwd matmul lm_head / dgrad",
        "bwd matmul lm_head / wgrad", "bwd matmul fc_proj / bias grad",
        "bwd gelu (+ fc bias grad)", "bwd embedding",
        "opt grad norm + clip coefficient / sum of squares"})
    EXPECT_NE(find(p, name), nullptr) << name;
  EXPECT_NE(find(p, flash ? "fwd attention / flash fwd kernel" : "fwd attention / QK^T gemm"),
            nullptr);
  EXPECT_NE(find(p, flash ? "bwd attention / dQ kernel" : "bwd attention / softmax bwd"),
            nullptr);
  // cublas_inplace: the same GEMM and softmax ranges as cublas (profiles compare side by
  // side), and no permute copies (head size 64, T = 128: attention_inplace_supported).
  const bool inplace = GetParam() == AttentionKind::cublas_inplace;
  if (!flash) {
    for (const char* name : {"fwd attention / PV gemm", "fwd attention / softmax",
                             "bwd attention / dP = dY V^T gemm", "bwd attention / dK = dS^T Q gemm"})
      EXPECT_NE(find(p, name), nullptr) << name;
  }
  EXPECT_EQ(find(p, "fwd attention / permute qkv") == nullptr, inplace);
  EXPECT_EQ(find(p, "bwd attention / unpermute dqkv") == nullptr, inplace);
  const auto* qkv = find(p, "fwd matmul qkv");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->count, config.n_layer);
  EXPECT_DOUBLE_EQ(qkv->flops, 2.0 * N * 128 * 384 * config.n_layer);
}

INSTANTIATE_TEST_SUITE_P(Attention, GpuProfilerModel,
                         ::testing::Values(AttentionKind::cublas, AttentionKind::flash,
                                           AttentionKind::cublas_inplace),
                         [](const auto& param_info) {
                           return attention_kind_name(param_info.param);
                         });

}  // namespace
}  // namespace ddiloco::gpu
