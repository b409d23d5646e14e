// The two roles' set-up, the same in both deployments (runtime.hpp): the one-job deployment
// (runtime.cpp) and the isolated one (isolated.cpp) differ only in how a unit reaches the
// syncer.
#include "ddiloco/checkpoint.hpp"
#include "ddiloco/fragments.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/run_dir.hpp"
#include "ddiloco/runtime.hpp"
#include "ddiloco/signals.hpp"

namespace ddiloco::deploy {

namespace {

SyncerSetup prepare_syncer(const Config& config, const OuterPlan& plan, const std::string& resume, bool replace) {
  SyncerSetup setup;
  const std::filesystem::path dir = config.run.dir;
  check_run_dir(dir, replace || !resume.empty());
  if (config.checkpoint.enabled())
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

std::unique_ptr<UnitTrainer> make_unit_trainer(const Config& config, const Topology& topology,
                                               MPI_Comm learners) {
  auto t = std::make_unique<UnitTrainer>(config, topology.unit_comm, learners);
  t->attach_data(std::make_unique<TrainStream>(
      expand_shard_pattern(config.data.train, "data.train"), config.model.vocab_size,
      config.train.batch_size, config.model.seq_len, topology.stream_index,
      topology.stream_count, static_cast<uint64_t>(config.run.seed), config.data.shuffle));
  if (topology.leader && config.checkpoint.enabled())
    checkpoint::check_directory(config.checkpoint.directory(config.run.dir));
  return t;
}

// The checkpoint's files for this learner rank, checked against the topology and the model.
learner::LearnerResume read_learner_resume(const Config& config, const OuterPlan& plan, const Topology& topology,
                                  const std::string& resume) {
  const std::filesystem::path file = checkpoint::unit_file(resume, topology.unit);
  const ParameterLayout layout = ParameterLayout::gpt2(config.model);
  const std::vector<size_t> numel = protocol::FragmentPlan(layout, plan.fragments, 1).numels();
  learner::LearnerResume r{resume, checkpoint::read_unit(file, plan.fragments, numel),
                  checkpoint::read_syncer(checkpoint::syncer_file(resume))};
  if (r.unit.unit != topology.unit || static_cast<int>(r.unit.cursors.size()) != topology.unit_size)
    fail("{}: holds unit {} with {} ranks, expected unit {} with {}", file.string(), r.unit.unit,
         r.unit.cursors.size(), topology.unit, topology.unit_size);
  if (!(r.unit.model == config.model) || !(r.syncer.model == config.model))
    fail("{}: the model shape differs from model.* of this configuration", resume);
  return r;
}

}  // namespace

SyncerSetup set_up_syncer(const Config& config, const OuterPlan& plan, MPI_Comm world, const std::string& resume,
                          bool replace, bool restart) {
  SyncerSetup setup = mpi::agree(world, [&] { return prepare_syncer(config, plan, resume, replace || restart); });
  if (replace && resume.empty()) clear_run_outputs(config.run.dir);
  install_stop_signals();
  return setup;
}

UnitSetup set_up_unit(const Config& config, const OuterPlan& plan, const Topology& topology, MPI_Comm learners,
                      const std::string& resume) {
  UnitSetup s;
  s.trainer = mpi::agree(topology.world, [&] {
    auto t = make_unit_trainer(config, topology, learners);
    if (!resume.empty()) s.resumed = read_learner_resume(config, plan, topology, resume);
    return t;
  });
  // Only select_device needed it (an error above leaks it: the job is ending anyway).
  if (learners != MPI_COMM_NULL) MPI_Comm_free(&learners);
  install_stop_signals();
  s.link.processes = topology.unit_processes();  // collective over the unit: every rank
  return s;
}

}  // namespace ddiloco::deploy
