// The one-job deployment of a multi-unit training job: a syncer rank and M learner units
// (modes ddp, diloco, streaming, decoupled) in one MPI world; `ddiloco train` runs run_job on
// every rank of MPI_COMM_WORLD. And the set-up both deployments share (the isolated one:
// isolated.hpp).
#pragma once

#include <mpi.h>

#include <memory>
#include <optional>
#include <string>

#include "ddiloco/checkpoint.hpp"
#include "ddiloco/config.hpp"
#include "ddiloco/data_loader.hpp"
#include "ddiloco/learner.hpp"
#include "ddiloco/outer_plan.hpp"
#include "ddiloco/topology.hpp"
#include "ddiloco/trainer.hpp"

namespace ddiloco::deploy {

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

/// The syncer's validated inputs: run.dir and the checkpoint directory usable, the resumed
/// state (checked against the configuration), and the validation set.
struct SyncerSetup {
  std::optional<checkpoint::SyncerState> state;
  std::unique_ptr<ValidationSet> val;
};
/// The syncer's set-up, the same in both deployments (setup.cpp): its inputs validated,
/// agreed over `world` (collective: every rank of the job hears of a failure, as
/// mpi::SetupFailed), then run.dir's earlier outputs cleared where `replace` and no checkpoint
/// is resumed, and the stop signals installed. `resume`: checkpoint::choose's; `restart`: a
/// syncer replacing one of this run that died (isolated), which keeps run.dir as it is.
SyncerSetup set_up_syncer(const Config& config, const OuterPlan& plan, MPI_Comm world, const std::string& resume,
                          bool replace, bool restart = false);

/// A learner rank's set-up, the same in both deployments (setup.cpp): its trainer on its data
/// stream, the checkpoint it resumes from (read and validated), agreed over topology.world
/// (collective), then the stop signals installed and the unit's processes gathered (collective
/// over the unit). `learners`: the communicator GPU ranks pick their device in (MPI_COMM_NULL
/// on the CPU); freed here. The deployment then says in `link` how to reach the syncer.
struct UnitSetup {
  std::unique_ptr<UnitTrainer> trainer;
  std::optional<learner::LearnerResume> resumed;
  learner::LearnerLink link;
};
UnitSetup set_up_unit(const Config& config, const OuterPlan& plan, const Topology& topology, MPI_Comm learners,
                      const std::string& resume);

}  // namespace ddiloco::deploy
