// main() for GoogleTest programs run under mpirun: every rank runs every test; rank 0 prints
// the full report, the other ranks print only their failures (each line tagged with the rank).
// Exit status: 1 if any rank failed a test; else kSkipExitCode if any rank skipped one (a GPU
// program on a machine without a device), so that ctest (SKIP_RETURN_CODE,
// tests/CMakeLists.txt) reports a program that checked less than it says as skipped, never as
// passed; else 0.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

namespace ddiloco::test {

inline constexpr int kSkipExitCode = 77;

/// The failures of a rank other than 0, which has no result printer of its own.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 r.file_name() != nullptr ? r.file_name() : "(unknown file)", r.line_number(),
                 r.message());
  }
  void OnTestEnd(const ::testing::TestInfo& t) override {
    if (t.result()->Failed())
      std::fprintf(stderr, "[rank %d] [  FAILED  ] %s.%s\n", rank_, t.test_suite_name(), t.name());
  }

 private:
  int rank_;
};

}  // namespace ddiloco::test

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new ddiloco::test::RankFailurePrinter(rank));
  }
  const int rc = RUN_ALL_TESTS();
  int outcome[2] = {rc != 0 ? 1 : 0, ::testing::UnitTest::GetInstance()->skipped_test_count() > 0 ? 1 : 0};
  MPI_Allreduce(MPI_IN_PLACE, outcome, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  if (outcome[0] != 0) return 1;
  return outcome[1] != 0 ? ddiloco::test::kSkipExitCode : 0;
}
