// `ddiloco train` in mode single (trainer.hpp, train_single_unit): one learner unit, no
// syncer — a policy of the inner-step loop (train_loop.hpp) that logs, evaluates, samples,
// checkpoints (single_checkpoints.hpp) and saves the model.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <thread>

#include "ddiloco/error.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/model_io.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/rng.hpp"
#include "ddiloco/run_dir.hpp"
#include "ddiloco/sampler.hpp"
#include "ddiloco/signals.hpp"
#include "ddiloco/shard.hpp"
#include "ddiloco/single_checkpoints.hpp"
#include "ddiloco/data_loader.hpp"
#include "ddiloco/train_loop.hpp"
#include "ddiloco/trainer.hpp"

namespace ddiloco {

namespace {

std::string format_tokens(double n) {
  if (n >= 1e9) return fmt::format("{:.2f}G", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}k", n / 1e3);
  return fmt::format("{:.0f}", n);
}

// Everything that can be wrong with the inputs, found on every rank before a byte is written.
struct Setup {
  std::unique_ptr<UnitTrainer> trainer;
  std::unique_ptr<ValidationSet> val;
  std::optional<single::Resumed> resumed;
  bool replace = false;  // run.dir's outputs are cleared (a fresh start with --overwrite, or --resume auto with none)
};

// Did run.dir's metrics.jsonl end with a "done" event (a run that completed)?
bool finished_run(const std::filesystem::path& dir) {
  std::ifstream in(dir / "metrics.jsonl");
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last.find("\"event\":\"done\"") != std::string::npos;
}

Setup set_up(const Config& config, MPI_Comm world, bool overwrite, const std::string& resume) {
  std::optional<single::Resumed> resumed = single::read_resume(config, world, resume);
  return mpi::agree(world, [&] {
    Setup s;
    s.resumed = resumed;
    s.replace = !resumed && (overwrite || resume == "auto");
    if (mpi::rank(world) == 0) {
      // --resume auto with nothing to resume starts over, replacing an interrupted attempt's
      // outputs (what a requeued job wants), but never a run that completed without checkpoints.
      if (resume == "auto" && !resumed && !overwrite && finished_run(config.run.dir))
        fail("--resume auto: {} holds a completed run and no checkpoint to resume; pass --overwrite to "
             "replace it, or choose another run.dir",
             config.run.dir);
      check_run_dir(config.run.dir, s.replace || resumed);
    }
    const auto train_files = expand_shard_pattern(config.data.train, "data.train");
    const auto val_files = expand_shard_pattern(config.data.val, "data.val");
    check_disjoint_splits(train_files, val_files);
    s.val = std::make_unique<ValidationSet>(val_files, config.model.vocab_size, config.model.seq_len,
                                            config.eval.val_tokens);
    s.trainer = std::make_unique<UnitTrainer>(config, world);
    s.trainer->attach_data(std::make_unique<TrainStream>(
        train_files, config.model.vocab_size, config.train.batch_size, config.model.seq_len, mpi::rank(world),
        mpi::size(world), static_cast<uint64_t>(config.run.seed), config.data.shuffle));
    return s;
  });
}

class SingleUnit final : public StepPolicy {
 public:
  SingleUnit(const Config& config, MPI_Comm world, bool overwrite, const std::string& resume)
      : config_(config),
        world_(world),
        ranks_(mpi::size(world)),
        leader_(mpi::rank(world) == 0),
        threads_(configure_threads(config.run.threads, world)),
        dir_(config.run.dir),
        setup_(set_up(config, world, overwrite, resume)),
        trainer_(*setup_.trainer),
        checkpoints_(mpi::agree(world, [&] { return single::Checkpoints(config, world); })),
        bar_(leader_ && config.run.progress),
        sample_rng_(mix_seed(static_cast<uint64_t>(config.run.seed), 0x5a3d1e)) {
    install_stop_signals();
    if (setup_.resumed) {
      single::restore(setup_.resumed->unit, mpi::rank(world), trainer_, sample_rng_);
      tokens_ = tokens_at_start_ = setup_.resumed->unit.tokens;
      first_ = setup_.resumed->unit.step + 1;
      interval_.loss = setup_.resumed->unit.log_loss_sum;
      interval_.steps = setup_.resumed->unit.log_steps;
    }
    // Resumed from its final checkpoint (a requeue after the end): nothing to run or log.
    complete_ = setup_.resumed && first_ > config.train.steps;
    if (leader_ && !complete_) start_log();
  }

  TrainResult run() {
    wall_.restart();
    if (complete_) {
      console(fmt::format("the run is complete at step {} ({}): nothing left to do", first_ - 1,
                          setup_.resumed->dir.string()));
      return result_;
    }
    const int64_t done = run_steps(trainer_, first_, *this);
    bar_.finish();
    if (result_.signal == 0) {
      evaluate(done);
      sample(done);
    }
    finish(done);
    return result_;
  }

  // A stop signal counts once every rank of the unit knows of it, and a checkpoint of the step
  // before once rank 0 (whose clock decides checkpoint.every_s) says it is due: one reduction.
  bool before_step(int64_t t) override {
    if (t > config_.train.steps) return false;
    stall_for_test(t - 1);
    int flags[2] = {stop_signal(), leader_ && t > first_ && checkpoints_.due(t - 1)};
    if (ranks_ > 1) mpi::check(MPI_Allreduce(MPI_IN_PLACE, flags, 2, MPI_INT, MPI_MAX, world_), "Allreduce");
    result_.signal = flags[0];
    if (flags[0] != 0) {  // the stop's checkpoint is finish()'s
      due_at_stop_ = flags[1] != 0;
      return false;
    }
    if (flags[1] != 0) checkpoint(t - 1);
    return true;
  }

  bool after_step(int64_t& t, const StepStats& s, const Stopwatch&) override {
    tokens_ += s.tokens;
    train_s_ += s.compute_s + s.allreduce_s;
    interval_.seconds += s.compute_s + s.allreduce_s;
    interval_.reduce += s.allreduce_s;
    interval_.loss += s.loss;
    ++interval_.steps;
    ++interval_.timed;
    if (!std::isfinite(s.loss)) fail("training diverged: loss is {} at step {}", s.loss, t);
    const int64_t steps = config_.train.steps;
    if (t % config_.run.log_every == 0 || t == steps) log_train(t, s);
    if (config_.eval.every_steps > 0 && t % config_.eval.every_steps == 0 && t != steps) evaluate(t);
    if (config_.eval.sample_every_steps > 0 && t % config_.eval.sample_every_steps == 0 && t != steps) sample(t);
    return t < steps;
  }

 private:
  void start_log();
  int64_t checkpoint(int64_t t) {
    return checkpoints_.write(t, tokens_, trainer_, sample_rng_, interval_.loss, interval_.steps, wall_.seconds(), log_);
  }
  void stall_for_test(int64_t t);
  void log_train(int64_t t, const StepStats& s);
  void evaluate(int64_t t);
  void sample(int64_t t);
  void finish(int64_t done);
  void console(const std::string& line);

  const Config& config_;
  const MPI_Comm world_;
  const int ranks_;
  const bool leader_;
  const int threads_;
  const std::filesystem::path dir_;
  Setup setup_;
  UnitTrainer& trainer_;
  single::Checkpoints checkpoints_;
  int64_t first_ = 1;  // the first step this job runs (a resumed one: the checkpoint's + 1)
  int64_t tokens_at_start_ = 0;  // a resumed job's tokens when it started
  bool due_at_stop_ = false;     // a periodic checkpoint fell due at the step the job stopped
  bool complete_ = false;        // resumed from the final checkpoint
  JsonlWriter log_;  // leader: metrics.jsonl
  ProgressBar bar_;
  Stopwatch wall_;
  Rng sample_rng_;
  // What `train` events average over: the steps since the last one.
  struct {
    double seconds = 0, loss = 0, reduce = 0;
    int64_t steps = 0;  // whose losses `loss` sums (a resumed run's include the checkpoint's)
    int64_t timed = 0;  // whose times `seconds` sums (this job's)
  } interval_;
  int64_t tokens_ = 0;
  double train_s_ = 0;  // compute and all-reduce seconds
  TrainResult result_{NAN, 0};
};

void SingleUnit::start_log() {
  if (setup_.replace) clear_run_outputs(dir_);
  const std::string yaml = to_yaml(config_);
  write_text_atomically(dir_ / "config.yaml", yaml);
  std::printf("ddiloco %s: effective configuration (saved to %s)\n%s", DDILOCO_VERSION,
              (dir_ / "config.yaml").c_str(), yaml.c_str());
  // A resumed run goes on with the same metrics file.
  log_ = JsonlWriter(dir_ / "metrics.jsonl", /*truncate=*/!setup_.resumed);
  const auto& model = trainer_.model();
  // AdamW's m and v held by rank 0 (units.zero = 1: its shard; the others' are no larger).
  const size_t optimizer_bytes = 2 * sizeof(float) * trainer_.optimizer().shard().size();
  std::printf("model: %.2fM parameters, %d ranks x %d threads, %lld tokens/step, optimizer state "
              "%.1f MB/rank%s, train %lld batches/epoch/stream, val %lld sequences\n",
              static_cast<double>(model.layout().size()) / 1e6, ranks_, threads_,
              static_cast<long long>(trainer_.tokens_per_step()), static_cast<double>(optimizer_bytes) / 1e6,
              config_.units.zero == 1 ? " (units.zero 1)" : "",
              static_cast<long long>(trainer_.data()->batches_per_epoch()),
              static_cast<long long>(setup_.val->sequences()));
  std::fflush(stdout);
  log_.write({{"event", "start"}, {"step", first_ - 1}, {"tokens", tokens_}, {"elapsed_s", 0.0}, {"mode", "single"},
              {"ranks", ranks_}, {"threads_per_rank", threads_}, {"parameters", model.layout().size()},
              {"tokens_per_step", trainer_.tokens_per_step()}, {"zero", config_.units.zero},
              {"optimizer_bytes_per_rank", optimizer_bytes}});
  if (setup_.resumed) {
    log_.write({{"event", "resume"}, {"step", first_ - 1}, {"tokens", tokens_}, {"elapsed_s", 0.0},
                {"path", setup_.resumed->dir.string()}});
    std::printf("resumed from %s at step %lld\n", setup_.resumed->dir.c_str(), static_cast<long long>(first_ - 1));
  }
  if (trainer_.gpu()) std::printf("device: %s\n", trainer_.gpu()->describe().c_str());
}

// Test hook (debug.stall_unit = 0, debug.stall_at_step): after that step this rank waits,
// asleep, until it is told to stop, so that a test signals a run at a step of its choosing.
void SingleUnit::stall_for_test(int64_t t) {
  if (config_.debug.stall_unit != 0 || t != config_.debug.stall_at_step || t < first_) return;
  while (stop_signal() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

void SingleUnit::console(const std::string& line) {
  if (!leader_) return;
  bar_.clear();
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

void SingleUnit::log_train(int64_t t, const StepStats& s) {
  const double tps = interval_.timed * trainer_.tokens_per_step() / interval_.seconds;
  const double mean_loss = interval_.loss / interval_.steps;
  log_.write({{"event", "train"}, {"step", t}, {"tokens", tokens_}, {"elapsed_s", wall_.seconds()},
              {"train_loss", mean_loss}, {"lr", s.lr}, {"grad_norm", s.grad_norm}, {"tokens_per_s", tps},
              {"allreduce_s", interval_.reduce}});
  const std::string status =
      fmt::format("loss {:.4f} | lr {:.2e} | {:.0f} tok/s | {:.0f}s", mean_loss, s.lr, tps, wall_.seconds());
  if (bar_.enabled())
    bar_.update(t, config_.train.steps, status);
  else
    console(fmt::format("step {:>6}/{} | {}", t, config_.train.steps, status));
  interval_ = {};
}

void SingleUnit::evaluate(int64_t t) {
  trainer_.check_replicas();
  Stopwatch clock;
  result_.val_loss = trainer_.validation_loss(*setup_.val);
  log_.write({{"event", "val"}, {"step", t}, {"tokens", tokens_}, {"elapsed_s", wall_.seconds()},
              {"val_loss", result_.val_loss}, {"eval_s", clock.seconds()}});
  console(fmt::format("step {:>6} | val_loss {:.4f} | {} tokens | {:.1f}s", t, result_.val_loss,
                      format_tokens(tokens_), wall_.seconds()));
}

// Every rank samples (same model, same generator) so the model's activations stay in
// lockstep; only the leader prints.
void SingleUnit::sample(int64_t t) {
  if (config_.eval.sample_tokens <= 0) return;
  trainer_.download_state(false);  // cuda: the host model samples; parameters only
  const auto prompt = encode_prompt(config_.eval.sample_prompt, config_.model.vocab_size);
  const auto out =
      generate(trainer_.model(), prompt, config_.eval.sample_tokens, config_.eval.temperature, sample_rng_);
  std::vector<int32_t> all(prompt.begin() + 1, prompt.end());
  all.insert(all.end(), out.begin(), out.end());
  const std::string text = detokenize(all, config_.model.vocab_size);
  log_.write({{"event", "sample"}, {"step", t}, {"tokens", tokens_}, {"elapsed_s", wall_.seconds()}, {"text", text}});
  console(fmt::format("--- sample at step {} ---\n{}\n---", t, text));
}

// The model saved, and the run's last event: done, or interrupted with the step each rank
// stopped at (they agreed on the stop, so one step).
void SingleUnit::finish(int64_t done) {
  // Collective: every rank's data cursor goes into it. (None when nothing was stepped since
  // the checkpoint this job resumed from.)
  const bool periodic = due_at_stop_ || (config_.checkpoint.every > 0 && done % config_.checkpoint.every == 0);
  if ((config_.checkpoint.at_stop || periodic) && done >= first_) checkpoint(done);
  std::vector<int64_t> rank_steps(static_cast<size_t>(ranks_), done);
  if (result_.signal != 0 && ranks_ > 1)
    mpi::check(MPI_Gather(&done, 1, MPI_INT64_T, rank_steps.data(), 1, MPI_INT64_T, 0, world_), "Gather");
  if (!leader_) return;
  const std::filesystem::path model_path = dir_ / "model.h5";
  nlohmann::json meta = {{"step", done}, {"tokens", tokens_}, {"run_dir", dir_.string()}};
  if (result_.signal == 0) meta["val_loss"] = result_.val_loss;
  if (result_.signal != 0) meta["interrupted"] = true;
  trainer_.download_state(false);  // cuda: the device's parameters are the trained ones
  save_model(model_path, config_.model, trainer_.model().parameters(), meta);
  const double tps = train_s_ > 0 ? static_cast<double>(tokens_ - tokens_at_start_) / train_s_ : 0.0;
  if (result_.signal != 0) {
    log_.write({{"event", "interrupted"}, {"signal", result_.signal}, {"step", done}, {"rank_steps", rank_steps},
                {"tokens", tokens_}, {"elapsed_s", wall_.seconds()}, {"model", model_path.string()}});
    console(fmt::format("interrupted by signal {} after {} steps; model saved to {}", result_.signal, done,
                        model_path.string()));
    return;
  }
  log_.write({{"event", "done"}, {"step", done}, {"tokens", tokens_}, {"elapsed_s", wall_.seconds()},
              {"val_loss", result_.val_loss}, {"tokens_per_s", tps}, {"model", model_path.string()}});
  console(fmt::format("done: {} steps, {} tokens in {:.1f}s ({:.0f} tokens/s training), val_loss {:.4f}; "
                      "model saved to {}",
                      done, format_tokens(tokens_), wall_.seconds(), tps, result_.val_loss, model_path.string()));
}

}  // namespace

TrainResult train_single_unit(const Config& config, MPI_Comm world, bool overwrite, const std::string& resume) {
  return SingleUnit(config, world, overwrite, resume).run();
}

}  // namespace ddiloco
