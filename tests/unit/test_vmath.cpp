// The vectorised fp32 kernels against libm in double precision.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/vmath.hpp"

namespace ddiloco {
namespace {

TEST(Vmath, ExpRelativeErrorWithinTwoUlpOnItsRange) {
  double worst = 0;
  for (double x = -87.0; x <= 88.0; x += 0.001) {
    const float xf = static_cast<float>(x);
    const double exact = std::exp(static_cast<double>(xf));
    worst = std::max(worst, std::abs(vmath::exp(xf) - exact) / exact);
  }
  EXPECT_LT(worst, 2.5e-7);
  EXPECT_EQ(vmath::exp(0.0f), 1.0f);
  EXPECT_GT(vmath::exp(-1000.0f), 0.0f);  // clamped, no denormal/zero surprises
  EXPECT_TRUE(std::isfinite(vmath::exp(1000.0f)));
}

TEST(Vmath, GeluMatchesTanhFormula) {
  std::vector<float> x, out(20001), back(20001), ones(20001, 1.0f);
  for (int i = -10000; i <= 10000; ++i) x.push_back(i * 0.001f);
  vmath::gelu_forward(out.data(), x.data(), static_cast<long>(x.size()));
  vmath::gelu_backward(back.data(), x.data(), ones.data(), static_cast<long>(x.size()));
  const double k = std::sqrt(2.0 / M_PI);
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    const double th = std::tanh(k * (v + 0.044715 * v * v * v));
    const double g = 0.5 * v * (1 + th);
    const double dg = 0.5 * (1 + th) + 0.5 * v * (1 - th * th) * k * (1 + 3 * 0.044715 * v * v);
    ASSERT_NEAR(out[i], g, 1e-6 * std::max(1.0, std::abs(g))) << "x = " << v;
    ASSERT_NEAR(back[i], dg, 2e-6) << "x = " << v;
  }
}

TEST(Vmath, ExpShiftSumAndMax) {
  std::vector<float> v = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
  EXPECT_EQ(vmath::max(v.data(), 5), 3.0f);
  const float sum = vmath::exp_shift_sum(v.data(), 5, 3.0f);
  double expect = 0;
  for (double x : {1.0, 3.0, -2.0, 3.0, 0.5}) expect += std::exp(x - 3.0);
  EXPECT_NEAR(sum, expect, 1e-6);
  EXPECT_NEAR(v[2], std::exp(-5.0), 1e-8);
}

}  // namespace
}  // namespace ddiloco
