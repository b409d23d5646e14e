// AdamW, clipping and the learning-rate schedule against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "ddiloco/error.hpp"
#include "ddiloco/optim.hpp"

namespace ddiloco {
namespace {

TEST(AdamW, TwoStepsMatchHandComputation) {
  const ParameterLayout layout = ParameterLayout::gpt2(GptConfig{2, 1, 1, 1, 1});
  // Decay applies to wte, wpe and matmul weights; not to LayerNorm or biases.
  AdamWConfig cfg{0.9, 0.99, 1e-8, 0.5};
  AdamW<double> opt(layout, cfg);
  std::vector<double> p(layout.size(), 1.0), g(layout.size());
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.1 * (i + 1);
  const double lr = 0.01;
  std::vector<double> expect = p, m(p.size(), 0), v(p.size(), 0);
  for (int t = 1; t <= 2; ++t) {
    opt.step(p, g, lr);
    for (const auto& tv : layout.tensors()) {
      for (size_t i = tv.offset; i < tv.offset + tv.numel; ++i) {
        m[i] = 0.9 * m[i] + 0.1 * g[i];
        v[i] = 0.99 * v[i] + 0.01 * g[i] * g[i];
        const double mhat = m[i] / (1 - std::pow(0.9, t));
        const double vhat = v[i] / (1 - std::pow(0.99, t));
        const double decay = tv.weight_decay ? 0.5 : 0.0;
        expect[i] -= lr * (mhat / (std::sqrt(vhat) + 1e-8) + decay * expect[i]);
      }
    }
  }
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(p[i], expect[i], 1e-14) << i;
  // First step of Adam moves every parameter by ≈ lr (plus decay): sanity of the magnitude.
  EXPECT_EQ(opt.step_count(), 2);
  opt.reset();
  EXPECT_EQ(opt.step_count(), 0);
  for (double x : opt.first_moment()) EXPECT_EQ(x, 0.0);
}

TEST(AdamW, RejectsBadInput) {
  const ParameterLayout layout = ParameterLayout::gpt2(GptConfig{2, 1, 1, 1, 1});
  AdamW<float> opt(layout, {});
  std::vector<float> p(layout.size()), g(layout.size()), short_g(3);
  EXPECT_THROW(opt.step(p, short_g, 0.1), Error);
  EXPECT_THROW(opt.step(p, g, -0.1), Error);
}

TEST(Clip, ScalesToMaxNormLikeTorch) {
  std::vector<float> g = {3, 4};  // norm 5
  const double norm = clip_grad_norm<float>(g, 1.0);
  EXPECT_DOUBLE_EQ(norm, 5.0);
  EXPECT_NEAR(g[0], 3 / (5 + 1e-6), 1e-6);
  EXPECT_NEAR(g[1], 4 / (5 + 1e-6), 1e-6);
  std::vector<float> small = {0.3f, 0.4f};
  clip_grad_norm<float>(small, 1.0);  // below the threshold: untouched
  EXPECT_FLOAT_EQ(small[0], 0.3f);
  std::vector<float> off = {30, 40};
  clip_grad_norm<float>(off, 0.0);  // 0 disables clipping
  EXPECT_FLOAT_EQ(off[1], 40.0f);
}

TEST(LrSchedule, WarmupThenCosineToFloor) {
  const LrSchedule s{1.0, 10, 110, 0.1};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.1 + 0.9 * 0.5, 1e-12);  // halfway down the cosine
  EXPECT_NEAR(s.at(35), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.25)), 1e-12);
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(1000), 0.1);
  const LrSchedule no_warmup{2.0, 0, 10, 0.5};
  EXPECT_DOUBLE_EQ(no_warmup.at(0), 2.0);
}

}  // namespace
}  // namespace ddiloco
