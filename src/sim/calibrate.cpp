// The simulator's calibration (simulate.hpp): dp's and elastic dp's two knobs each fitted to
// the paper's goodput at two chip counts.
#include <cmath>
#include <string>
#include <vector>

#include "ddiloco/error.hpp"
#include "ddiloco/simulate.hpp"

namespace ddiloco::sim {

namespace {

// Bisection for the value of `knob` in [lo, hi] at which `goodput(value)` (decreasing in it)
// equals `target`; geometric when lo > 0. Stops when the bracket is within `rel` of itself.
template <typename F>
double fit_decreasing(F goodput, double target, double lo, double hi, const char* key,
                      const char* knob, double rel = 1e-6) {
  const double at_lo = goodput(lo), at_hi = goodput(hi);
  if (!(at_lo >= target && target >= at_hi))
    fail("{}: {} cannot be reached by fitting {}: goodput is {:.4f} at {} and {:.4f} at {}", key,
         target, knob, at_lo, lo, at_hi, hi);
  for (int i = 0; i < 60 && hi - lo > rel * hi; ++i) {
    const double mid = lo > 0 ? std::sqrt(lo * hi) : 0.5 * (lo + hi);
    if (goodput(mid) > target)
      lo = mid;
    else
      hi = mid;
  }
  return 0.5 * (lo + hi);
}

// The two knobs of one strategy fitted to its goodput at two chip counts: for each value of
// the save cost `a` (a checkpoint's seconds), `b` (the per-failure downtime) is fitted to the
// first column; `a` is then bisected until the second column matches too. A costlier save
// moves loss from downtime, which grows as the failure rate, to checkpointing and rework,
// which grow as its square root, so the second column's goodput rises with `a`.
struct TwoPointFit {
  double a = 0, b = 0;
};
TwoPointFit fit_two_points(const SimConfig& c, Strategy strategy,
                           const std::vector<double>& targets, const char* key,
                           double SimConfig::*a_knob, const char* a_name,
                           double SimConfig::*b_knob, const char* b_name, double b_lo,
                           double b_hi) {
  SimConfig first = c, second = c;
  first.chips = c.calibration_chips[0];
  second.chips = c.calibration_chips[1];
  // b fitted to the first column for a given a; NaN when no b reaches it.
  const auto fit_b = [&](double a) {
    SimConfig t = first;
    t.*a_knob = a;
    const auto goodput = [&](double b) {
      t.*b_knob = b;
      return sim::simulate(t, strategy).goodput;
    };
    if (goodput(b_lo) < targets[0]) return std::nan("");
    return fit_decreasing(goodput, targets[0], b_lo, b_hi, key, b_name);
  };
  const auto at_second = [&](double a, double b) {
    SimConfig t = second;
    t.*a_knob = a;
    t.*b_knob = b;
    return sim::simulate(t, strategy).goodput;
  };
  double lo = 1e-3, hi = 1e3;  // seconds
  const double b_at_lo = fit_b(lo);
  if (std::isnan(b_at_lo) || at_second(lo, b_at_lo) > targets[1])
    fail("{}: [{}, {}] cannot be reached by fitting {} and {}: with {} = {} the second "
         "column is already above it",
         key, targets[0], targets[1], a_name, b_name, a_name, lo);
  TwoPointFit fit{lo, b_at_lo};
  bool reached = false;
  for (int i = 0; i < 60 && hi - lo > 1e-5 * hi; ++i) {
    const double mid = std::sqrt(lo * hi);
    const double b = fit_b(mid);
    if (std::isnan(b) || at_second(mid, b) > targets[1]) {
      hi = mid;
      if (!std::isnan(b)) {
        fit = {mid, b};
        reached = true;
      }
    } else {
      lo = mid;
    }
  }
  if (!reached)
    fail("{}: [{}, {}] cannot be reached by fitting {} and {}: the first column is reached "
         "only up to {} = {:.4g} s, and there the second column is still below it",
         key, targets[0], targets[1], a_name, b_name, a_name, lo);
  return fit;
}

}  // namespace

void check_calibration(const SimConfig& c, const std::string& source) {
  if (c.calibration_chips.size() != 2)
    fail("{}: calibration.chips: must list the two fitted chip counts, got {}", source,
         c.calibration_chips.size());
  for (const auto& [key, list] : {std::pair{"calibration.dp", &c.calibration_dp},
                                  std::pair{"calibration.elastic_dp", &c.calibration_elastic_dp}})
    if (list->size() != 2)
      fail("{}: {}: must list one goodput per calibration.chips (2 values), got {}", source, key,
           list->size());
  if (c.calibration_decoupled.size() != c.sweep_learners.size())
    fail("{}: calibration.decoupled: must list one goodput per sweep.learners ({} values), "
         "got {}",
         source, c.sweep_learners.size(), c.calibration_decoupled.size());
  if (!c.failures) fail("{}: chips.failures: --calibrate needs failures, got false", source);
  for (int m : c.sweep_learners)
    if (m > c.calibration_chips[0])
      fail("{}: sweep.learners: --calibrate runs each M on calibration.chips[0] = {} chips, got "
           "M = {}",
           source, c.calibration_chips[0], m);
  if (c.calibration_headline_learners > c.calibration_chips[1])
    fail("{}: calibration.headline_learners: must be ≤ calibration.chips[1] = {}, got {}", source,
         c.calibration_chips[1], c.calibration_headline_learners);
}

SimConfig calibrate(SimConfig c, const std::string& source) {
  check_calibration(c, source);
  // dp does not depend on the elastic keys; elastic_dp depends on chips.recovery_minutes
  // (when a recovered chip rejoins), so dp is fitted first.
  const TwoPointFit dp = fit_two_points(
      c, Strategy::dp, c.calibration_dp, "calibration.dp", &SimConfig::checkpoint_seconds,
      "dp.checkpoint_seconds", &SimConfig::recovery_minutes, "chips.recovery_minutes", 1e-4, 1e4);
  c.checkpoint_seconds = dp.a;
  c.recovery_minutes = dp.b;
  const TwoPointFit elastic = fit_two_points(
      c, Strategy::elastic_dp, c.calibration_elastic_dp, "calibration.elastic_dp",
      &SimConfig::elastic_checkpoint_seconds, "elastic.checkpoint_seconds",
      &SimConfig::rescale_seconds, "elastic.rescale_seconds", 0, 1e5);
  c.elastic_checkpoint_seconds = elastic.a;
  c.rescale_seconds = elastic.b;
  return c;
}

}  // namespace ddiloco::sim
