// A learner rank of a multi-unit job (modes ddp, diloco, streaming, decoupled): what a
// deployment (runtime.hpp, isolated.hpp) gives it — its trainer, the checkpoint it resumes
// from, how its leader reaches the syncer — and the call that runs it. How it works:
// src/learner/learner.hpp (the shell) and learner_core.hpp (the decisions).
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "ddiloco/checkpoint.hpp"
#include "ddiloco/config.hpp"
#include "ddiloco/goodput.hpp"
#include "ddiloco/outer_plan.hpp"
#include "ddiloco/remote_memory.hpp"
#include "ddiloco/topology.hpp"
#include "ddiloco/trainer.hpp"
#include "ddiloco/wan.hpp"

namespace ddiloco::protocol {
class LearnerWindow;
}

namespace ddiloco::learner {

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
  std::function<void(protocol::LearnerWindow&)> wait_released;
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

/// Runs this learner rank to the end of the job (the deployment calls it once set-up succeeded
/// everywhere). Returns where this rank's wall time went (goodput accounting); a ddp leader
/// also what crossed its WAN link (`link`, unit −1 elsewhere).
TimeBook run_learner(const Config& config, const OuterPlan& plan, const Topology& topology,
                     UnitTrainer& trainer, const LearnerResume* resume,
                     wan::LinkCounters* link, const LearnerLink& sync_link);

}  // namespace ddiloco::learner
