// A learner unit's inner training: data parallelism over the unit's communicator.
//
// Every rank of the unit holds the full model (bit-identical: same init, same averaged
// gradient, same update). One inner step = forward + backward on the rank's own batch,
// MPI_Allreduce of the gradients over the unit (mean), clipping by global norm, AdamW.
#pragma once

#include <mpi.h>

#include <memory>
#include <optional>

#include "ddiloco/config.hpp"
#include "ddiloco/data_loader.hpp"
#include "ddiloco/model.hpp"
#include "ddiloco/optim.hpp"

namespace ddiloco {

/// What one inner step did.
struct StepStats {
  double loss = 0;          ///< mean training loss over the unit's batch, nats/token
  double grad_norm = 0;     ///< global gradient norm before clipping
  double lr = 0;            ///< learning rate used
  int64_t tokens = 0;       ///< tokens the whole unit processed in this step
  double compute_s = 0;     ///< forward + backward + optimizer, seconds
  double allreduce_s = 0;   ///< gradient all-reduce, seconds
};

class UnitTrainer {
 public:
  /// Builds and initialises the model (seed run.seed: identical on every rank of the unit)
  /// and the optimizer. `unit_comm` is not owned.
  UnitTrainer(const Config& config, MPI_Comm unit_comm);

  /// Gives this rank its training stream (see TrainStream).
  void attach_data(std::unique_ptr<TrainStream> stream);

  /// One inner step on the next batch of the attached stream.
  StepStats step();
  /// One inner step on an explicit batch: inputs and targets (train.batch_size, model.seq_len).
  /// Collective over the unit.
  StepStats step_on(const int32_t* inputs, const int32_t* targets);

  /// Mean loss (nats/token) of the current parameters on `val`; sequences are split over the
  /// unit's ranks and the sums all-reduced, so every rank returns the same value, which does
  /// not depend on the number of ranks. Collective over the unit.
  double validation_loss(const ValidationSet& val);

  Gpt<float>& model() { return model_; }
  AdamW<float>& optimizer() { return optimizer_; }
  TrainStream* data() { return stream_.get(); }
  const Config& config() const { return config_; }
  MPI_Comm comm() const { return comm_; }
  int64_t steps_done() const { return step_; }
  void set_steps_done(int64_t step) { step_ = step; }
  int64_t tokens_per_step() const;  ///< over the whole unit

 private:
  Config config_;
  MPI_Comm comm_;
  int ranks_;
  Gpt<float> model_;
  AdamW<float> optimizer_;
  LrSchedule schedule_;
  std::unique_ptr<TrainStream> stream_;
  std::vector<int32_t> inputs_, targets_;
  int64_t step_ = 0;
};

/// The `ddiloco train` job for one learner unit made of all ranks of `world`: inner steps
/// with periodic validation and samples, metrics.jsonl + config.yaml in run.dir, console
/// progress on rank 0, and the final model saved to run.dir/model.h5. Returns the final
/// validation loss.
double train_single_unit(const Config& config, MPI_Comm world);

/// Sets the OpenMP (and thus OpenBLAS) thread count of this rank: run.threads, or the node's
/// cores divided by the ranks of `comm` on this node. Returns the count.
int configure_threads(int requested, MPI_Comm comm);

}  // namespace ddiloco
