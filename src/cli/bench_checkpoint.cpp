// `ddiloco bench checkpoint`: what a checkpoint of the config's model costs on the file system
// it would go to — writing a unit's and the syncer's files and the manifest, verifying, reading
// back — set beside the time of one inner step of the model on this rank.
#include <mpi.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>

#include "cli/commands.hpp"
#include "ddiloco/checkpoint.hpp"
#include "ddiloco/config.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/outer_plan.hpp"
#include "ddiloco/rng.hpp"
#include "ddiloco/trainer.hpp"

namespace ddiloco::cli {

namespace {

// One inner step of the model on random tokens, seconds: what a checkpoint's cost is set
// beside. The model and its optimizer come out trained a few steps, their state the files'.
double time_inner_step(const Config& config, Gpt<float>& model, AdamW<float>& opt) {
  const int B = config.train.batch_size, T = config.model.seq_len;
  Rng rng(7);
  std::vector<int32_t> in(static_cast<size_t>(B) * T), tgt(in.size());
  for (auto& t : in) t = static_cast<int32_t>(rng.below(config.model.vocab_size));
  for (auto& t : tgt) t = static_cast<int32_t>(rng.below(config.model.vocab_size));
  auto step = [&] {
    model.forward(in.data(), tgt.data(), B, T);
    model.zero_grad();
    model.backward();
    opt.step(model.parameters(), model.gradients(), 1e-4);
  };
  step();  // warm-up
  Stopwatch c;
  for (int i = 0; i < 3; ++i) step();
  return c.seconds() / 3;
}

checkpoint::UnitState unit_state(const Config& config, const Gpt<float>& model, AdamW<float>& opt,
                                 int P) {
  const auto copy = [](std::span<const float> x) { return std::vector<float>(x.begin(), x.end()); };
  checkpoint::UnitState unit;
  unit.id = 1;
  unit.model = config.model;
  unit.params = copy(model.parameters());
  unit.adam_m = copy(opt.first_moment());
  unit.adam_v = copy(opt.second_moment());
  unit.adam_step = 4;
  for (auto* v : {&unit.c_steps, &unit.c_tok, &unit.sent_step, &unit.last_seq, &unit.sent_c_steps,
                  &unit.sent_c_tok})
    v->assign(P, 0);
  unit.cursors.assign(config.unit_ranks(0), DataCursor{});
  return unit;
}

// The syncer's file holds Θ and the outer momentum, as large as the unit's params and m.
checkpoint::SyncerState syncer_state(const Config& config, const checkpoint::UnitState& unit, int P) {
  checkpoint::SyncerState syncer;
  syncer.id = 1;
  syncer.mode = mode_name(config.mode);
  syncer.model = config.model;
  syncer.units = config.units.count;
  syncer.fragments = P;
  syncer.h = config.outer.h;
  syncer.theta = unit.params;
  syncer.momentum = unit.adam_m;
  syncer.versions.assign(P, 0);
  syncer.merged_seq.assign(static_cast<size_t>(syncer.units) * P, 0);
  syncer.grace.assign(7, 0.0);
  return syncer;
}

struct Row {
  const char* what;
  double s = 0;  // summed over the repeats
};
using Rows = std::array<Row, 6>;

// One checkpoint written, verified and read back in `dir`, each part's time added to its row.
void time_checkpoint(const std::filesystem::path& dir, const Config& config, const checkpoint::UnitState& unit,
                     const checkpoint::SyncerState& syncer, Rows& rows) {
  Stopwatch t;
  checkpoint::write_unit(dir, unit);
  rows[0].s += t.seconds();
  t.restart();
  checkpoint::write_syncer(dir, syncer);
  rows[1].s += t.seconds();
  t.restart();
  Config one = config;
  one.units.count = 1;  // the manifest lists the one unit file written here
  checkpoint::write_manifest(dir, 1, one, {});
  rows[2].s += t.seconds();
  t.restart();
  checkpoint::verify(dir);
  rows[3].s += t.seconds();
  t.restart();
  checkpoint::read_unit(checkpoint::unit_file(dir, 0), syncer.fragments);
  rows[4].s += t.seconds();
  t.restart();
  checkpoint::read_syncer(checkpoint::syncer_file(dir));
  rows[5].s += t.seconds();
}

}  // namespace

int bench_checkpoint(const BenchCheckpointOptions& o) {
  const Config config = load_config(o.config, o.overrides);
  configure_threads(config.run.threads, MPI_COMM_SELF);
  Gpt<float> model(config.model);
  model.init_weights(static_cast<uint64_t>(config.run.seed));
  AdamW<float> opt(model.layout(), AdamWConfig{});
  const double step_s = time_inner_step(config, model, opt);
  const int P = OuterPlan::fragments_of(config);
  const checkpoint::UnitState unit = unit_state(config, model, opt, P);
  const checkpoint::SyncerState syncer = syncer_state(config, unit, P);

  const std::filesystem::path root =
      o.dir.empty() ? config.checkpoint.directory(config.run.dir) : o.dir;
  const std::filesystem::path dir = root / ("bench_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  Rows rows = {{{"write unit file"}, {"write syncer file"}, {"manifest (checksums)"},
                {"verify (checksums)"}, {"read unit file"}, {"read syncer file"}}};
  for (int r = 0; r < o.repeats; ++r) time_checkpoint(dir, config, unit, syncer, rows);
  const double unit_mb = std::filesystem::file_size(checkpoint::unit_file(dir, 0)) / 1e6;
  const double syncer_mb = std::filesystem::file_size(checkpoint::syncer_file(dir)) / 1e6;
  std::filesystem::remove_all(dir);
  std::printf("bench checkpoint: params=%.2fM, unit file %.1f MB, syncer file %.1f MB, in %s, "
              "%d repeats; one inner step (B=%d, T=%d) %.1f ms\n",
              model.layout().size() / 1e6, unit_mb, syncer_mb, root.c_str(), o.repeats,
              config.train.batch_size, config.model.seq_len, 1e3 * step_s);
  std::printf("%-22s %10s %10s %14s\n", "", "ms", "MB/s", "inner steps");
  const double mb[] = {unit_mb, syncer_mb, unit_mb + syncer_mb, unit_mb + syncer_mb, unit_mb, syncer_mb};
  for (int i = 0; i < 6; ++i) {
    const double s = rows[i].s / o.repeats;
    std::printf("%-22s %10.1f %10.0f %14.2f\n", rows[i].what, 1e3 * s, mb[i] / s, s / step_s);
  }
  // A unit pauses for its own file; the syncer writes its file and the manifest while the
  // units train on.
  std::printf("unit_pause_steps=%.2f\n", rows[0].s / o.repeats / step_s);
  return 0;
}

}  // namespace ddiloco::cli
