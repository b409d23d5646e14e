// Checkpoints of mode single (single_checkpoints.hpp): the one unit's state in the outer
// modes' unit file, and its resume.
#include "ddiloco/single_checkpoints.hpp"

#include <algorithm>
#include <cstdio>

#include "ddiloco/error.hpp"
#include "ddiloco/mpi.hpp"

namespace ddiloco::single {

namespace {

// What unit_0.h5 holds, but for the data cursors (gathered) and the id. Rank 0, after
// gather_moments (which downloaded the device's state with cuda).
checkpoint::UnitState state_of(const Config& config, int64_t t, int64_t tokens, UnitTrainer& trainer,
                               UnitTrainer::Moments moments, const Rng& sampler) {
  checkpoint::UnitState st;
  st.model = config.model;
  st.step = t;
  st.tokens = tokens;
  st.run_seed = config.run.seed;
  const auto params = trainer.model().parameters();
  st.params.assign(params.begin(), params.end());
  st.adam_m = std::move(moments.m);
  st.adam_v = std::move(moments.v);
  st.adam_step = moments.step;
  // One fragment that is never sent: the outer modes' counters, at rest.
  st.c_steps = st.c_tok = st.last_seq = st.sent_c_steps = st.sent_c_tok = {0};
  st.sent_step = {-1};
  st.sample_rng = sampler.state();
  return st;
}

}  // namespace

std::optional<Resumed> read_resume(const Config& config, MPI_Comm world, const std::string& resume) {
  if (resume.empty()) return std::nullopt;
  const std::string dir = mpi::broadcast(
      mpi::agree(world, [&] { return mpi::rank(world) == 0 ? checkpoint::choose(config, resume) : std::string(); }),
      0, world);
  if (dir.empty()) return std::nullopt;
  return mpi::agree(world, [&] {
    const std::filesystem::path file = checkpoint::unit_file(dir, 0);
    Resumed r{dir, checkpoint::read_unit(file, 1)};
    const int ranks = mpi::size(world);
    if (static_cast<int>(r.unit.cursors.size()) != ranks)
      fail("{}: written by {} ranks, this job has {}: resume it with mpirun -np {} (each rank reads "
           "its own data stream, whose order depends on the number of ranks)",
           file.string(), r.unit.cursors.size(), ranks, r.unit.cursors.size());
    if (r.unit.run_seed != config.run.seed)
      fail("{}: written by a run with run.seed = {}, this configuration has {}: another run (its "
           "initialisation and data order differ); set run.seed: {} to resume it",
           file.string(), r.unit.run_seed, config.run.seed, r.unit.run_seed);
    if (r.unit.lost) fail("{}: holds no parameters (lost = 1), which mode single never writes", file.string());
    if (!(r.unit.model == config.model))
      fail("{}: the model shape differs from model.* of this configuration", file.string());
    if (r.unit.step > config.train.steps)
      fail("{}: at step {}, past train.steps = {}: raise train.steps to go on", file.string(), r.unit.step,
           config.train.steps);
    return r;
  });
}

void restore(const checkpoint::UnitState& st, int rank, UnitTrainer& trainer, Rng& sampler) {
  std::copy(st.params.begin(), st.params.end(), trainer.model().parameters().begin());
  trainer.set_steps_done(st.step);
  trainer.data()->seek(st.cursors[static_cast<size_t>(rank)]);
  if (!st.sample_rng.empty()) sampler.set_state(st.sample_rng);
  // This rank's part of AdamW's state (units.zero = 1: its shard); cuda: uploads it all.
  trainer.set_moments(st.adam_m, st.adam_v, st.adam_step);
}

Checkpoints::Checkpoints(const Config& config, MPI_Comm world)
    : config_(config),
      world_(world),
      leader_(mpi::rank(world) == 0),
      root_(config.checkpoint.directory(config.run.dir)) {
  if (leader_ && enabled()) checkpoint::check_directory(root_);
}

bool Checkpoints::due(int64_t t) const {
  const auto& c = config_.checkpoint;
  return (c.every > 0 && t % c.every == 0) || (c.every_s > 0 && since_last_.seconds() >= c.every_s);
}

int64_t Checkpoints::write(int64_t t, int64_t tokens, UnitTrainer& trainer, const Rng& sampler, double log_loss_sum,
                           int64_t log_steps, double elapsed_s, JsonlWriter& log) {
  const DataCursor mine = trainer.data()->cursor();
  const int ranks = mpi::size(world_);
  std::vector<int64_t> cursor = {mine.epoch, mine.batch}, all(2 * static_cast<size_t>(ranks));
  mpi::check(MPI_Gather(cursor.data(), 2, MPI_INT64_T, all.data(), 2, MPI_INT64_T, 0, world_),
             "Gather(data cursor)");
  since_last_.restart();
  UnitTrainer::Moments moments = trainer.gather_moments();  // collective
  if (!leader_) return 0;
  Stopwatch clock;
  const int64_t id = checkpoint::highest_id(root_) + 1;
  try {
    checkpoint::UnitState st = state_of(config_, t, tokens, trainer, std::move(moments), sampler);
    st.id = id;
    st.log_loss_sum = log_loss_sum;
    st.log_steps = log_steps;
    for (int r = 0; r < ranks; ++r) st.cursors.push_back({all[2 * r], all[2 * r + 1]});
    const std::filesystem::path dir = checkpoint::directory(root_, id);
    std::filesystem::create_directories(dir);
    checkpoint::write_unit(dir, st);
    checkpoint::write_manifest(dir, id, config_,
                               {{"step", t}, {"tokens", tokens}, {"unit_ranks", std::vector<int>{ranks}},
                                {"final", t == config_.train.steps}, {"config", to_yaml(config_)}});
    checkpoint::prune(root_, config_.checkpoint.keep);
  } catch (const std::exception& e) {
    // Disk full, a file system gone: this checkpoint is abandoned (pruned once a later one is
    // complete), not the job.
    std::fprintf(stderr, "ddiloco: warning: checkpoint %lld not written: %s\n", static_cast<long long>(id), e.what());
    log.write({{"event", "checkpoint_failed"}, {"id", id}, {"step", t}, {"tokens", tokens}, {"elapsed_s", elapsed_s},
               {"error", e.what()}});
    return 0;
  }
  log.write({{"event", "checkpoint"}, {"id", id}, {"step", t}, {"tokens", tokens}, {"elapsed_s", elapsed_s},
             {"write_s", clock.seconds()}});
  return id;
}

}  // namespace ddiloco::single
