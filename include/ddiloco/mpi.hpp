// Thin helpers over MPI's C API: error checking, sizes, and the collectives training uses.
#pragma once

#include <mpi.h>

#include <span>
#include <string>

namespace ddiloco::mpi {

/// Throws Error("MPI <what> failed: <MPI error string>") when rc != MPI_SUCCESS.
void check(int rc, const char* what);

/// MPI_Init_thread(MPI_THREAD_MULTIPLE) on construction, MPI_Finalize on destruction. Errors
/// on MPI_COMM_WORLD are returned rather than fatal so that they surface as exceptions.
class Session {
 public:
  Session(int* argc, char*** argv);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
};

int rank(MPI_Comm comm);
int size(MPI_Comm comm);
/// Ranks of `comm` that share this rank's node (MPI_COMM_TYPE_SHARED).
int ranks_on_node(MPI_Comm comm);

/// In-place sum over comm. Large buffers are reduced in chunks of at most 2^30 elements (MPI
/// counts are int).
void allreduce_sum(std::span<float> data, MPI_Comm comm);
void allreduce_sum(std::span<double> data, MPI_Comm comm);
double allreduce_sum(double value, MPI_Comm comm);
double allreduce_max(double value, MPI_Comm comm);
void broadcast(std::span<float> data, int root, MPI_Comm comm);

/// Aborts every rank of MPI_COMM_WORLD (after the caller printed why): an error seen by one
/// rank of a collective job would otherwise leave the others waiting forever.
[[noreturn]] void abort_world(int code);

}  // namespace ddiloco::mpi
