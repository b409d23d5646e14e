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
      optimizer_(model_.layout(), AdamWConfig{config.train.beta1, config.train.beta2,
                                              config.train.eps, config.train.weight_decay}),
      schedule_{config.train.lr, config.train.warmup_steps, config.train.steps,
                config.train.min_lr_frac} {
  model_.init_weights(static_cast<uint64_t>(config.run.seed));
  const size_t n = static_cast<size_t>(config.train.batch_size) * config.model.seq_len;
  inputs_.resize(n);
  targets_.resize(n);
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
  optimizer_.step(model_.parameters(), model_.gradients(), s.lr);
  s.compute_s += update_clock.seconds();
  s.tokens = tokens_per_step();
  ++step_;
  return s;
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

namespace {

std::string format_tokens(double n) {
  if (n >= 1e9) return fmt::format("{:.2f}G", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}k", n / 1e3);
  return fmt::format("{:.0f}", n);
}

}  // namespace

TrainResult train_single_unit(const Config& config, MPI_Comm world, bool overwrite) {
  const int rank = mpi::rank(world);
  const int ranks = mpi::size(world);
  const bool leader = rank == 0;
  const int threads = configure_threads(config.run.threads, world);
  const std::filesystem::path dir = config.run.dir;

  // Set-up: everything that can be wrong with the inputs is found here, on every rank, before
  // a byte is written.
  struct Setup {
    std::unique_ptr<UnitTrainer> trainer;
    std::unique_ptr<ValidationSet> val;
  };
  Setup setup = mpi::agree(world, [&] {
    Setup s;
    if (leader) check_run_dir(dir, overwrite);
    const auto train_files = expand_shard_pattern(config.data.train, "data.train");
    const auto val_files = expand_shard_pattern(config.data.val, "data.val");
    check_disjoint_splits(train_files, val_files);
    s.val = std::make_unique<ValidationSet>(val_files, config.model.vocab_size,
                                            config.model.seq_len, config.eval.val_tokens);
    s.trainer = std::make_unique<UnitTrainer>(config, world);
    s.trainer->attach_data(std::make_unique<TrainStream>(
        train_files, config.model.vocab_size, config.train.batch_size, config.model.seq_len,
        rank, ranks, static_cast<uint64_t>(config.run.seed), config.data.shuffle));
    return s;
  });
  UnitTrainer& trainer = *setup.trainer;
  const ValidationSet& val = *setup.val;
  install_stop_signals();

  JsonlWriter log;
  if (leader) {
    if (overwrite) clear_run_outputs(dir);
    const std::string yaml = to_yaml(config);
    write_text_atomically(dir / "config.yaml", yaml);
    std::printf("ddiloco %s: effective configuration (saved to %s)\n%s", DDILOCO_VERSION,
                (dir / "config.yaml").c_str(), yaml.c_str());
    log = JsonlWriter(dir / "metrics.jsonl", /*truncate=*/true);
  }
  const auto& model = trainer.model();
  const double params = static_cast<double>(model.layout().size());
  if (leader) {
    std::printf("model: %.2fM parameters, %d ranks x %d threads, %lld tokens/step, "
                "train %lld batches/epoch/stream, val %lld sequences\n",
                params / 1e6, ranks, threads, static_cast<long long>(trainer.tokens_per_step()),
                static_cast<long long>(trainer.data()->batches_per_epoch()),
                static_cast<long long>(val.sequences()));
    std::fflush(stdout);
    log.write({{"event", "start"},
               {"step", 0},
               {"tokens", 0},
               {"elapsed_s", 0.0},
               {"mode", "single"},
               {"ranks", ranks},
               {"threads_per_rank", threads},
               {"parameters", model.layout().size()},
               {"tokens_per_step", trainer.tokens_per_step()}});
    if (trainer.gpu()) std::printf("device: %s\n", trainer.gpu()->describe().c_str());
  }

  ProgressBar bar(leader && config.run.progress);
  Stopwatch wall;
  double train_seconds = 0, window_seconds = 0, window_loss = 0, window_reduce = 0;
  int64_t window_steps = 0, tokens = 0;
  const int64_t steps = config.train.steps;
  TrainResult result{NAN, 0};
  Rng sample_rng(mix_seed(static_cast<uint64_t>(config.run.seed), 0x5a3d1e));

  auto console = [&](const std::string& line) {
    if (!leader) return;
    bar.clear();
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  auto run_eval = [&](int64_t step) {
    trainer.check_replicas();
    Stopwatch clock;
    result.val_loss = trainer.validation_loss(val);
    log.write({{"event", "val"},
               {"step", step},
               {"tokens", tokens},
               {"elapsed_s", wall.seconds()},
               {"val_loss", result.val_loss},
               {"eval_s", clock.seconds()}});
    console(fmt::format("step {:>6} | val_loss {:.4f} | {} tokens | {:.1f}s", step,
                        result.val_loss, format_tokens(tokens), wall.seconds()));
  };
  auto run_sample = [&](int64_t step) {
    if (config.eval.sample_tokens <= 0) return;
    // Every rank samples (same model, same generator) so the model's activations stay in
    // lockstep; only the leader prints.
    trainer.download_state(false);  // cuda: the host model samples; parameters only
    const auto prompt = encode_prompt(config.eval.sample_prompt, config.model.vocab_size);
    const auto out = generate(trainer.model(), prompt, config.eval.sample_tokens,
                              config.eval.temperature, sample_rng);
    std::vector<int32_t> all(prompt.begin() + 1, prompt.end());
    all.insert(all.end(), out.begin(), out.end());
    const std::string text = detokenize(all, config.model.vocab_size);
    log.write({{"event", "sample"}, {"step", step}, {"tokens", tokens},
               {"elapsed_s", wall.seconds()}, {"text", text}});
    console(fmt::format("--- sample at step {} ---\n{}\n---", step, text));
  };

  int64_t done = 0;
  while (done < steps) {
    // A stop signal counts once every rank of the unit knows of it.
    int signal = stop_signal();
    if (ranks > 1)
      mpi::check(MPI_Allreduce(MPI_IN_PLACE, &signal, 1, MPI_INT, MPI_MAX, world), "Allreduce");
    if (signal != 0) {
      result.signal = signal;
      break;
    }
    const StepStats s = trainer.step();
    ++done;
    tokens += s.tokens;
    train_seconds += s.compute_s + s.allreduce_s;
    window_seconds += s.compute_s + s.allreduce_s;
    window_reduce += s.allreduce_s;
    window_loss += s.loss;
    ++window_steps;
    if (!std::isfinite(s.loss)) fail("training diverged: loss is {} at step {}", s.loss, done);
    if (done % config.run.log_every == 0 || done == steps) {
      const double tps = window_steps * trainer.tokens_per_step() / window_seconds;
      const double mean_loss = window_loss / window_steps;
      log.write({{"event", "train"},
                 {"step", done},
                 {"tokens", tokens},
                 {"elapsed_s", wall.seconds()},
                 {"train_loss", mean_loss},
                 {"lr", s.lr},
                 {"grad_norm", s.grad_norm},
                 {"tokens_per_s", tps},
                 {"allreduce_s", window_reduce}});
      const std::string status =
          fmt::format("loss {:.4f} | lr {:.2e} | {:.0f} tok/s | {:.0f}s", mean_loss, s.lr, tps,
                      wall.seconds());
      if (bar.enabled())
        bar.update(done, steps, status);
      else
        console(fmt::format("step {:>6}/{} | {}", done, steps, status));
      window_seconds = window_loss = window_reduce = 0;
      window_steps = 0;
    }
    if (config.eval.every_steps > 0 && done % config.eval.every_steps == 0 && done != steps)
      run_eval(done);
    if (config.eval.sample_every_steps > 0 && done % config.eval.sample_every_steps == 0 &&
        done != steps)
      run_sample(done);
  }
  bar.finish();
  if (result.signal == 0) {
    run_eval(steps);
    run_sample(steps);
  }
  // Stopped by a signal: the step each rank stopped at (they agreed on the stop, so one step),
  // for the leader's `interrupted` event.
  std::vector<int64_t> rank_steps(static_cast<size_t>(ranks), done);
  if (result.signal != 0 && ranks > 1)
    mpi::check(MPI_Gather(&done, 1, MPI_INT64_T, rank_steps.data(), 1, MPI_INT64_T, 0, world),
               "Gather");

  if (leader) {
    const std::filesystem::path model_path = dir / "model.h5";
    nlohmann::json meta = {{"step", done}, {"tokens", tokens}, {"run_dir", dir.string()}};
    if (result.signal == 0) meta["val_loss"] = result.val_loss;
    if (result.signal != 0) meta["interrupted"] = true;
    trainer.download_state(false);  // cuda: the device's parameters are the trained ones
    save_model(model_path, config.model, trainer.model().parameters(), meta);
    const double tps = train_seconds > 0 ? tokens / train_seconds : 0.0;
    if (result.signal != 0) {
      log.write({{"event", "interrupted"}, {"signal", result.signal}, {"step", done},
                 {"rank_steps", rank_steps}, {"tokens", tokens}, {"elapsed_s", wall.seconds()},
                 {"model", model_path.string()}});
      console(fmt::format("interrupted by signal {} after {} steps; model saved to {}",
                          result.signal, done, model_path.string()));
    } else {
      log.write({{"event", "done"},
                 {"step", steps},
                 {"tokens", tokens},
                 {"elapsed_s", wall.seconds()},
                 {"val_loss", result.val_loss},
                 {"tokens_per_s", tps},
                 {"model", model_path.string()}});
      console(fmt::format("done: {} steps, {} tokens in {:.1f}s ({:.0f} tokens/s training), "
                          "val_loss {:.4f}; model saved to {}",
                          steps, format_tokens(tokens), wall.seconds(), tps, result.val_loss,
                          model_path.string()));
    }
  }
  return result;
}

}  // namespace ddiloco
