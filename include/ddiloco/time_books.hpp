// The time books of a one-job run's ranks, gathered at the syncer for the goodput report
// (goodput.hpp): the one message of the protocol that travels over MPI collectives, not the
// windows.
#pragma once

#include <mpi.h>

#include <vector>

#include "ddiloco/goodput.hpp"

namespace ddiloco::protocol {

/// Gathers every rank's book at rank 0 of `comm` (collective; waiting ranks sleep). Returns
/// them in rank order at the root, nothing elsewhere.
std::vector<TimeBook> gather_time_books(const TimeBook& mine, MPI_Comm comm);

}  // namespace ddiloco::protocol
