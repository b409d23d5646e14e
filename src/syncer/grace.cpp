#include "ddiloco/grace.hpp"

#include <algorithm>

#include "ddiloco/error.hpp"

namespace ddiloco::syncer {

GraceWindow::GraceWindow(double gamma, double cap_steps, int overlap, double smoothing)
    : gamma_(gamma), cap_steps_(cap_steps), smoothing_(smoothing), overlap_(overlap) {}

void GraceWindow::update(double& ema, bool& seen, double x, double w) {
  ema = seen ? (1 - w) * ema + w * x : x;
  seen = true;
}

void GraceWindow::observe_steps(double slowest_step_s, double median_step_s) {
  bool median_seen = step_seen_;
  update(median_, median_seen, median_step_s, smoothing_);
  update(step_, step_seen_, slowest_step_s, smoothing_);
}

void GraceWindow::observe_quorum(double seconds) { update(quorum_, quorum_seen_, seconds, smoothing_); }

void GraceWindow::observe_sync(double seconds) { update(sync_, sync_seen_, seconds, smoothing_); }

double GraceWindow::seconds() const {
  if (!step_seen_) return 0.0;
  const double slack = overlap_ * step_ - quorum_ - sync_;
  return std::clamp(gamma_ * slack, 0.0, cap_steps_ * median_);
}

std::vector<double> GraceWindow::state() const {
  return {step_, median_, quorum_, sync_, double(step_seen_), double(quorum_seen_), double(sync_seen_)};
}

void GraceWindow::restore(const std::vector<double>& s) {
  if (s.size() != 7) fail("grace window state: {} values, expected 7", s.size());
  step_ = s[0];
  median_ = s[1];
  quorum_ = s[2];
  sync_ = s[3];
  step_seen_ = s[4] != 0;
  quorum_seen_ = s[5] != 0;
  sync_seen_ = s[6] != 0;
}

}  // namespace ddiloco::syncer
