#include "ddiloco/trainer.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <thread>

#include "ddiloco/error.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/model_io.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/sampler.hpp"

namespace ddiloco {

namespace fs = std::filesystem;

int configure_threads(int requested, MPI_Comm comm) {
  int threads = requested;
  if (threads <= 0) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::max(1, cores / std::max(1, mpi::ranks_on_node(comm)));
  }
  omp_set_num_threads(threads);
  return threads;
}

UnitTrainer::UnitTrainer(const Config& config, MPI_Comm unit_comm)
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
}

void UnitTrainer::attach_data(std::unique_ptr<TrainStream> stream) { stream_ = std::move(stream); }

int64_t UnitTrainer::tokens_per_step() const {
  return static_cast<int64_t>(config_.train.batch_size) * config_.model.seq_len * ranks_;
}

StepStats UnitTrainer::step() {
  if (!stream_) fail("UnitTrainer::step: no training data attached");
  stream_->next(inputs_.data(), targets_.data());
  return step_on(inputs_.data(), targets_.data());
}

StepStats UnitTrainer::step_on(const int32_t* inputs, const int32_t* targets) {
  StepStats s;
  Stopwatch clock;
  s.lr = schedule_.at(step_);
  s.loss = model_.forward(inputs, targets, config_.train.batch_size, config_.model.seq_len);
  model_.zero_grad();
  model_.backward();
  s.compute_s = clock.seconds();

  if (ranks_ > 1) {
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

double UnitTrainer::validation_loss(const ValidationSet& val) {
  const int T = val.seq_len();
  if (T != config_.model.seq_len)
    fail("validation set has sequence length {}, model.seq_len is {}", T, config_.model.seq_len);
  const int rank = mpi::rank(comm_);
  const int B = config_.train.batch_size;
  std::vector<int32_t> in(static_cast<size_t>(B) * T), tgt(static_cast<size_t>(B) * T);
  double sums[2] = {0, 0};  // loss sum, token count
  std::vector<int64_t> mine;
  for (int64_t i = rank; i < val.sequences(); i += ranks_) mine.push_back(i);
  for (size_t start = 0; start < mine.size(); start += B) {
    const int b = static_cast<int>(std::min<size_t>(B, mine.size() - start));
    for (int j = 0; j < b; ++j) {
      const int32_t* seq = val.sequence(mine[start + j]);
      std::copy(seq, seq + T, in.begin() + static_cast<long>(j) * T);
      std::copy(seq + 1, seq + T + 1, tgt.begin() + static_cast<long>(j) * T);
    }
    const double mean = model_.forward(in.data(), tgt.data(), b, T);
    sums[0] += mean * b * T;
    sums[1] += static_cast<double>(b) * T;
  }
  if (ranks_ > 1) mpi::allreduce_sum(std::span<double>(sums, 2), comm_);
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

double train_single_unit(const Config& config, MPI_Comm world) {
  const int rank = mpi::rank(world);
  const int ranks = mpi::size(world);
  const bool leader = rank == 0;
  const int threads = configure_threads(config.run.threads, world);

  const auto train_files = expand_shard_pattern(config.data.train, "data.train");
  const auto val_files = expand_shard_pattern(config.data.val, "data.val");
  UnitTrainer trainer(config, world);
  trainer.attach_data(std::make_unique<TrainStream>(
      train_files, config.model.vocab_size, config.train.batch_size, config.model.seq_len, rank,
      ranks, static_cast<uint64_t>(config.run.seed), config.data.shuffle));
  const ValidationSet val(val_files, config.model.vocab_size, config.model.seq_len,
                          config.eval.val_tokens);

  const fs::path dir = config.run.dir;
  JsonlWriter log;
  if (leader) {
    fs::create_directories(dir);
    const std::string yaml = to_yaml(config);
    std::ofstream(dir / "config.yaml") << yaml;
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
                static_cast<long long>(trainer.data()->chunks_per_epoch() / ranks),
                static_cast<long long>(val.sequences()));
    std::fflush(stdout);
    log.write({{"event", "start"},
               {"step", 0},
               {"tokens", 0},
               {"elapsed_s", 0.0},
               {"mode", "single_unit"},
               {"ranks", ranks},
               {"threads_per_rank", threads},
               {"parameters", model.layout().size()},
               {"tokens_per_step", trainer.tokens_per_step()}});
  }

  ProgressBar bar(leader && config.run.progress);
  Stopwatch wall;
  double train_seconds = 0, window_seconds = 0, window_loss = 0;
  int64_t window_steps = 0, tokens = 0;
  const int64_t steps = config.train.steps;
  double val_loss = NAN;
  Rng sample_rng(mix_seed(static_cast<uint64_t>(config.run.seed), 0x5a3d1e));

  auto console = [&](const std::string& line) {
    if (!leader) return;
    bar.clear();
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  auto run_eval = [&](int64_t step) {
    Stopwatch clock;
    val_loss = trainer.validation_loss(val);
    log.write({{"event", "val"},
               {"step", step},
               {"tokens", tokens},
               {"elapsed_s", wall.seconds()},
               {"val_loss", val_loss},
               {"eval_s", clock.seconds()}});
    console(fmt::format("step {:>6} | val_loss {:.4f} | {} tokens | {:.1f}s", step, val_loss,
                        format_tokens(tokens), wall.seconds()));
  };
  auto run_sample = [&](int64_t step) {
    if (config.eval.sample_tokens <= 0) return;
    // Every rank samples (same model, same generator) so the model's activations stay in
    // lockstep; only the leader prints.
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

  for (int64_t step = 0; step < steps; ++step) {
    const StepStats s = trainer.step();
    tokens += s.tokens;
    train_seconds += s.compute_s + s.allreduce_s;
    window_seconds += s.compute_s + s.allreduce_s;
    window_loss += s.loss;
    ++window_steps;
    if (!std::isfinite(s.loss)) fail("training diverged: loss is {} at step {}", s.loss, step);
    const int64_t done = step + 1;
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
                 {"allreduce_s", s.allreduce_s}});
      const std::string status =
          fmt::format("loss {:.4f} | lr {:.2e} | {:.0f} tok/s | {:.0f}s", mean_loss, s.lr, tps,
                      wall.seconds());
      if (bar.enabled())
        bar.update(done, steps, status);
      else
        console(fmt::format("step {:>6}/{} | {}", done, steps, status));
      window_seconds = window_loss = 0;
      window_steps = 0;
    }
    if (config.eval.every_steps > 0 && done % config.eval.every_steps == 0 && done != steps)
      run_eval(done);
    if (config.eval.sample_every_steps > 0 && done % config.eval.sample_every_steps == 0 &&
        done != steps)
      run_sample(done);
  }
  bar.finish();
  run_eval(steps);
  run_sample(steps);

  if (leader) {
    const fs::path model_path = dir / "model.h5";
    save_model(model_path, config.model, trainer.model().parameters(),
               {{"step", steps}, {"tokens", tokens}, {"val_loss", val_loss},
                {"run_dir", dir.string()}});
    const double tps = tokens / train_seconds;
    log.write({{"event", "done"},
               {"step", steps},
               {"tokens", tokens},
               {"elapsed_s", wall.seconds()},
               {"val_loss", val_loss},
               {"tokens_per_s", tps},
               {"model", model_path.string()}});
    console(fmt::format("done: {} steps, {} tokens in {:.1f}s ({:.0f} tokens/s training), "
                        "val_loss {:.4f}; model saved to {}",
                        steps, format_tokens(tokens), wall.seconds(), tps, val_loss,
                        model_path.string()));
  }
  return val_loss;
}

}  // namespace ddiloco
