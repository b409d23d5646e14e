// Mode → outer-loop settings: the plan of a config, from its mode's traits (config.hpp).
#include "ddiloco/outer_plan.hpp"

#include "ddiloco/error.hpp"

namespace ddiloco {

int OuterPlan::fragments_of(const Config& c) { return mode_traits(c.mode).fragments ? c.outer.fragments : 1; }

OuterPlan OuterPlan::from(const Config& c) {
  const ModeTraits& m = mode_traits(c.mode);
  if (!m.has_syncer) fail("mode single has no outer loop");
  OuterPlan plan;
  plan.mode = c.mode;
  plan.h = c.outer.h;
  plan.fragments = fragments_of(c);
  plan.outer_steps = m.outer_steps;
  plan.overlap = m.fragments ? c.outer.overlap : 0;
  plan.quorum = m.quorum ? c.syncer.quorum : c.units.count;
  plan.every_merge_has_all = !m.quorum;
  plan.stops_on_token_budget = plan.lr_on_job_clock = m.token_budget;
  plan.stops_on_named_round = plan.redoes_lost_round = m.rounds_in_steps;
  plan.can_rejoin = m.can_rejoin;
  // A unit blocks at send + τ where every merge needs it, or where τ = 0.
  plan.learners_wait = m.outer_steps && (plan.every_merge_has_all || plan.overlap == 0);
  plan.warmup = plan.outer_steps ? c.outer.warmup_steps : 0;
  if (plan.overlap >= plan.h)
    fail("outer.overlap: must be < outer.h = {} (a merge must land before the fragment is due "
         "again), got {}",
         plan.h, plan.overlap);
  return plan;
}

}  // namespace ddiloco
