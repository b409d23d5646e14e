// The inner-step loop every mode runs. `single` (train_single_unit, trainer.hpp) and the
// learners of the outer modes (the Learner, run_learner in ddiloco/learner.hpp) are policies
// of it: what happens before a step, and what after — logs, evaluation, publishing to the
// syncer, merges, crashes — is theirs; the loop is one.
#pragma once

#include <cstdint>

#include "ddiloco/metrics.hpp"
#include "ddiloco/trainer.hpp"

namespace ddiloco {

class StepPolicy {
 public:
  virtual ~StepPolicy() = default;
  /// Before inner step t (t ≥ 1): false ends the loop with nothing stepped.
  virtual bool before_step(int64_t t) = 0;
  /// After inner step t: `s` its statistics, `step_clock` started just before it. False ends
  /// the loop. The policy may move t (a unit back from a crash redoes its round); the loop
  /// goes on from t + 1.
  virtual bool after_step(int64_t& t, const StepStats& s, const Stopwatch& step_clock) = 0;
};

/// Runs `trainer`'s inner steps from step `first` until `policy` ends the loop; returns the
/// last step begun (first − 1 when none was).
int64_t run_steps(UnitTrainer& trainer, int64_t first, StepPolicy& policy);

}  // namespace ddiloco
