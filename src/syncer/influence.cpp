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

OuterGradientBound::OuterGradientBound(int fragments, double kappa, double kappa_steps, size_t keep, int64_t max_age)
    : kappa_(kappa), kappa_steps_(kappa_steps), keep_(keep), max_age_(max_age),
      record_(static_cast<size_t>(std::max(fragments, 0))) {
  if (!(kappa >= 0) || !std::isfinite(kappa)) fail("OuterGradientBound: κ = {} (expected ≥ 0)", kappa);
  if (!(kappa_steps >= 0) || !std::isfinite(kappa_steps)) fail("OuterGradientBound: κ_s = {} (expected ≥ 0)", kappa_steps);
  if (keep == 0) fail("OuterGradientBound: keep = 0 (expected ≥ 1)");
  if (max_age < 1) fail("OuterGradientBound: max_age = {} (expected ≥ 1)", max_age);
}

std::vector<double> OuterGradientBound::clip(int p, int64_t version, std::span<const Sized> merge) {
  auto& record = record_.at(static_cast<size_t>(p));
  std::erase_if(record, [&](const Kept& k) { return version - k.version > max_age_; });
  std::vector<double> others;
  // The lower median of `field` over the contributions of units other than `unit`.
  auto others_median = [&](int unit, auto&& field_now, auto&& field_kept) {
    others.clear();
    for (size_t j = 0; j < merge.size(); ++j)
      if (merge[j].unit != unit) others.push_back(field_now(j));
    for (const Kept& k : record)
      if (k.unit != unit) others.push_back(field_kept(k));
    return others.empty() ? std::numeric_limits<double>::quiet_NaN() : lower_median(others);
  };
  const size_t n = merge.size();
  std::vector<double> steps(n), rho(n), scale(n, 1.0);
  for (size_t i = 0; i < n; ++i) {
    steps[i] = std::max<double>(1.0, static_cast<double>(merge[i].steps));
    const double typical = others_median(
        merge[i].unit, [&](size_t j) { return std::max<double>(1.0, static_cast<double>(merge[j].steps)); },
        [](const Kept& k) { return k.steps; });
    if (kappa_steps_ > 0 && std::isfinite(typical)) steps[i] = std::min(steps[i], kappa_steps_ * typical);
  }
  for (size_t i = 0; i < n; ++i) rho[i] = merge[i].norm / steps[i];
  std::vector<double> kept = rho;
  for (size_t i = 0; i < n && kappa_ > 0; ++i) {
    const double nu = others_median(merge[i].unit, [&](size_t j) { return rho[j]; },
                                    [](const Kept& k) { return k.per_step; });
    if (!std::isfinite(nu) || !(nu > 0) || !(rho[i] > kappa_ * nu)) continue;
    scale[i] = kappa_ * nu / rho[i];
    kept[i] = kappa_ * nu;
  }
  for (size_t i = 0; i < n; ++i) {
    record.push_back({merge[i].unit, version, steps[i], kept[i]});
    // Each unit's own last `keep`: the oldest of this unit's entries goes.
    const auto mine = [&](const Kept& k) { return k.unit == merge[i].unit; };
    if (static_cast<size_t>(std::count_if(record.begin(), record.end(), mine)) > keep_)
      record.erase(std::find_if(record.begin(), record.end(), mine));
  }
  return scale;
}

}  // namespace ddiloco::syncer
