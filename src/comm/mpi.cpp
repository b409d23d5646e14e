#include "ddiloco/mpi.hpp"

#include <algorithm>
#include <climits>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "ddiloco/error.hpp"

namespace ddiloco::mpi {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail("MPI {} failed: {}", what, std::string(text, len));
}

Session::Session(int* argc, char*** argv) {
  // Only each rank's main thread calls MPI (the syncer's evaluation thread does not).
  int provided = 0;
  check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "Init_thread");
  if (provided < MPI_THREAD_FUNNELED)
    fail("this MPI library provides thread level {}, ddiloco needs MPI_THREAD_FUNNELED", provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

Session::~Session() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

int rank(MPI_Comm comm) {
  int r = 0;
  check(MPI_Comm_rank(comm, &r), "Comm_rank");
  return r;
}

int size(MPI_Comm comm) {
  int s = 0;
  check(MPI_Comm_size(comm, &s), "Comm_size");
  return s;
}

int ranks_on_node(MPI_Comm comm) {
  MPI_Comm node;
  check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
        "Comm_split_type");
  const int n = size(node);
  MPI_Comm_free(&node);
  return n;
}


double allreduce_sum(double value, MPI_Comm comm) {
  check(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM, comm), "Allreduce");
  return value;
}

double allreduce_max(double value, MPI_Comm comm) {
  check(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_MAX, comm), "Allreduce");
  return value;
}

namespace {
constexpr size_t kMaxCount = size_t{1} << 30;  // MPI counts are int

template <typename Fn>
void in_chunks(size_t n, Fn&& fn) {
  for (size_t off = 0; off < n; off += kMaxCount) fn(off, static_cast<int>(std::min(kMaxCount, n - off)));
}
}  // namespace

void allreduce_sum(std::span<float> data, MPI_Comm comm) {
  in_chunks(data.size(), [&](size_t off, int n) {
    check(MPI_Allreduce(MPI_IN_PLACE, data.data() + off, n, MPI_FLOAT, MPI_SUM, comm),
          "Allreduce");
  });
}

void allreduce_sum(std::span<double> data, MPI_Comm comm) {
  in_chunks(data.size(), [&](size_t off, int n) {
    check(MPI_Allreduce(MPI_IN_PLACE, data.data() + off, n, MPI_DOUBLE, MPI_SUM, comm),
          "Allreduce");
  });
}

void broadcast(std::span<float> data, int root, MPI_Comm comm) {
  in_chunks(data.size(), [&](size_t off, int n) {
    check(MPI_Bcast(data.data() + off, n, MPI_FLOAT, root, comm), "Bcast");
  });
}

std::string broadcast(const std::string& text, int root, MPI_Comm comm) {
  int64_t n = static_cast<int64_t>(text.size());
  check(MPI_Bcast(&n, 1, MPI_INT64_T, root, comm), "Bcast(size)");
  std::string out = text;
  out.resize(static_cast<size_t>(n));
  if (n > 0) check(MPI_Bcast(out.data(), static_cast<int>(n), MPI_CHAR, root, comm), "Bcast(text)");
  return out;
}

void broadcast(std::span<int64_t> data, int root, MPI_Comm comm) {
  in_chunks(data.size(), [&](size_t off, int n) {
    check(MPI_Bcast(data.data() + off, n, MPI_INT64_T, root, comm), "Bcast");
  });
}

void reduce_sum(std::span<float> data, int root, MPI_Comm comm) {
  const bool is_root = rank(comm) == root;
  in_chunks(data.size(), [&](size_t off, int n) {
    check(MPI_Reduce(is_root ? MPI_IN_PLACE : data.data() + off, data.data() + off, n, MPI_FLOAT,
                     MPI_SUM, root, comm),
          "Reduce");
  });
}

void allreduce_sum_patient(std::span<float> data, MPI_Comm comm) {
  in_chunks(data.size(), [&](size_t off, int n) {
    MPI_Request request;
    check(MPI_Iallreduce(MPI_IN_PLACE, data.data() + off, n, MPI_FLOAT, MPI_SUM, comm, &request),
          "Iallreduce");
    wait(request);
  });
}

double allreduce_sum_patient(double value, MPI_Comm comm) {
  MPI_Request request;
  check(MPI_Iallreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM, comm, &request),
        "Iallreduce");
  wait(request);
  return value;
}

void allreduce_sum_patient(std::span<double> data, MPI_Comm comm) {
  MPI_Request request;
  check(MPI_Iallreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()), MPI_DOUBLE, MPI_SUM,
                       comm, &request),
        "Iallreduce");
  wait(request);
}

void broadcast_patient(std::span<int64_t> data, int root, MPI_Comm comm) {
  MPI_Request request;
  check(MPI_Ibcast(data.data(), static_cast<int>(data.size()), MPI_INT64_T, root, comm, &request),
        "Ibcast");
  wait(request);
}

void barrier_patient(MPI_Comm comm) {
  MPI_Request request;
  check(MPI_Ibarrier(comm, &request), "Ibarrier");
  wait(request);
}

void Backoff::idle() {
  if (spins_ < 8) {
    ++spins_;
    return;
  }
  std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
  sleep_us_ = std::min(max_us_, sleep_us_ * 2);
}

void wait(MPI_Request& request, int max_sleep_us) {
  Backoff backoff(max_sleep_us);
  for (;;) {
    int done = 0;
    check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "Test");
    if (done) return;
    backoff.idle();
  }
}

void abort_world(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

}  // namespace ddiloco::mpi
