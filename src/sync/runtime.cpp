// The entry point that sends each rank to its role.
#include <omp.h>

#include <cmath>

#include "ddiloco/checkpoint.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/mpi_memory.hpp"
#include "ddiloco/run_dir.hpp"
#include "ddiloco/runtime.hpp"
#include "ddiloco/signals.hpp"
#include "ddiloco/trainer.hpp"

namespace ddiloco {

// The checkpoint a job resumes from ("" = a fresh start), chosen on one rank.
std::string choose_checkpoint(const Config& config, const std::string& resume) {
  if (!OuterPlan::from(config).outer_steps)
    fail("--resume: mode ddp writes no checkpoints (modes diloco, streaming and decoupled do)");
  if (resume == "auto") {
    const std::filesystem::path root = config.checkpoint.directory(config.run.dir);
    std::vector<std::string> warnings;
    const auto found = checkpoint::find_latest(root, warnings);
    for (const auto& w : warnings) std::fprintf(stderr, "ddiloco: warning: %s\n", w.c_str());
    if (!found) {
      std::printf("--resume auto: no checkpoint in %s: starting fresh\n", root.c_str());
      return "";
    }
    checkpoint::check_compatible(found->manifest, config, found->dir);
    return found->dir.string();
  }
  const nlohmann::json manifest = checkpoint::verify(resume);
  checkpoint::check_compatible(manifest, config, resume);
  return resume;
}

SyncerSetup prepare_syncer(const Config& config, const OuterPlan& plan, const std::string& resume,
                           bool replace) {
  SyncerSetup setup;
  const std::filesystem::path dir = config.run.dir;
  check_run_dir(dir, replace || !resume.empty());
  if (plan.outer_steps && config.checkpoint.enabled())
    checkpoint::check_directory(config.checkpoint.directory(config.run.dir));
  if (!resume.empty()) {
    setup.state = checkpoint::read_syncer(checkpoint::syncer_file(resume));
    const checkpoint::SyncerState& st = *setup.state;
    if (st.units != config.units.count || st.fragments != plan.fragments || !(st.model == config.model))
      fail("{}: holds {} units, {} fragments and another model shape than this "
           "configuration's {} units, {} fragments", checkpoint::syncer_file(resume).string(),
           st.units, st.fragments, config.units.count, plan.fragments);
  }
  const auto val_files = expand_shard_pattern(config.data.val, "data.val");
  check_disjoint_splits(expand_shard_pattern(config.data.train, "data.train"), val_files);
  setup.val = std::make_unique<ValidationSet>(val_files, config.model.vocab_size,
                                              config.model.seq_len, config.eval.val_tokens);
  return setup;
}

std::unique_ptr<UnitTrainer> make_unit_trainer(const Config& config, const OuterPlan& plan,
                                               const Topology& topology, MPI_Comm learners) {
  auto t = std::make_unique<UnitTrainer>(config, topology.unit_comm, learners);
  t->attach_data(std::make_unique<TrainStream>(
      expand_shard_pattern(config.data.train, "data.train"), config.model.vocab_size,
      config.train.batch_size, config.model.seq_len, topology.stream_index,
      topology.stream_count, static_cast<uint64_t>(config.run.seed), config.data.shuffle));
  if (topology.leader && plan.outer_steps && config.checkpoint.enabled())
    checkpoint::check_directory(config.checkpoint.directory(config.run.dir));
  return t;
}

int run_job(const Config& config, MPI_Comm world, bool overwrite, const std::string& resume_arg) {
  const OuterPlan plan = mpi::agree(world, [&] {
    if (mpi::size(world) != config.world_size())
      fail("mode {} with units.count = {} needs {} MPI ranks (1 syncer + {} learners), got {}: "
           "run mpirun -np {}",
           mode_name(config.mode), config.units.count, config.world_size(),
           config.world_size() - 1, mpi::size(world), config.world_size());
    return OuterPlan::from(config);
  });
  const std::string resume = mpi::broadcast(mpi::agree(world, [&] {
    return mpi::rank(world) == 0 && !resume_arg.empty() ? choose_checkpoint(config, resume_arg)
                                                        : std::string();
  }), 0, world);
  // --resume auto with nothing to resume starts over, replacing an earlier attempt's outputs.
  const bool replace = overwrite || (resume_arg == "auto" && resume.empty());
  const Topology topology(config, world);
  configure_threads(config.run.threads, world);  // collective: before the roles part ways
  // run.device: cuda picks each learner rank's GPU by its node-local rank among the learner
  // ranks (not the syncer's, which would take a GPU's turn; not one unit's, or two units on a
  // node would both start at device 0). Collective over `world`, so also before they part.
  MPI_Comm learners = MPI_COMM_NULL;
  if (config.run.device == "cuda")
    mpi::check(MPI_Comm_split(world, topology.role == Topology::Role::learner ? 0 : MPI_UNDEFINED,
                              mpi::rank(world), &learners),
               "Comm_split(learners)");
  const std::filesystem::path dir = config.run.dir;
  if (topology.role == Topology::Role::syncer) {
    SyncerSetup setup = mpi::agree(world, [&] { return prepare_syncer(config, plan, resume, replace); });
    if (replace && resume.empty()) clear_run_outputs(dir);
    install_stop_signals();
    comm::MpiRemoteMemory remote(topology.sync_comm, topology.units);
    return run_syncer(config, plan, topology, *setup.val, resume, setup.state ? &*setup.state : nullptr,
                      SyncerLink{&remote, nullptr, "", ""});
  }
  std::optional<LearnerResume> resumed;
  auto trainer = mpi::agree(world, [&] {
    auto t = make_unit_trainer(config, plan, topology, learners);
    if (!resume.empty()) {
      const std::filesystem::path file = checkpoint::unit_file(resume, topology.unit);
      LearnerResume r{resume, checkpoint::read_unit(file, OuterPlan::from(config).fragments),
                      checkpoint::read_syncer(checkpoint::syncer_file(resume))};
      if (r.unit.unit != topology.unit || static_cast<int>(r.unit.cursors.size()) != topology.unit_size)
        fail("{}: holds unit {} with {} ranks, expected unit {} with {}", file.string(), r.unit.unit,
             r.unit.cursors.size(), topology.unit, topology.unit_size);
      if (!(r.unit.model == config.model) || !(r.syncer.model == config.model))
        fail("{}: the model shape differs from model.* of this configuration", resume);
      resumed = std::move(r);
    }
    return t;
  });
  // Only select_device needed it (an error above leaks it: the job is ending anyway).
  if (learners != MPI_COMM_NULL) MPI_Comm_free(&learners);
  install_stop_signals();
  wan::LinkCounters link;
  LearnerLink window_link;  // the one-job deployment: an MPI window over the sync communicator
  window_link.processes = topology.unit_processes();  // collective over the unit: every rank
  window_link.expose = [&](size_t bytes) -> std::unique_ptr<comm::ExposedMemory> {
    return std::make_unique<comm::MpiExposedMemory>(topology.sync_comm, bytes);
  };
  const TimeBook book =
      run_learner(config, plan, topology, *trainer, resumed ? &*resumed : nullptr, &link, window_link);
  gather_time_books(book, topology.world);  // the syncer reports them
  wan::gather_link_counters(link, topology.world);
  return 0;
}

}  // namespace ddiloco
