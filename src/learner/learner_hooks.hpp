// Test hooks on a learner (debug.stall_unit, debug.nan_unit): faults emulated on purpose, so
// that e2e tests can make a unit go silent or diverge at a step they choose. A Learner holds
// them only when the config names its unit; a run without debug.* never reaches this code.
#pragma once

#include <cstdint>
#include <span>

#include "ddiloco/config.hpp"
#include "learner/learner_core.hpp"

namespace ddiloco::learner {

class LearnerTestHooks {
 public:
  /// Does `debug` name unit `unit` for a hook?
  static bool wanted(const DebugConfig& debug, int unit) {
    return debug.stall_unit == unit || debug.nan_unit == unit;
  }
  LearnerTestHooks(const DebugConfig& debug, int unit) : debug_(debug), unit_(unit) {}

  /// debug.stall_unit, leader, after step t: once, hold the unit silent (no heartbeat) until
  /// the syncer has made debug.stall_until_merges merges, or the job is told to stop (in
  /// diloco a stop ends the job after the round under way, which needs this unit: a hold the
  /// stop did not release would never end).
  void stall(LearnerCore& core, int64_t t);
  /// debug.nan_unit, leader, before a snapshot after step t is packed: once, the parameters
  /// turn NaN (the syncer must refuse the snapshot; the next loss, all-reduced, is NaN on
  /// every rank). Returns true when it poisoned `params`.
  bool poison(std::span<float> params, int64_t t);

 private:
  const DebugConfig& debug_;
  const int unit_;
  bool stalled_ = false, poisoned_ = false;
};

}  // namespace ddiloco::learner
