#include "ddiloco/topology.hpp"

#include <unistd.h>

#include <cstdio>
#include <exception>
#include <vector>

#include "ddiloco/error.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/mpi.hpp"

namespace ddiloco {

Topology::Topology(const Config& config, MPI_Comm world_comm) : world(world_comm) {
  world_rank = mpi::rank(world);
  const int world_size = mpi::size(world);
  units = config.units.count;
  if (world_size != config.world_size())
    fail("mode {} with units.count = {} needs {} MPI ranks (1 syncer + {} learners), got {}: "
         "run mpirun -np {}",
         mode_name(config.mode), units, config.world_size(), config.world_size() - 1, world_size,
         config.world_size());
  role = world_rank == 0 ? Role::syncer : Role::learner;
  if (role == Role::learner) {
    int first = 1;
    for (int u = 0; u < units; ++u) {
      const int n = config.unit_ranks(u);
      if (world_rank < first + n) {
        unit = u;
        unit_rank = world_rank - first;
        unit_size = n;
        break;
      }
      first += n;
    }
    leader = unit_rank == 0;
    stream_index = world_rank - 1;
    stream_count = world_size - 1;
  }
  // Learners of one unit; the syncer is alone (MPI_UNDEFINED gives it MPI_COMM_NULL).
  mpi::check(MPI_Comm_split(world, role == Role::learner ? unit : MPI_UNDEFINED, unit_rank,
                            &unit_comm),
             "Comm_split(unit)");
  const bool in_sync = role == Role::syncer || leader;
  mpi::check(MPI_Comm_split(world, in_sync ? 0 : MPI_UNDEFINED, in_sync ? unit + 1 : 0,
                            &sync_comm),
             "Comm_split(sync)");
  mpi::check(MPI_Comm_split(world, leader ? 0 : MPI_UNDEFINED, unit, &leaders_comm),
             "Comm_split(leaders)");
}

Topology::Topology(const Config& config, MPI_Comm world_comm, int u) : world(world_comm), isolated(true) {
  world_rank = mpi::rank(world);
  const int world_size = mpi::size(world);
  units = config.units.count;
  if (u < 0) {
    if (world_size != 1)
      fail("ddiloco syncer runs as one process, got {} MPI ranks (start it without mpirun, or "
           "with -np 1)",
           world_size);
    role = Role::syncer;
    return;
  }
  if (u >= units)
    fail("--unit: must be in 0..{} (units.count = {}), got {}", units - 1, units, u);
  if (world_size != config.unit_ranks(u))
    fail("unit {} has {} ranks in the configuration (units.ranks), but this job has {}: run "
         "mpirun -np {}",
         u, config.unit_ranks(u), world_size, config.unit_ranks(u));
  role = Role::learner;
  unit = u;
  unit_rank = world_rank;
  unit_size = world_size;
  leader = unit_rank == 0;
  for (int v = 0; v < units; ++v) {
    if (v < u) stream_index += config.unit_ranks(v);
    stream_count += config.unit_ranks(v);
  }
  stream_index += unit_rank;
  mpi::check(MPI_Comm_dup(world, &unit_comm), "Comm_dup(unit)");
}

nlohmann::json Topology::unit_processes() const {
  // Fixed-size records: host names are at most 255 bytes (HOST_NAME_MAX).
  constexpr int kHost = 256;
  struct Record {
    int64_t pid;
    char host[kHost];
  } mine{static_cast<int64_t>(::getpid()), {}};
  const std::string host = host_name();
  std::snprintf(mine.host, kHost, "%s", host.c_str());
  std::vector<Record> all(leader ? static_cast<size_t>(unit_size) : 0);
  mpi::check(MPI_Gather(&mine, sizeof(Record), MPI_BYTE, all.data(), sizeof(Record), MPI_BYTE, 0, unit_comm),
             "Gather(unit processes)");
  nlohmann::json out = nlohmann::json::array();
  for (int r = 0; r < static_cast<int>(all.size()); ++r)
    out.push_back({{"rank", r}, {"host", std::string(all[r].host)}, {"pid", all[r].pid}});
  return out;
}

Topology::~Topology() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // Collective: not while an error unwinds this rank alone (main then aborts the job).
  if (finalized || std::uncaught_exceptions() > 0) return;
  for (MPI_Comm* c : {&unit_comm, &sync_comm, &leaders_comm})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

}  // namespace ddiloco
