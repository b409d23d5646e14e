// A learner unit's inner training: data parallelism over the unit's communicator.
//
// Every rank of the unit holds the full model (bit-identical: same init, same averaged
// gradient, same update). One inner step = forward + backward on the rank's own batch,
// MPI_Allreduce of the gradients over the unit (mean), clipping by global norm, AdamW. With
// units.zero = 1 each rank holds the AdamW state of its shard only and the step reduce-scatters
// the gradients and all-gathers the updated shards instead (zero.hpp): the same update; in ddp,
// whose reducer leaves the whole mean gradient on every rank, only the update is sharded.
//
// With run.device: cuda the same step runs on this rank's GPU (unit_backend.hpp: GptCuda,
// NCCL mean of the gradients, clip and AdamW on the device; with units.zero = 1 NCCL's
// reduce-scatter and all-gather around AdamW on the shard). The host model and optimizer
// then are a mirror that is NOT kept current step by step: download_state() copies the
// device's parameters and AdamW state into them, upload_state() the other way; callers that
// read or write model().parameters() or optimizer() (checkpoints, samples, saving, resume,
// rejoin) call them around that. The CPU path is unchanged.
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <optional>
#include <span>

#include "ddiloco/config.hpp"
#include "ddiloco/data_loader.hpp"
#include "ddiloco/unit_backend.hpp"
#include "ddiloco/model.hpp"
#include "ddiloco/optim.hpp"
#include "ddiloco/zero.hpp"

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
  /// and the optimizer. `unit_comm` is not owned. With run.device: cuda also the GPU backend:
  /// the device is chosen by node-local rank among `device_comm` (every learner rank of the
  /// job; MPI_COMM_NULL: unit_comm), and the host model's initial parameters are uploaded, so
  /// that both devices start from identical weights. Collective over unit_comm (and
  /// device_comm with cuda).
  UnitTrainer(const Config& config, MPI_Comm unit_comm, MPI_Comm device_comm = MPI_COMM_NULL);
  ~UnitTrainer();

  /// Gives this rank its training stream (see TrainStream).
  void attach_data(std::unique_ptr<TrainStream> stream);

  /// Replaces the unit's gradient averaging (MPI_Allreduce over the unit) with another, e.g.
  /// ddp's hierarchical reduction across units. The reducer turns this rank's gradient and
  /// mean loss into the averaged ones, in place, and returns the averaged loss.
  using GradientReducer = std::function<double(std::span<float> grads, double loss)>;
  void set_gradient_reducer(GradientReducer reducer) { reducer_ = std::move(reducer); }

  /// One inner step on the next batch of the attached stream.
  StepStats step();
  /// One inner step on an explicit batch: inputs and targets (train.batch_size, model.seq_len).
  /// Collective over the unit.
  StepStats step_on(const int32_t* inputs, const int32_t* targets);

  /// Mean loss (nats/token) of the current parameters on `val`; sequences are split over the
  /// unit's ranks and the sums all-reduced, so every rank returns the same value, which does
  /// not depend on the number of ranks. Collective over the unit.
  double validation_loss(const ValidationSet& val);

  /// Throws Error when the unit's ranks no longer hold bit-identical parameters (their
  /// checksums differ). Collective over the unit.
  void check_replicas() const;

  /// The host model and optimizer. With cuda a mirror: see download_state/upload_state. With
  /// units.zero = 1 the optimizer holds this rank's shard only (optimizer().shard()): read and
  /// write its whole state through gather_moments and set_moments.
  Gpt<float>& model() { return model_; }
  AdamW<float>& optimizer() { return optimizer_; }

  /// AdamW's state of the whole buffer.
  struct Moments {
    std::vector<float> m, v;  ///< first and second moments, layout.size() each (float32)
    int64_t step = 0;         ///< AdamW's step count t
  };
  /// The whole state on rank 0 of the unit (with units.zero = 1 gathered from every rank's
  /// shard; with cuda downloaded first); the other ranks get empty vectors. Collective over the
  /// unit.
  Moments gather_moments();
  /// Sets this rank's AdamW state from the whole buffer's (its shard's part with units.zero = 1;
  /// uploaded to the device with cuda). m and v: layout.size() each, or throws Error. Local.
  void set_moments(std::span<const float> m, std::span<const float> v, int64_t step);

  /// The GPU backend (run.device: cuda), or nullptr on the CPU path.
  gpu::UnitBackend* gpu() { return gpu_.get(); }
  /// cuda: host parameters (and, with `optimizer`, AdamW moments and step count) ← device.
  /// No-op on the CPU path. Synchronises; local to this rank.
  void download_state(bool optimizer = true);
  /// cuda: device parameters (and, with `optimizer`, AdamW state) ← host. No-op on the CPU.
  void upload_state(bool optimizer = true);
  TrainStream* data() { return stream_.get(); }
  const Config& config() const { return config_; }
  int64_t steps_done() const { return step_; }
  void set_steps_done(int64_t step) { step_ = step; }
  /// The inner step the learning-rate schedule reads from now on, instead of this unit's own
  /// step count (decoupled: the job's mean step, so that fast and slow units warm up and
  /// anneal together as the job's token budget runs out). −1: the unit's own steps again.
  void set_schedule_step(int64_t step) { schedule_step_ = step; }
  int64_t schedule_step() const { return schedule_step_; }
  int64_t tokens_per_step() const;  ///< over the whole unit

 private:
  Config config_;
  MPI_Comm comm_;
  int ranks_;
  Gpt<float> model_;
  AdamW<float> optimizer_;
  LrSchedule schedule_;
  int64_t schedule_step_ = -1;
  std::unique_ptr<TrainStream> stream_;
  GradientReducer reducer_;
  std::vector<int32_t> inputs_, targets_;
  int64_t step_ = 0;
  std::unique_ptr<gpu::UnitBackend> gpu_;  // run.device: cuda only
  std::unique_ptr<ZeroStep> zero_;         // units.zero = 1 with more than one rank
};

/// Mean loss (nats/token) of `model` on `val`, evaluated in batches of `batch` sequences.
/// With a communicator the sequences are split over its ranks (i ≡ rank mod size) and the
/// sums all-reduced, so every rank returns the same value whatever the number of ranks;
/// MPI_COMM_NULL evaluates everything here.
double validation_loss(Gpt<float>& model, const ValidationSet& val, int batch, MPI_Comm comm);

/// How a training job ended.
struct TrainResult {
  double val_loss = 0;  ///< final validation loss (NaN when interrupted before one)
  int signal = 0;       ///< the stop signal that ended it early, or 0
};

/// The `ddiloco train` job for one learner unit made of all ranks of `world`: inner steps
/// with periodic validation and samples, metrics.jsonl + config.yaml in run.dir, console
/// progress on rank 0, and the final model saved to run.dir/model.h5.
/// Every input (shards, run.dir, memory) is validated on every rank before anything is
/// written; a failure there throws mpi::SetupFailed on all ranks. run.dir must not hold a
/// previous run unless `overwrite` or `resume`. SIGINT/SIGTERM/SIGUSR1 end the run at the next
/// step boundary with an "interrupted" event, a checkpoint (checkpoint.at_stop) and the model
/// saved. `resume` ("" none, "auto", or a checkpoint directory) continues a run from its
/// checkpoint exactly (single_checkpoints.hpp); "auto" with none starts afresh, replacing
/// run.dir's outputs.
TrainResult train_single_unit(const Config& config, MPI_Comm world, bool overwrite, const std::string& resume = "");

/// Sets the OpenMP (and thus OpenBLAS) thread count of this rank: run.threads, or the node's
/// cores divided by the ranks of `comm` on this node. Returns the count.
int configure_threads(int requested, MPI_Comm comm);

}  // namespace ddiloco
