// The multi-unit training job: a syncer rank and M learner units (modes ddp, diloco,
// streaming, decoupled). `ddiloco train` runs run_job on every rank of MPI_COMM_WORLD.
#pragma once

#include <mpi.h>

#include <filesystem>
#include <string>

#include "ddiloco/checkpoint.hpp"
#include "ddiloco/config.hpp"
#include "ddiloco/data_loader.hpp"
#include "ddiloco/goodput.hpp"
#include "ddiloco/topology.hpp"
#include "ddiloco/trainer.hpp"
#include "ddiloco/wan.hpp"

namespace ddiloco {

/// The effective outer-loop settings of a mode, everything else being equal:
///   ddp        gradients all-reduced across all units every step; no outer loop (P = 1 is
///              used only to ship θ to the syncer for global evaluation)
///   diloco     P = 1, τ = 0, K = M: every unit waits for every merge
///   streaming  P, τ from the config, K = M: a unit waits at send + τ for the merge
///   decoupled  P, τ, K from the config plus the grace window; a unit never waits (except
///              τ = 0, where the merge is by definition needed before the next step)
struct OuterPlan {
  Mode mode = Mode::decoupled;
  int fragments = 1;
  int h = 1;
  int overlap = 0;
  int quorum = 1;
  bool learners_wait = false;  ///< a unit blocks at send + τ until its merge has arrived
  bool outer_steps = true;     ///< false for ddp: the syncer only evaluates
  /// Throws Error for settings the mode cannot run (τ ≥ H with fragments, ...).
  static OuterPlan from(const Config& config);
};

/// Runs this rank's part of a multi-unit job (config.mode ≠ single). Collective over `world`.
/// Every input is validated on every rank first (mpi::SetupFailed on all ranks otherwise);
/// run.dir must not hold a previous run unless `overwrite` or resuming. SIGINT, SIGTERM and
/// SIGUSR1 stop every unit at its next step boundary (diloco: at the end of the round under
/// way), a checkpoint is written (checkpoint.at_stop), Θ is evaluated and saved as usual.
/// `resume`: "" (a fresh start), "auto" (the newest complete checkpoint in checkpoint.dir,
/// skipping incomplete or corrupt ones with a warning; a fresh start, replacing what run.dir
/// holds, when there is none) or a checkpoint directory. A checkpoint of another job (model
/// shape, mode, units and their ranks, fragments) is refused with the mismatch named.
/// Returns the stop signal that ended the job early, or 0.
int run_job(const Config& config, MPI_Comm world, bool overwrite, const std::string& resume = "");

/// What a learner rank resumes from: the checkpoint directory, its unit's file and the
/// syncer's (read and validated during set-up).
struct LearnerResume {
  std::filesystem::path dir;
  checkpoint::UnitState unit;
  checkpoint::SyncerState syncer;
};

/// The two roles; called by run_job once set-up succeeded everywhere.
/// run_learner returns where this rank's wall time went (goodput accounting); a ddp leader
/// also what crossed its WAN link (`link`, unit −1 elsewhere).
TimeBook run_learner(const Config& config, const OuterPlan& plan, const Topology& topology,
                     UnitTrainer& trainer, const LearnerResume* resume = nullptr,
                     wan::LinkCounters* link = nullptr);
/// Returns the stop signal that ended the job early, or 0. `resumed`: the state read from
/// the checkpoint directory `resume` (nullptr: a fresh start).
int run_syncer(const Config& config, const OuterPlan& plan, const Topology& topology,
               const ValidationSet& val, const std::filesystem::path& resume = {},
               const checkpoint::SyncerState* resumed = nullptr);

}  // namespace ddiloco
