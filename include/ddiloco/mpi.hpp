// Thin helpers over MPI's C API: error checking, sizes, and the collectives training uses.
#pragma once

#include <mpi.h>

#include <algorithm>

#include <climits>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <type_traits>

#include "ddiloco/error.hpp"

namespace ddiloco::mpi {

/// Throws Error("MPI <what> failed: <MPI error string>") when rc != MPI_SUCCESS.
void check(int rc, const char* what);

/// MPI_Init_thread(MPI_THREAD_FUNNELED) on construction, MPI_Finalize on destruction. Errors
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
void broadcast(std::span<int64_t> data, int root, MPI_Comm comm);
/// `text` of rank `root`, on every rank.
std::string broadcast(const std::string& text, int root, MPI_Comm comm);
/// Sum to `root` (in place on the root; other ranks' buffers are inputs only).
void reduce_sum(std::span<float> data, int root, MPI_Comm comm);
/// In-place sum over comm that waits with Backoff instead of spinning (MPI_Iallreduce +
/// wait): for reductions where a peer may be much later than this rank.
void allreduce_sum_patient(std::span<float> data, MPI_Comm comm);
double allreduce_sum_patient(double value, MPI_Comm comm);
void allreduce_sum_patient(std::span<double> data, MPI_Comm comm);
/// MPI_Ibcast + wait(): a broadcast whose non-root ranks sleep while the root is busy.
void broadcast_patient(std::span<int64_t> data, int root, MPI_Comm comm);
/// MPI_Ibarrier + wait().
void barrier_patient(MPI_Comm comm);

/// Sleeps with exponential back-off between polls, so that a waiting rank leaves its core to
/// the others (runs here put more ranks than cores on a node): the first few polls are
/// immediate, then sleeps double from 20 µs up to max_us.
class Backoff {
 public:
  explicit Backoff(int max_us = 1000) : max_us_(max_us) {}
  /// Call when a poll found nothing; sleeps for the current interval.
  void idle();
  /// Call when a poll found work.
  void reset() { spins_ = 0; sleep_us_ = 20; }
  /// The longest sleep from now on, microseconds (≥ 1).
  void set_max_us(int max_us) { max_us_ = std::max(1, max_us); sleep_us_ = std::min(sleep_us_, max_us_); }

 private:
  int max_us_;
  int spins_ = 0;
  int sleep_us_ = 20;
};

/// MPI_Wait without spinning a core: MPI_Test with Backoff between tests.
void wait(MPI_Request& request, int max_sleep_us = 200);

/// Thrown by agree() on every rank of a failed set-up; what() is the error on the one rank
/// that reports it and empty on the others.
class SetupFailed : public Error {
 public:
  using Error::Error;
};

/// Runs `setup` on every rank of `comm` and agrees on the outcome. When any rank throws Error,
/// the lowest such rank throws SetupFailed with its message and the others SetupFailed with an
/// empty one: exactly one rank reports, and since nobody is left inside a collective every
/// rank can finish MPI and exit cleanly. Returns setup()'s result otherwise.
template <typename F>
auto agree(MPI_Comm comm, F&& setup) -> decltype(setup()) {
  using R = decltype(setup());
  std::string error;
  std::conditional_t<std::is_void_v<R>, int, std::optional<R>> result{};
  try {
    if constexpr (std::is_void_v<R>)
      setup();
    else
      result.emplace(setup());
  } catch (const Error& e) {
    error = e.what();
    if (error.empty()) error = "set-up failed";
  } catch (const std::bad_alloc&) {
    error = "out of memory during set-up: lower train.batch_size, model.seq_len or the model size";
  }
  int me = 0, first = INT_MAX;
  MPI_Comm_rank(comm, &me);
  first = error.empty() ? INT_MAX : me;
  check(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm), "Allreduce(agree)");
  if (first != INT_MAX) throw SetupFailed(first == me ? error : std::string());
  if constexpr (!std::is_void_v<R>) return std::move(*result);
}

/// Aborts every rank of MPI_COMM_WORLD (after the caller printed why): an error seen by one
/// rank of a collective job would otherwise leave the others waiting forever.
[[noreturn]] void abort_world(int code);

}  // namespace ddiloco::mpi
