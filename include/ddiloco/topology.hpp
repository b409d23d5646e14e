// Process layout of a multi-unit job (docs/architecture.md, "One job, three kinds of rank"):
// world rank 0 is the syncer; ranks 1.. form the learner units in order, unit u taking
// units.ranks[u] consecutive ranks. Each unit's local rank 0 is its leader, the only rank that
// talks to the syncer.
#pragma once

#include <mpi.h>

#include <nlohmann/json.hpp>

#include "ddiloco/config.hpp"

namespace ddiloco {

class Topology {
 public:
  enum class Role { syncer, learner };

  /// The one-job deployment. Collective over `world`. Throws Error when the world size is not
  /// what the configuration needs (1 syncer + Σ units.ranks).
  Topology(const Config& config, MPI_Comm world);
  /// The isolated deployment (docs/deployments.md "Fault isolation"): `world` is one process's or one
  /// unit job's own MPI world. unit < 0: the syncer, alone in `world`; otherwise the ranks of
  /// unit `unit` (as many as units.ranks[unit]), on the data streams they would have in the
  /// one-job layout. No sync or leaders communicator: the link to the syncer is the UCX
  /// transport. Collective over `world`; throws Error naming the mismatch.
  Topology(const Config& config, MPI_Comm world, int unit);
  ~Topology();
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  Role role = Role::learner;
  int world_rank = 0;
  int units = 0;                        ///< M
  int unit = -1;                        ///< learner: its unit
  int unit_rank = -1;                   ///< learner: rank within the unit
  int unit_size = 0;                    ///< learner: ranks of its unit
  bool leader = false;                  ///< learner: unit_rank == 0
  MPI_Comm unit_comm = MPI_COMM_NULL;   ///< learner: the ranks of its unit
  MPI_Comm sync_comm = MPI_COMM_NULL;   ///< syncer and leaders: rank 0 syncer, rank u+1 leader u
  MPI_Comm leaders_comm = MPI_COMM_NULL;  ///< leaders only, rank u = leader of unit u (ddp)
  MPI_Comm world = MPI_COMM_NULL;       ///< every rank (not owned)
  bool isolated = false;                ///< the isolated deployment (no sync_comm)
  int stream_index = 0;                 ///< learner: its data stream (world rank − 1)
  int stream_count = 0;                 ///< all learner ranks

  /// Learner, collective over unit_comm: every rank of the unit as [{"rank", "host", "pid"}]
  /// (at the leader; empty elsewhere).
  nlohmann::json unit_processes() const;
};

}  // namespace ddiloco
