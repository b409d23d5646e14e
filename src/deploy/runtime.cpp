// The entry point that sends each rank to its role.
#include <omp.h>

#include <cmath>

#include "ddiloco/checkpoint.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/mpi_memory.hpp"
#include "ddiloco/run_dir.hpp"
#include "ddiloco/runtime.hpp"
#include "ddiloco/syncer.hpp"
#include "ddiloco/time_books.hpp"
#include "ddiloco/signals.hpp"
#include "ddiloco/trainer.hpp"

namespace ddiloco::deploy {

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
    return mpi::rank(world) == 0 && !resume_arg.empty() ? checkpoint::choose(config, resume_arg)
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
  if (topology.role == Topology::Role::syncer) {
    SyncerSetup setup = set_up_syncer(config, plan, world, resume, replace);
    comm::MpiRemoteMemory remote(topology.sync_comm, topology.units);
    return syncer::run_syncer(config, plan, topology, *setup.val, resume, setup.state ? &*setup.state : nullptr,
                      syncer::SyncerLink{&remote, nullptr, "", ""});
  }
  UnitSetup unit = set_up_unit(config, plan, topology, learners, resume);
  // The one-job deployment: the leader's window is an MPI window over the sync communicator.
  unit.link.expose = [&](size_t bytes) -> std::unique_ptr<comm::ExposedMemory> {
    return std::make_unique<comm::MpiExposedMemory>(topology.sync_comm, bytes);
  };
  wan::LinkCounters link;
  const TimeBook book = learner::run_learner(config, plan, topology, *unit.trainer,
                                    unit.resumed ? &*unit.resumed : nullptr, &link, unit.link);
  protocol::gather_time_books(book, topology.world);  // the syncer reports them
  wan::gather_link_counters(link, topology.world);
  return 0;
}

}  // namespace ddiloco::deploy
