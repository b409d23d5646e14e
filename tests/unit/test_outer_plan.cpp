// The mode → outer-plan table (outer_plan.hpp): each mode's settings and properties, written
// out here once more, so that a change to the table is a change to this test too.
#include <gtest/gtest.h>

#include "ddiloco/config.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/outer_plan.hpp"

namespace ddiloco {
namespace {

Config four_units(const std::string& mode) {
  return load_config("", {"mode=" + mode, "units.count=4", "outer.fragments=3", "outer.h=12",
                          "outer.overlap=2", "syncer.quorum=3", "outer.warmup_steps=5"});
}

struct Row {
  const char* mode;
  int fragments, overlap, quorum;
  int64_t warmup;
  bool outer_steps, every_merge_has_all, stops_on_token_budget, lr_on_job_clock,
      stops_on_named_round, can_rejoin, redoes_lost_round, learners_wait;
};

TEST(OuterPlan, TheTable) {
  const Row rows[] = {
      // mode       P  τ  K  warm  outer  all    budget job-lr round  rejoin redo   wait
      {"ddp",       1, 0, 4, 0,    false, true,  false, false, false, false, false, false},
      {"diloco",    1, 0, 4, 5,    true,  true,  false, false, true,  true,  true,  true},
      {"streaming", 3, 2, 4, 5,    true,  true,  false, false, false, false, false, true},
      {"decoupled", 3, 2, 3, 5,    true,  false, true,  true,  false, true,  false, false},
  };
  for (const Row& r : rows) {
    const Config c = four_units(r.mode);
    const OuterPlan p = OuterPlan::from(c);
    SCOPED_TRACE(r.mode);
    EXPECT_EQ(p.mode, c.mode);
    EXPECT_EQ(p.h, 12);
    EXPECT_EQ(p.fragments, r.fragments);
    EXPECT_EQ(OuterPlan::fragments_of(c), r.fragments);
    EXPECT_EQ(p.overlap, r.overlap);
    EXPECT_EQ(p.quorum, r.quorum);
    EXPECT_EQ(p.warmup, r.warmup);
    EXPECT_EQ(p.outer_steps, r.outer_steps);
    EXPECT_EQ(p.every_merge_has_all, r.every_merge_has_all);
    EXPECT_EQ(p.stops_on_token_budget, r.stops_on_token_budget);
    EXPECT_EQ(p.lr_on_job_clock, r.lr_on_job_clock);
    EXPECT_EQ(p.stops_on_named_round, r.stops_on_named_round);
    EXPECT_EQ(p.can_rejoin, r.can_rejoin);
    EXPECT_EQ(p.redoes_lost_round, r.redoes_lost_round);
    EXPECT_EQ(p.learners_wait, r.learners_wait);
  }
  // Decoupled with τ = 0 waits: the merge is needed before the next step.
  EXPECT_TRUE(OuterPlan::from(load_config("", {"mode=decoupled", "units.count=2", "outer.overlap=0"})).learners_wait);
}

TEST(OuterPlan, RefusesWhatNoModeCanRun) {
  EXPECT_EQ(OuterPlan::fragments_of(load_config("", {"outer.fragments=4"})), 1) << "single trains whole";
  EXPECT_THROW(OuterPlan::from(load_config("")), Error) << "single has no outer loop";
  Config c = four_units("streaming");
  c.outer.overlap = 12;  // τ = H: the merge would land after the fragment is due again
  try {
    OuterPlan::from(c);
    ADD_FAILURE() << "τ = H accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "outer.overlap: must be < outer.h = 12 (a merge must land before the fragment is due again), got 12");
  }
}

}  // namespace
}  // namespace ddiloco
