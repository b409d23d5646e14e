#include "ddiloco/trainer.hpp"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <thread>

#include "ddiloco/checksum.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/fpu.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/model_io.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/run_dir.hpp"
#include "ddiloco/sampler.hpp"
#include "ddiloco/signals.hpp"

namespace ddiloco {

namespace fs = std::filesystem;

int configure_threads(int requested, MPI_Comm comm) {
  int threads = requested;
  if (threads <= 0) {
    // The CPUs this process may run on (taskset, cgroups, Slurm's binding), not the machine's.
    cpu_set_t set;
    CPU_ZERO(&set);
    int cores = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (cores <= 0) cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::max(1, cores / std::max(1, mpi::ranks_on_node(comm)));
  }
  omp_set_num_threads(threads);
  flush_denormals_to_zero();
  return threads;
}

UnitTrainer::UnitTrainer(const Config& config, MPI_Comm unit_comm, MPI_Comm device_comm)
    : config_(config),
      comm_(unit_comm),
      ranks_(mpi::size(unit_comm)),
      model_(config.model),
      optimizer_(model_.layout(),
                 AdamWConfig{config.train.beta1, config.train.beta2, config.train.eps,
                             config.train.weight_decay},
                 config.units.zero == 1 ? zero_shard(model_.layout().size(), mpi::rank(unit_comm), ranks_)
                                        : StateShard{0, model_.layout().size()}),
      schedule_{config.train.lr, config.train.warmup_steps, config.train.steps,
                config.train.min_lr_frac} {
  model_.init_weights(static_cast<uint64_t>(config.run.seed));
  const size_t n = static_cast<size_t>(config.train.batch_size) * config.model.seq_len;
  inputs_.resize(n);
  targets_.resize(n);
  if (config.units.zero == 1 && ranks_ > 1) zero_ = std::make_unique<ZeroStep>(model_.layout().size(), comm_);
  if (config.run.device == "cuda")
    gpu_ = gpu::make_unit_backend(config, unit_comm,
                                  device_comm == MPI_COMM_NULL ? unit_comm : device_comm,
                                  model_.parameters());
}

UnitTrainer::~UnitTrainer() = default;

void UnitTrainer::download_state(bool optimizer) {
  if (!gpu_) return;
  gpu_->download_parameters(model_.parameters());
  if (optimizer)
    optimizer_.set_step_count(
        gpu_->download_optimizer(optimizer_.first_moment(), optimizer_.second_moment()));
}

void UnitTrainer::upload_state(bool optimizer) {
  if (!gpu_) return;
  gpu_->upload_parameters(model_.parameters());
  if (optimizer)
    gpu_->upload_optimizer(optimizer_.first_moment(), optimizer_.second_moment(),
                           optimizer_.step_count());
}

void UnitTrainer::attach_data(std::unique_ptr<TrainStream> stream) { stream_ = std::move(stream); }

int64_t UnitTrainer::tokens_per_step() const {
  return static_cast<int64_t>(config_.train.batch_size) * config_.model.seq_len * ranks_;
}

StepStats UnitTrainer::step() {
  if (!stream_) fail("UnitTrainer::step: no training data attached");
  Stopwatch clock;
  stream_->next(inputs_.data(), targets_.data());
  const double load_s = clock.seconds();
  StepStats s = step_on(inputs_.data(), targets_.data());
  s.compute_s += load_s;  // reading the batch is part of the step
  return s;
}

StepStats UnitTrainer::step_on(const int32_t* inputs, const int32_t* targets) {
  StepStats s;
  Stopwatch clock;
  s.lr = schedule_.at(schedule_step_ >= 0 ? schedule_step_ : step_);
  if (gpu_) {
    // The whole step on the device; the NCCL all-reduce overlaps nothing the host could time
    // separately without a wait, so it counts as compute (allreduce_s stays 0).
    if (reducer_) fail("UnitTrainer: run.device: cuda has no custom gradient reducer (mode ddp)");
    const gpu::GpuStepResult r = gpu_->step(inputs, targets, s.lr);
    s.loss = r.loss;
    s.grad_norm = r.grad_norm;
    s.compute_s = clock.seconds();
    s.tokens = tokens_per_step();
    ++step_;
    return s;
  }
  s.loss = model_.forward(inputs, targets, config_.train.batch_size, config_.model.seq_len);
  model_.zero_grad();
  model_.backward();
  s.compute_s = clock.seconds();

  if (zero_ && !reducer_) {
    // The reduce-scatter, the update and the all-gather in one (zero.hpp): all-reduce time.
    Stopwatch reduce_clock;
    s.grad_norm = zero_->step(model_.parameters(), model_.gradients(), optimizer_, s.lr, config_.train.grad_clip);
    s.loss = mpi::allreduce_sum(s.loss, comm_) / ranks_;
    s.allreduce_s = reduce_clock.seconds();
    s.tokens = tokens_per_step();
    ++step_;
    return s;
  }
  if (reducer_) {
    Stopwatch reduce_clock;
    s.loss = reducer_(model_.gradients(), s.loss);
    s.allreduce_s = reduce_clock.seconds();
  } else if (ranks_ > 1) {
    Stopwatch reduce_clock;
    // Mean gradient over the unit: every rank's loss is a mean over its own B·T tokens and
    // all ranks have the same B·T, so the mean of the means is the mean over the unit batch.
    auto grads = model_.gradients();
    mpi::allreduce_sum(grads, comm_);
    const float inv = 1.0f / static_cast<float>(ranks_);
    const long n = static_cast<long>(grads.size());
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) grads[i] *= inv;
    s.loss = mpi::allreduce_sum(s.loss, comm_) / ranks_;
    s.allreduce_s = reduce_clock.seconds();
  }

  Stopwatch update_clock;
  s.grad_norm = clip_grad_norm(model_.gradients(), config_.train.grad_clip);
  if (zero_)  // ddp: the reducer gave every rank the whole mean gradient; our shard's update
    zero_->step_reduced(model_.parameters(), model_.gradients(), optimizer_, s.lr);
  else
    optimizer_.step(model_.parameters(), model_.gradients(), s.lr);
  s.compute_s += update_clock.seconds();
  s.tokens = tokens_per_step();
  ++step_;
  return s;
}

UnitTrainer::Moments UnitTrainer::gather_moments() {
  download_state();  // cuda: the device's moments
  Moments all;
  all.step = optimizer_.step_count();
  if (zero_) {
    all.m = zero_->gather(optimizer_.first_moment());
    all.v = zero_->gather(optimizer_.second_moment());
  } else if (mpi::rank(comm_) == 0) {
    all.m.assign(optimizer_.first_moment().begin(), optimizer_.first_moment().end());
    all.v.assign(optimizer_.second_moment().begin(), optimizer_.second_moment().end());
  }
  return all;
}

void UnitTrainer::set_moments(std::span<const float> m, std::span<const float> v, int64_t step) {
  const size_t n = model_.layout().size();
  if (m.size() != n || v.size() != n) fail("UnitTrainer::set_moments: {} and {} values for {} parameters", m.size(), v.size(), n);
  const StateShard s = optimizer_.shard();
  std::copy(m.begin() + static_cast<long>(s.lo), m.begin() + static_cast<long>(s.hi), optimizer_.first_moment().begin());
  std::copy(v.begin() + static_cast<long>(s.lo), v.begin() + static_cast<long>(s.hi), optimizer_.second_moment().begin());
  optimizer_.set_step_count(step);
  upload_state();  // cuda: the device's optimizer (and parameters)
}

void UnitTrainer::check_replicas() const {
  if (ranks_ <= 1) return;
  // cuda: the device's parameters are the ones that train (the host mirror may be stale).
  std::vector<float> device;
  if (gpu_) {
    device.resize(model_.parameters().size());
    gpu_->download_parameters(device);
  }
  const uint64_t mine = checksum(gpu_ ? std::span<const float>(device) : model_.parameters());
  uint64_t lo = mine, hi = mine;
  mpi::check(MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, comm_), "Allreduce");
  mpi::check(MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, comm_), "Allreduce");
  if (lo != hi)
    fail("the unit's ranks hold different parameters after step {} (replicas diverged: "
         "non-deterministic kernels or a corrupted message)",
         step_);
}

double UnitTrainer::validation_loss(const ValidationSet& val) {
  if (gpu_) return gpu_->validation_loss(val, config_.train.batch_size);
  return ddiloco::validation_loss(model_, val, config_.train.batch_size, comm_);
}

double validation_loss(Gpt<float>& model, const ValidationSet& val, int batch, MPI_Comm comm) {
  const int T = val.seq_len();
  if (T > model.config().seq_len)
    fail("validation sequences have {} tokens, more than model.seq_len = {}", T,
         model.config().seq_len);
  const int rank = comm == MPI_COMM_NULL ? 0 : mpi::rank(comm);
  const int ranks = comm == MPI_COMM_NULL ? 1 : mpi::size(comm);
  std::vector<int32_t> in(static_cast<size_t>(batch) * T), tgt(static_cast<size_t>(batch) * T);
  double sums[2] = {0, 0};  // loss sum, token count
  std::vector<int64_t> mine;
  for (int64_t i = rank; i < val.sequences(); i += ranks) mine.push_back(i);
  for (size_t start = 0; start < mine.size(); start += batch) {
    const int b = static_cast<int>(std::min<size_t>(batch, mine.size() - start));
    for (int j = 0; j < b; ++j) {
      const int32_t* seq = val.sequence(mine[start + j]);
      std::copy(seq, seq + T, in.begin() + static_cast<long>(j) * T);
      std::copy(seq + 1, seq + T + 1, tgt.begin() + static_cast<long>(j) * T);
    }
    const double mean = model.forward(in.data(), tgt.data(), b, T);
    sums[0] += mean * b * T;
    sums[1] += static_cast<double>(b) * T;
  }
  if (ranks > 1) mpi::allreduce_sum(std::span<double>(sums, 2), comm);
  return sums[0] / sums[1];
}

}  // namespace ddiloco
