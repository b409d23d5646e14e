// Test hooks on a learner (learner_hooks.hpp).
#include "learner/learner_hooks.hpp"

#include <algorithm>
#include <limits>

#include "ddiloco/mpi.hpp"

namespace ddiloco::learner {

void LearnerTestHooks::stall(LearnerCore& core, int64_t t) {
  if (debug_.stall_unit != unit_ || stalled_ || t < debug_.stall_at_step ||
      core.checkpoint_done() < debug_.stall_after_checkpoints)
    return;
  stalled_ = true;
  protocol::LearnerWindow& w = core.window();
  mpi::Backoff backoff;
  while (w.control(protocol::kGlobalVersion) < debug_.stall_until_merges && !core.stop_requested() &&
         w.control(protocol::kStopAfterVersion) == 0)
    backoff.idle();
}

bool LearnerTestHooks::poison(std::span<float> params, int64_t t) {
  if (debug_.nan_unit != unit_ || t < debug_.nan_at_step || poisoned_) return false;
  std::fill(params.begin(), params.end(), std::numeric_limits<float>::quiet_NaN());
  poisoned_ = true;
  return true;
}

}  // namespace ddiloco::learner
