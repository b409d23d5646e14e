#include "ddiloco/mpi.hpp"

#include <algorithm>
#include <climits>
#include <cstdlib>

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
  int provided = 0;
  check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "Init_thread");
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

namespace {
template <typename T>
void allreduce_chunks(std::span<T> data, MPI_Datatype type, MPI_Comm comm) {
  constexpr size_t kMaxCount = size_t{1} << 30;
  for (size_t off = 0; off < data.size(); off += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, data.size() - off));
    check(MPI_Allreduce(MPI_IN_PLACE, data.data() + off, n, type, MPI_SUM, comm), "Allreduce");
  }
}
}  // namespace

void allreduce_sum(std::span<float> data, MPI_Comm comm) {
  allreduce_chunks(data, MPI_FLOAT, comm);
}
void allreduce_sum(std::span<double> data, MPI_Comm comm) {
  allreduce_chunks(data, MPI_DOUBLE, comm);
}

double allreduce_sum(double value, MPI_Comm comm) {
  check(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM, comm), "Allreduce");
  return value;
}

double allreduce_max(double value, MPI_Comm comm) {
  check(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_MAX, comm), "Allreduce");
  return value;
}

void broadcast(std::span<float> data, int root, MPI_Comm comm) {
  constexpr size_t kMaxCount = size_t{1} << 30;
  for (size_t off = 0; off < data.size(); off += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, data.size() - off));
    check(MPI_Bcast(data.data() + off, n, MPI_FLOAT, root, comm), "Bcast");
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
