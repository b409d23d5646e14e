// Graceful stops: SIGINT, SIGTERM (what mpirun and Slurm send) and SIGUSR1 (Slurm's
// `--signal` warning before pre-emption) only set a flag; training
// loops look at it at step boundaries, agree on it across ranks, and end cleanly (metrics
// flushed, an "interrupted" event, the model saved).
#pragma once

namespace ddiloco {

/// Installs the handlers (idempotent).
void install_stop_signals();
/// The first stop signal received, or 0.
int stop_signal();
/// Exit status for a job ended by `signal` (128 + signal, the shell convention).
inline int signal_exit_status(int signal) { return 128 + signal; }

}  // namespace ddiloco
