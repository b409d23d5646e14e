// The syncer of a multi-unit job: how it reaches the units, and the call that runs it. How it
// works: src/syncer/syncer.hpp (the process) and syncer_core.hpp (the decisions).
#pragma once

#include <filesystem>
#include <string>

#include "ddiloco/checkpoint.hpp"
#include "ddiloco/config.hpp"
#include "ddiloco/data_loader.hpp"
#include "ddiloco/outer_plan.hpp"
#include "ddiloco/remote_memory.hpp"
#include "ddiloco/topology.hpp"

namespace ddiloco::syncer {

/// How the syncer reaches the units. The one-job deployment: MPI windows over
/// topology.sync_comm (pass no link). The isolated deployment: a transport where units come
/// and go (`listener`), with the run id and secret a unit must present (membership.hpp).
struct SyncerLink {
  comm::RemoteMemory* remote = nullptr;
  comm::UnitListener* listener = nullptr;
  std::string run_id, secret;
  /// The syncer of this run died and this one replaces it (docs/deployments.md "The syncer dying"): it
  /// recovers Θ from the units' copies before anything else, and goes on with the same run.
  bool recover = false;
};

/// Returns the stop signal that ended the job early, or 0. `resumed`: the state read from
/// the checkpoint directory `resume` (nullptr: a fresh start). `link`: see SyncerLink.
int run_syncer(const Config& config, const OuterPlan& plan, const Topology& topology,
               const ValidationSet& val, const std::filesystem::path& resume,
               const checkpoint::SyncerState* resumed, const SyncerLink& link);

}  // namespace ddiloco::syncer
