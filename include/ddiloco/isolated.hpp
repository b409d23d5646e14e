// The isolated deployment (docs/deployments.md "Fault isolation"): the syncer is its own process and each
// learner unit its own MPI job, linked over UCX (ucx_link.hpp), so that a unit whose process
// or node dies stops nobody and a new process of it rejoins.
//
//   ddiloco syncer --config F          one process: listens on syncer.listen, writes
//                                      run.dir/syncer.addr and syncer.secret (0600)
//   mpirun -np R ddiloco unit --config F --unit u
//                                      unit u's own MPI world; waits for the syncer with
//                                      backoff, says who it is, joins from Θ
//
// They may start in any order and on different hosts (run.dir on a shared filesystem, or
// syncer.address given and the secret file copied beside the config's run.dir).
#pragma once

#include <string>

#include "ddiloco/config.hpp"

namespace ddiloco::deploy {

/// Runs the syncer of the isolated deployment in this process (MPI initialised, one rank).
/// Validates everything first (Error naming what is wrong). `resume`: as run_job's. Returns
/// the stop signal that ended the job early, or 0.
int run_syncer_process(const Config& config, bool overwrite, const std::string& resume);

/// Runs unit `unit` of the isolated deployment on the ranks of MPI_COMM_WORLD (collective).
/// Waits up to syncer.connect_wait_s for the syncer; a refusal (another model shape, a
/// duplicate unit index, a wrong secret, ...) throws Error with the syncer's reason. Writes
/// run.dir/pids/unit<u>.rank<r>.pid for every rank. Returns the stop signal that ended the
/// job early, or 0.
int run_unit_process(const Config& config, int unit);

}  // namespace ddiloco::deploy
