// Central finite differences in double precision, for checking backward passes.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "ddiloco/rng.hpp"

namespace ddiloco::test {

inline std::vector<double> random_vector(size_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<double> v(n);
  for (auto& x : v) x = scale * rng.normal();
  return v;
}

/// Compares `analytic` with (loss(x+h) − loss(x−h)) / 2h for every element of x. The loss is
/// re-evaluated from the current contents of x. Error measure: |a − n| / max(1, |a|, |n|).
inline void expect_gradient(std::vector<double>& x, const std::vector<double>& analytic,
                            const std::function<double()>& loss, const std::string& what,
                            double tol = 1e-6, double h = 1e-5) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = loss();
    x[i] = saved - h;
    const double down = loss();
    x[i] = saved;
    const double numeric = (up - down) / (2 * h);
    const double err = std::abs(analytic[i] - numeric) /
                       std::max({1.0, std::abs(analytic[i]), std::abs(numeric)});
    if (err > worst) {
      worst = err;
      worst_i = i;
    }
  }
  EXPECT_LT(worst, tol) << what << ": worst element " << worst_i << " analytic "
                        << analytic[worst_i];
}

/// Σ out ⊙ r: a scalar whose gradient w.r.t. out is r.
inline double project(const std::vector<double>& out, const std::vector<double>& r) {
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += out[i] * r[i];
  return s;
}

}  // namespace ddiloco::test
