// Results do not depend on the number of OpenMP threads: the ranks of a unit may run with
// different run.threads (the e2e identity test compares a 2-thread single run with a 1-thread
// MPI learner) and must stay bit-identical. An OpenMP reduction sums in an order that follows
// the threads, so sums that feed results use a fixed order instead.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <vector>

#include "ddiloco/fpu.hpp"
#include "ddiloco/layers.hpp"
#include "ddiloco/rng.hpp"

namespace ddiloco {
namespace {

// Sets the OpenMP team size (and FTZ/DAZ on its threads, as configure_threads does) for the
// duration of a scope, restoring the previous setting after.
class Threads {
 public:
  explicit Threads(int n) : saved_(omp_get_max_threads()) {
    omp_set_num_threads(n);
    flush_denormals_to_zero();
    int team = 0;
#pragma omp parallel
    {
      if (omp_get_thread_num() == 0) team = omp_get_num_threads();
    }
    EXPECT_EQ(team, n) << "the OpenMP runtime did not give the requested threads";
  }
  ~Threads() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The mean loss is a sum over rows: it must not follow the threads' partition (in
// double, where a different order of the sum shows in the result).
TEST(Threads, CrossEntropyLossIsBitIdenticalForAnyThreadCount) {
  const int N = 1001, V = 37;
  auto run = [&](int threads) {
    Threads scope(threads);
    Rng rng(9);
    std::vector<double> logits(static_cast<size_t>(N) * V), losses(N);
    std::vector<int32_t> targets(N);
    for (auto& x : logits) x = 3 * rng.normal();
    for (auto& t : targets) t = static_cast<int32_t>(rng.below(V));
    return layers::softmax_crossentropy_forward(logits.data(), losses.data(), targets.data(), N, V);
  };
  const double one = run(1);
  for (int threads : {2, 3}) {
    const double many = run(threads);
    EXPECT_EQ(std::memcmp(&one, &many, sizeof one), 0)
        << threads << " threads: " << one << " vs " << many;
  }
}

}  // namespace
}  // namespace ddiloco
