// Mode → outer-loop settings (the table in outer_plan.hpp).
#include "ddiloco/outer_plan.hpp"

#include "ddiloco/error.hpp"

namespace ddiloco {

int OuterPlan::fragments_of(const Config& c) {
  return c.mode == Mode::streaming || c.mode == Mode::decoupled ? c.outer.fragments : 1;
}

OuterPlan OuterPlan::from(const Config& c) {
  OuterPlan plan;
  plan.mode = c.mode;
  plan.h = c.outer.h;
  plan.fragments = fragments_of(c);
  plan.quorum = c.units.count;
  switch (c.mode) {
    case Mode::single:
      fail("mode single has no outer loop");
    case Mode::ddp:
      plan.outer_steps = false;
      break;
    case Mode::diloco:
      plan.learners_wait = true;
      plan.stops_on_named_round = true;
      plan.can_rejoin = true;
      plan.redoes_lost_round = true;
      break;
    case Mode::streaming:
      plan.overlap = c.outer.overlap;
      plan.learners_wait = true;
      break;
    case Mode::decoupled:
      plan.overlap = c.outer.overlap;
      plan.quorum = c.syncer.quorum;
      plan.learners_wait = c.outer.overlap == 0;
      plan.every_merge_has_all = false;
      plan.stops_on_token_budget = true;
      plan.lr_on_job_clock = true;
      plan.can_rejoin = true;
      break;
  }
  plan.warmup = plan.outer_steps ? c.outer.warmup_steps : 0;
  if (plan.overlap >= plan.h)
    fail("outer.overlap: must be < outer.h = {} (a merge must land before the fragment is due "
         "again), got {}",
         plan.h, plan.overlap);
  return plan;
}

}  // namespace ddiloco
