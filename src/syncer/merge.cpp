#include "ddiloco/merge.hpp"

#include <algorithm>
#include <cmath>

#include "ddiloco/error.hpp"

namespace ddiloco::syncer {

double token_weight(int64_t c_tok, int64_t c_steps) {
  if (c_tok <= 0 || c_steps <= 0) return 0.0;
  const double tok = static_cast<double>(c_tok);
  return tok * (tok / static_cast<double>(c_steps));
}

MergeRule parse_merge_rule(const std::string& name) {
  if (name == "rda") return MergeRule::rda;
  if (name == "mean") return MergeRule::mean;
  fail("outer.merge: expected rda or mean, got '{}'", name);
}

bool merge_segment(std::span<const float> global, const std::vector<Contribution>& contributions,
                   size_t offset, size_t n, bool rda, std::span<double> out) {
  double total = 0;
  for (const auto& c : contributions) total += c.weight;
  if (!(total > 0)) return false;
  auto anchor = [&](const Contribution& c) {
    return (c.anchor.empty() ? global.data() : c.anchor.data()) + offset;
  };
  std::fill_n(out.data(), n, 0.0);
  int active = 0;
  for (const auto& c : contributions) active += c.weight > 0;
  // With one contribution both rules reduce to Δ itself (RDA: ‖Δ‖·unit(unit(Δ)) = Δ); taking
  // the mean path keeps that exact instead of exact up to rounding.
  if (!rda || active == 1) {
    for (const auto& c : contributions) {
      if (c.weight <= 0) continue;
      const double w = c.weight / total;
      const float* t = c.theta.data() + offset;
      const float* g = anchor(c);
      for (size_t i = 0; i < n; ++i) out[i] += w * (static_cast<double>(g[i]) - t[i]);
    }
    return true;
  }
  // RDA: the radial part is the weighted mean length, the direction the normalised weighted
  // mean of unit vectors.
  double radial = 0;
  for (const auto& c : contributions) {
    if (c.weight <= 0) continue;
    const float* t = c.theta.data() + offset;
    const float* g = anchor(c);
    double sq = 0;
    for (size_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(g[i]) - t[i];
      sq += d * d;
    }
    const double norm = std::sqrt(sq);
    radial += c.weight / total * norm;
    if (norm == 0) continue;  // unit(0) = 0
    const double scale = c.weight / total / norm;
    for (size_t i = 0; i < n; ++i) out[i] += scale * (static_cast<double>(g[i]) - t[i]);
  }
  double sq = 0;
  for (size_t i = 0; i < n; ++i) sq += out[i] * out[i];
  const double norm = std::sqrt(sq);
  if (norm == 0) return true;  // every outer gradient zero (or cancelled): Δ = 0
  const double scale = radial / norm;
  for (size_t i = 0; i < n; ++i) out[i] *= scale;
  return true;
}

OuterOptimizer::OuterOptimizer(const protocol::FragmentPlan& plan, double lr, double momentum,
                               MergeRule rule)
    : plan_(&plan), lr_(lr), mu_(momentum), rule_(rule) {
  if (!(lr > 0)) fail("outer.lr: must be > 0, got {}", lr);
  if (!(momentum >= 0 && momentum < 1)) fail("outer.momentum: must be in [0, 1), got {}", momentum);
  size_t largest = 0;
  for (const auto& f : plan.fragments()) {
    momentum_.emplace_back(f.numel, 0.0f);
    for (const auto& s : plan.segments(f.index)) largest = std::max(largest, s.numel);
  }
  scratch_.resize(largest);
}

bool OuterOptimizer::step(int p, std::span<float> theta,
                          const std::vector<Contribution>& contributions, double share, bool warm) {
  const size_t numel = plan_->fragments()[p].numel;
  if (theta.size() != numel) fail("outer step: fragment {} has {} elements, got {}", p, numel, theta.size());
  if (!(share > 0 && share <= 1)) fail("outer step: share must be in (0, 1], got {}", share);
  double total = 0;
  for (const auto& c : contributions) {
    if (c.theta.size() != numel)
      fail("outer step: a contribution to fragment {} has {} elements, expected {}", p,
           c.theta.size(), numel);
    if (!c.anchor.empty() && c.anchor.size() != numel)
      fail("outer step: an anchor for fragment {} has {} elements, expected {}", p,
           c.anchor.size(), numel);
    total += c.weight;
  }
  if (!(total > 0)) return false;
  float* v = momentum_[p].data();
  const double decay = share == 1.0 ? mu_ : std::pow(mu_, share);
  const double step = lr_ * share;
  for (const auto& seg : plan_->segments(p)) {
    const bool rda = rule_ == MergeRule::rda && !seg.embedding;
    std::span<double> delta(scratch_.data(), seg.numel);
    merge_segment(theta, contributions, seg.packed_offset, seg.numel, rda, delta);
    float* th = theta.data() + seg.packed_offset;
    float* vv = v + seg.packed_offset;
    if (warm) {
      for (size_t i = 0; i < seg.numel; ++i)
        th[i] = static_cast<float>(static_cast<double>(th[i]) - share * delta[i]);
      continue;
    }
    for (size_t i = 0; i < seg.numel; ++i) {
      const double vel = decay * vv[i] + share * delta[i];
      th[i] = static_cast<float>(static_cast<double>(th[i]) - step * (delta[i] + mu_ * vel));
      vv[i] = static_cast<float>(vel);
    }
  }
  return true;
}

}  // namespace ddiloco::syncer
