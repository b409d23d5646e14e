// What a mode means for the outer loop: named properties, derived from the mode's traits
// (ModeTraits, config.hpp: the one table from mode to properties), which the learner, the
// syncer and the checkpoint ask instead of comparing modes.
//
// No code compares modes outside those two tables: validation, the CLI's dispatch of `single`
// (one unit, no syncer: it has no plan) and the refusals of `launch`, `syncer`/`unit` and
// `--resume` ask the traits too; their messages name the modes that can.
//
// ddp stays on the learner/syncer path (decided in issue 32): its units are learners whose
// gradients a ring all-reduces every step, and the syncer still evaluates θ, keeps the token
// and goodput books and writes the same metrics, so one launch path and one report serve
// every mode. What differs is `outer_steps = false`, asked where it matters.
#pragma once

#include <cstdint>

#include "ddiloco/config.hpp"

namespace ddiloco {

/// The effective outer-loop settings of a multi-unit mode, everything else being equal:
///   ddp        gradients all-reduced across all units every step; no outer loop (P = 1 is
///              used only to ship θ to the syncer for global evaluation)
///   diloco     P = 1, τ = 0, K = M: every unit waits for every merge
///   streaming  P, τ from the config, K = M: a unit waits at send + τ for the merge
///   decoupled  P, τ, K from the config plus the grace window; a unit never waits (except
///              τ = 0, where the merge is by definition needed before the next step)
///
/// | property                | ddp | diloco | streaming | decoupled |
/// |-------------------------|-----|--------|-----------|-----------|
/// | outer_steps             |     | ✓      | ✓         | ✓         |
/// | every_merge_has_all     | ✓   | ✓      | ✓         |           |
/// | stops_on_token_budget   |     |        |           | ✓         |
/// | lr_on_job_clock         |     |        |           | ✓         |
/// | stops_on_named_round    |     | ✓      |           |           |
/// | can_rejoin              |     | ✓      |           | ✓         |
/// | redoes_lost_round       |     | ✓      |           |           |
/// | learners_wait           |     | ✓      | ✓         | τ = 0     |
struct OuterPlan {
  Mode mode = Mode::decoupled;
  int fragments = 1;
  int h = 1;
  int overlap = 0;
  int64_t warmup = 0;          ///< outer.warmup_steps: every step synchronised up to it (not ddp)
  int quorum = 1;              ///< K; M wherever every merge has every unit
  /// false for ddp: gradients are all-reduced every step, the syncer only evaluates and no
  /// checkpoint is written.
  bool outer_steps = true;
  /// A merge waits for every unit (K = M, no grace window), so the merge of a unit's k-th
  /// snapshot is version k. false for decoupled: a quorum of K and the grace window decide.
  bool every_merge_has_all = true;
  /// The job ends when the units together have trained the token budget (the syncer's count),
  /// not after train.steps steps of each unit: units of different speeds train different steps.
  bool stops_on_token_budget = false;
  /// The learning-rate schedule follows the job's token progress (kJobTokens, written by the
  /// syncer), not the unit's own steps, so a unit that rejoins late takes up the job's lr.
  bool lr_on_job_clock = false;
  /// Every unit stops after the same round, the one the syncer names (kStopAfterVersion).
  bool stops_on_named_round = false;
  /// A unit that crashed or diverged may start again from Θ while the others go on.
  bool can_rejoin = false;
  /// A unit back from a crash redoes the round it lost from step round·H (after the warm-up's
  /// rounds of one step), so rounds are counted in steps: outer.h and outer.warmup_steps
  /// cannot change on resume.
  bool redoes_lost_round = false;
  bool learners_wait = false;  ///< a unit blocks at send + τ until its merge has arrived

  /// Throws Error for mode single (no outer loop) and for settings the mode cannot run
  /// (τ ≥ H with fragments, ...).
  static OuterPlan from(const Config& config);
  /// The number of fragments `config` is trained with: 1 for single, ddp and diloco, else
  /// outer.fragments. Does not validate the rest of the plan.
  static int fragments_of(const Config& config);
};

}  // namespace ddiloco
