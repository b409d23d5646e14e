// The multi-unit training job: a syncer rank and M learner units (modes ddp, diloco,
// streaming, decoupled). `ddiloco train` runs run_job on every rank of MPI_COMM_WORLD.
#pragma once

#include <mpi.h>

#include <filesystem>
#include <optional>
#include <functional>
#include <memory>
#include <string>

#include "ddiloco/checkpoint.hpp"
#include "ddiloco/config.hpp"
#include "ddiloco/data_loader.hpp"
#include "ddiloco/goodput.hpp"
#include "ddiloco/outer_plan.hpp"
#include "ddiloco/remote_memory.hpp"
#include "ddiloco/topology.hpp"
#include "ddiloco/trainer.hpp"
#include "ddiloco/wan.hpp"

namespace ddiloco {

namespace sync {
class LearnerWindow;
}

/// Gathers every rank's book at rank 0 of `comm` (collective; waiting ranks sleep). Returns
/// them in rank order at the root, nothing elsewhere.
std::vector<TimeBook> gather_time_books(const TimeBook& mine, MPI_Comm comm);

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

/// The checkpoint a job resumes from for --resume `resume` ("auto" or a directory): "" for a
/// fresh start. Throws Error for a checkpoint that is corrupt or of another job.
std::string choose_checkpoint(const Config& config, const std::string& resume);

/// What a learner rank resumes from: the checkpoint directory, its unit's file and the
/// syncer's (read and validated during set-up).
struct LearnerResume {
  std::filesystem::path dir;
  checkpoint::UnitState unit;
  checkpoint::SyncerState syncer;
};

/// How a unit leader reaches the syncer: the one-job deployment's MPI window over
/// topology.sync_comm, or the isolated deployment's UCX link (topology.isolated).
struct LearnerLink {
  /// Exposes `bytes` of window memory to the syncer, connected and admitted (blocks until then;
  /// throws Error when refused or when the syncer cannot be reached in time).
  std::function<std::unique_ptr<comm::ExposedMemory>(size_t bytes)> expose;
  /// Isolated: returns once the syncer has released the unit (kReleased) after its kDone, or
  /// the link is gone, or a bounded wait has passed.
  std::function<void(sync::LearnerWindow&)> wait_released;
  /// Leader, once per step: has the link to the syncer come back since the last call (a
  /// restarted syncer admitted us again)? If so, how long it was gone, seconds. The unit then
  /// takes Θ from it afresh.
  std::function<std::optional<double>()> reconnected;
  /// Leader, isolated: is a syncer connected now? (Empty: always.) A decoupled unit that, by
  /// its own estimate, has used up the token budget while none is waits for one to come back
  /// and say stop, instead of training past the budget.
  std::function<bool()> syncer_present;
  /// Called on every rank once the unit is admitted and its ranks start training.
  std::function<void()> started;
  int64_t restart = 0;  ///< restarts of this unit before this process (DDILOCO_RESTART)
  /// Every rank's host and pid (Topology::unit_processes(), at the leader; empty elsewhere),
  /// for the unit's `start` event and the isolated deployment's handshake. The deployment
  /// gathers it once, on every rank of the unit before run_learner (it is collective).
  nlohmann::json processes;
};

/// The syncer's validated inputs: run.dir and the checkpoint directory usable, the resumed
/// state (checked against the configuration), and the validation set.
struct SyncerSetup {
  std::optional<checkpoint::SyncerState> state;
  std::unique_ptr<ValidationSet> val;
};
/// The syncer's set-up, the same in both deployments (setup.cpp): its inputs validated,
/// agreed over `world` (collective: every rank of the job hears of a failure, as
/// mpi::SetupFailed), then run.dir's earlier outputs cleared where `replace` and no checkpoint
/// is resumed, and the stop signals installed. `resume`: choose_checkpoint's; `restart`: a
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
  std::optional<LearnerResume> resumed;
  LearnerLink link;
};
UnitSetup set_up_unit(const Config& config, const OuterPlan& plan, const Topology& topology, MPI_Comm learners,
                      const std::string& resume);

/// The two roles; called by run_job once set-up succeeded everywhere.
/// run_learner returns where this rank's wall time went (goodput accounting); a ddp leader
/// also what crossed its WAN link (`link`, unit −1 elsewhere).
TimeBook run_learner(const Config& config, const OuterPlan& plan, const Topology& topology,
                     UnitTrainer& trainer, const LearnerResume* resume,
                     wan::LinkCounters* link, const LearnerLink& sync_link);
/// How the syncer reaches the units. The one-job deployment: MPI windows over
/// topology.sync_comm (pass no link). The isolated deployment: a transport where units come
/// and go (`listener`), with the run id and secret a unit must present (membership.hpp).
struct SyncerLink {
  comm::RemoteMemory* remote = nullptr;
  comm::UnitListener* listener = nullptr;
  std::string run_id, secret;
  /// The syncer of this run died and this one replaces it (README "The syncer dying"): it
  /// recovers Θ from the units' copies before anything else, and goes on with the same run.
  bool recover = false;
};

/// Returns the stop signal that ended the job early, or 0. `resumed`: the state read from
/// the checkpoint directory `resume` (nullptr: a fresh start). `link`: see SyncerLink.
int run_syncer(const Config& config, const OuterPlan& plan, const Topology& topology,
               const ValidationSet& val, const std::filesystem::path& resume,
               const checkpoint::SyncerState* resumed, const SyncerLink& link);

}  // namespace ddiloco
