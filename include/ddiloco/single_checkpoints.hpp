// Checkpoints and exact resume of mode single (one learner unit, no syncer): the layout family
// of the outer modes (checkpoint.hpp) with one file per checkpoint,
//   <checkpoint.dir>/ckpt_<id, 8 digits>/unit_0.h5   θ, AdamW's m, v and step, the step and
//                                                     tokens, every rank's data cursor, the
//                                                     sampler's generator; one fragment whose
//                                                     counters stay 0
//   <checkpoint.dir>/ckpt_<id>/manifest.json          written last (mode "single",
//                                                     unit_ranks = [the job's ranks])
// When: every checkpoint.every inner steps, every checkpoint.every_s seconds (rank 0's clock,
// agreed at the step's stop-signal reduction, so every rank writes the same step), and at the
// stop (a signal, or the last step) with checkpoint.at_stop. checkpoint.keep complete ones are
// kept. Nothing in the step's math is random: the data order is a function of (run.seed,
// epoch, position), so the restored cursor, θ and AdamW state make a resumed run equal an
// uninterrupted one bit for bit (tests/e2e/single_resume.sh).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "ddiloco/checkpoint.hpp"
#include "ddiloco/config.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/rng.hpp"
#include "ddiloco/trainer.hpp"

namespace ddiloco::single {

/// A checkpoint read for a resume, on every rank.
struct Resumed {
  std::filesystem::path dir;
  checkpoint::UnitState unit;
};

/// The checkpoint `resume` names ("auto": the newest complete one under checkpoint.dir, or
/// none: std::nullopt; else a ckpt_<id> directory), chosen and verified on rank 0 and read on
/// every rank. Collective over `world`. Throws mpi::SetupFailed on every rank when it is of
/// another job (model shape, mode, run.seed) or was written by another number of ranks (each
/// rank's data stream depends on the count: the message names the mpirun -np to use).
std::optional<Resumed> read_resume(const Config& config, MPI_Comm world, const std::string& resume);

/// Puts a checkpoint's state into `trainer` (θ, AdamW — this rank's shard with units.zero = 1 —,
/// the step count, this rank's data cursor, uploaded to the device with cuda) and `sampler`.
/// Local to this rank.
void restore(const checkpoint::UnitState& state, int rank, UnitTrainer& trainer, Rng& sampler);

/// When to write, and writing. Construct on every rank after the run directory is checked.
class Checkpoints {
 public:
  /// Creates checkpoint.dir on rank 0 (throws Error naming it when it cannot be written).
  Checkpoints(const Config& config, MPI_Comm world);

  bool enabled() const { return config_.checkpoint.enabled(); }
  /// Rank 0's view: is a checkpoint due after step t (checkpoint.every, checkpoint.every_s)?
  /// The caller agrees it over the unit before calling write().
  bool due(int64_t t) const;
  /// Writes checkpoint highest_id + 1 of step t: collective over the unit (rank 0 gathers
  /// the data cursors and writes). A checkpoint that cannot be written (disk full) is a
  /// warning and a `checkpoint_failed` event, not the end of the job. Returns its id, or 0.
  /// log_loss_sum, log_steps: the losses since the last train event, and their count;
  /// elapsed_s: the job's wall time, for the event.
  int64_t write(int64_t t, int64_t tokens, UnitTrainer& trainer, const Rng& sampler, double log_loss_sum,
                int64_t log_steps, double elapsed_s, JsonlWriter& log);

 private:
  const Config& config_;
  MPI_Comm world_;
  bool leader_;
  std::filesystem::path root_;
  Stopwatch since_last_;
};

}  // namespace ddiloco::single
