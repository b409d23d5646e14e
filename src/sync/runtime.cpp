// Mode → outer-loop settings, and the entry point that sends each rank to its role.
#include <omp.h>

#include <cmath>

#include "ddiloco/error.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/run_dir.hpp"
#include "ddiloco/runtime.hpp"
#include "ddiloco/signals.hpp"
#include "ddiloco/trainer.hpp"

namespace ddiloco {

OuterPlan OuterPlan::from(const Config& c) {
  OuterPlan plan;
  plan.mode = c.mode;
  plan.h = c.outer.h;
  switch (c.mode) {
    case Mode::single:
      fail("mode single has no outer loop");
    case Mode::ddp:
      plan.outer_steps = false;
      plan.fragments = 1;
      plan.overlap = 0;
      plan.quorum = c.units.count;
      break;
    case Mode::diloco:
      plan.fragments = 1;
      plan.overlap = 0;
      plan.quorum = c.units.count;
      plan.learners_wait = true;
      break;
    case Mode::streaming:
      plan.fragments = c.outer.fragments;
      plan.overlap = c.outer.overlap;
      plan.quorum = c.units.count;
      plan.learners_wait = true;
      break;
    case Mode::decoupled:
      plan.fragments = c.outer.fragments;
      plan.overlap = c.outer.overlap;
      plan.quorum = c.syncer.quorum;
      plan.learners_wait = c.outer.overlap == 0;
      break;
  }
  if (plan.overlap >= plan.h)
    fail("outer.overlap: must be < outer.h = {} (a merge must land before the fragment is due "
         "again), got {}",
         plan.h, plan.overlap);
  return plan;
}

int run_job(const Config& config, MPI_Comm world, bool overwrite) {
  const OuterPlan plan = mpi::agree(world, [&] {
    if (mpi::size(world) != config.world_size())
      fail("mode {} with units.count = {} needs {} MPI ranks (1 syncer + {} learners), got {}: "
           "run mpirun -np {}",
           mode_name(config.mode), config.units.count, config.world_size(),
           config.world_size() - 1, mpi::size(world), config.world_size());
    return OuterPlan::from(config);
  });
  const Topology topology(config, world);
  configure_threads(config.run.threads, world);  // collective: before the roles part ways
  const std::filesystem::path dir = config.run.dir;
  if (topology.role == Topology::Role::syncer) {
    auto val = mpi::agree(world, [&] {
      check_run_dir(dir, overwrite);
      const auto val_files = expand_shard_pattern(config.data.val, "data.val");
      check_disjoint_splits(expand_shard_pattern(config.data.train, "data.train"), val_files);
      return std::make_unique<ValidationSet>(val_files, config.model.vocab_size,
                                             config.model.seq_len, config.eval.val_tokens);
    });
    if (overwrite) clear_run_outputs(dir);
    install_stop_signals();
    return run_syncer(config, plan, topology, *val);
  }
  auto trainer = mpi::agree(world, [&] {
    auto t = std::make_unique<UnitTrainer>(config, topology.unit_comm);
    t->attach_data(std::make_unique<TrainStream>(
        expand_shard_pattern(config.data.train, "data.train"), config.model.vocab_size,
        config.train.batch_size, config.model.seq_len, topology.stream_index,
        topology.stream_count, static_cast<uint64_t>(config.run.seed), config.data.shuffle));
    return t;
  });
  install_stop_signals();
  const TimeBook book = run_learner(config, plan, topology, *trainer);
  gather_time_books(book, topology.world);  // the syncer reports them
  return 0;
}

}  // namespace ddiloco
