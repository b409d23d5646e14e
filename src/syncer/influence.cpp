// The bounds on one unit's influence on a merge (merge.hpp, issue 34): its weight (capped
// steps) and the size of its outer gradient (relative to the others').
#include <algorithm>
#include <cmath>
#include <limits>

#include "ddiloco/error.hpp"
#include "ddiloco/merge.hpp"

namespace ddiloco::syncer {

namespace {

// The lower median of `v` (reordered); v is not empty.
double lower_median(std::vector<double>& v) {
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>((v.size() - 1) / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

}  // namespace

double step_cap(std::span<const int64_t> steps, size_t u, double kappa) {
  std::vector<double> others;
  for (size_t v = 0; v < steps.size(); ++v)
    if (v != u && steps[v] > 0) others.push_back(static_cast<double>(steps[v]));
  if (kappa <= 0 || others.empty()) return std::numeric_limits<double>::infinity();
  return kappa * lower_median(others);
}

std::vector<size_t> cap_weights(std::span<const int64_t> steps, std::span<double> w, double kappa) {
  std::vector<size_t> capped;
  if (kappa <= 0 || steps.size() != w.size()) return capped;
  for (size_t u = 0; u < steps.size(); ++u) {
    const double cap = step_cap(steps, u, kappa);
    if (static_cast<double>(steps[u]) > cap) {
      w[u] *= cap / static_cast<double>(steps[u]);
      capped.push_back(u);
    }
  }
  return capped;
}

double outer_gradient_norm(std::span<const float> theta, std::span<const float> anchor) {
  if (theta.size() != anchor.size())
    fail("outer_gradient_norm: {} values against an anchor of {}", theta.size(), anchor.size());
  // Scaled by the largest |Δ|, so that values near FLT_MAX (a lying unit) cannot overflow.
  double top = 0;
  for (size_t i = 0; i < theta.size(); ++i)
    top = std::max(top, std::abs(static_cast<double>(anchor[i]) - static_cast<double>(theta[i])));
  if (top == 0 || !std::isfinite(top)) return top;
  double sum = 0;
  for (size_t i = 0; i < theta.size(); ++i) {
    const double d = (static_cast<double>(anchor[i]) - static_cast<double>(theta[i])) / top;
    sum += d * d;
  }
  return top * std::sqrt(sum);
}

OuterGradientBound::OuterGradientBound(int fragments, double kappa, double kappa_steps, size_t keep)
    : kappa_(kappa), kappa_steps_(kappa_steps), keep_(keep), record_(2 * static_cast<size_t>(std::max(fragments, 0))) {
  if (!(kappa >= 0) || !std::isfinite(kappa)) fail("OuterGradientBound: κ = {} (expected ≥ 0)", kappa);
  if (!(kappa_steps >= 0) || !std::isfinite(kappa_steps)) fail("OuterGradientBound: κ_s = {} (expected ≥ 0)", kappa_steps);
  if (keep == 0) fail("OuterGradientBound: keep = 0 (expected ≥ 1)");
}

namespace {

// The lower median over the units of each unit's vote (the lower median of its values); NaN
// when no unit has one.
double vote(const std::map<int, std::vector<double>>& by_unit) {
  std::vector<double> votes, mine;
  for (const auto& [unit, values] : by_unit) {
    mine = values;
    if (!mine.empty()) votes.push_back(lower_median(mine));
  }
  return votes.empty() ? std::numeric_limits<double>::quiet_NaN() : lower_median(votes);
}

}  // namespace

std::vector<double> OuterGradientBound::clip(int p, bool warm, int64_t h, std::span<const Sized> merge) {
  auto& record = record_.at(2 * static_cast<size_t>(p) + (warm ? 1 : 0));
  const size_t n = merge.size();
  // The units' values: recorded, then this merge's.
  std::map<int, std::vector<double>> steps_by_unit, rho_by_unit;
  for (const auto& [unit, v] : record) {
    steps_by_unit[unit] = v.steps;
    rho_by_unit[unit] = v.per_step;
  }
  std::vector<double> steps(n), rho(n), scale(n, 1.0);
  for (size_t i = 0; i < n; ++i) {
    steps[i] = std::max<double>(1.0, static_cast<double>(merge[i].steps));
    steps_by_unit[merge[i].unit].push_back(steps[i]);
  }
  const double typical = std::max(vote(steps_by_unit), static_cast<double>(std::max<int64_t>(h, 1)));
  for (size_t i = 0; i < n; ++i) {
    const double s = kappa_steps_ > 0 ? std::min(steps[i], kappa_steps_ * typical) : steps[i];
    rho[i] = merge[i].norm / s;
    rho_by_unit[merge[i].unit].push_back(rho[i]);
  }
  const double nu = vote(rho_by_unit);
  for (size_t i = 0; i < n && kappa_ > 0; ++i)
    if (std::isfinite(nu) && nu > 0 && rho[i] > kappa_ * nu) scale[i] = kappa_ * nu / rho[i];
  for (size_t i = 0; i < n; ++i) {  // each unit's last `keep`, as claimed
    Votes& v = record[merge[i].unit];
    v.steps.push_back(steps[i]);
    v.per_step.push_back(rho[i]);
    if (v.steps.size() > keep_) {
      v.steps.erase(v.steps.begin());
      v.per_step.erase(v.per_step.begin());
    }
  }
  return scale;
}

}  // namespace ddiloco::syncer
