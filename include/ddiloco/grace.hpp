// The syncer's adaptive grace window (docs/algorithm.md, "Syncer, for each fragment round",
// step 2): after a quorum of K fresh snapshots, wait at most
//     g = clamp(γ · (τ·ξ_step − ξ_quorum − ξ_sync), 0, cap_steps · ξ_median_step)
// seconds for more units, where ξ are exponential moving averages of the slowest unit's inner
// step time, the time from a round's first snapshot to its quorum, and a merge + delivery.
// Rationale: learners apply a merge τ steps after sending; whatever part of that slack the
// quorum and the merge do not use can go to stragglers.
#pragma once

#include <vector>

namespace ddiloco::syncer {

class GraceWindow {
 public:
  /// gamma γ in [0, 1], cap in median step times (≥ 0), overlap τ in steps. `smoothing` is the
  /// weight of a new observation in each moving average.
  GraceWindow(double gamma, double cap_steps, int overlap, double smoothing = 0.2);

  void observe_steps(double slowest_step_s, double median_step_s);
  void observe_quorum(double seconds);
  void observe_sync(double seconds);
  /// The current window, seconds (0 until a step time has been observed).
  double seconds() const;

  /// The moving averages, saved in checkpoints: step, median, quorum, sync (seconds) and
  /// whether each of step, quorum, sync has been observed (1/0).
  std::vector<double> state() const;
  /// Restores what state() returned; throws Error unless it has 7 values.
  void restore(const std::vector<double>& state);

 private:
  static void update(double& ema, bool& seen, double x, double w);
  double gamma_, cap_steps_, smoothing_;
  int overlap_;
  double step_ = 0, median_ = 0, quorum_ = 0, sync_ = 0;
  bool step_seen_ = false, quorum_seen_ = false, sync_seen_ = false;
};

}  // namespace ddiloco::syncer
