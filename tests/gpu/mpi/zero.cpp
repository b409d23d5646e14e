// ranks: 2
// ZeRO-1 on a unit's GPUs (units.zero = 1, src/gpu/gpu_unit.cpp sharded_update): a 2-rank unit
// with the AdamW state sharded against the same unit unsharded, over 20 steps of the same
// batches: the same losses and gradient norms, parameters equal to fp32 rounding (the update is
// the same; only the gradient norm's partial sums are grouped differently, kernels.hpp), both
// ranks holding identical replicas, each rank's moments 1/2 of the model's, and the gathered
// moments (what a checkpoint holds) the unsharded ones. Needs a GPU per rank (NCCL refuses two
// ranks of one communicator on one GPU): skipped on every rank with fewer than 2 devices.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "ddiloco/config.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/trainer.hpp"
#include "ddiloco/unit_backend.hpp"
#include "ddiloco/zero.hpp"
#include "gpu_test.hpp"
#include "unit_config.hpp"
#include "mpi/mpi_test_main.hpp"

namespace ddiloco {
namespace {

using gpu::test::random_tokens;

Config small_config(int zero) {
  Config c = gpu::test::small_unit_config("cuda");
  c.train.grad_clip = 0.5;  // small enough to clip: the sharded norm decides the update
  c.units.zero = zero;
  return c;
}

// Every rank agrees: at least 2 devices on this node (each rank takes its own).
bool two_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  int fewest = count;
  MPI_Allreduce(&count, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return fewest >= 2;
}

TEST(GpuZero, ShardedUnitTrainsLikeTheUnshardedOne) {
  DDILOCO_REQUIRE_GPU();
  if (!two_devices()) GTEST_SKIP() << "ZeRO-1 over NCCL needs a GPU per rank: fewer than 2 devices";
  gpu::install_cuda_unit_backend();
  const int rank = mpi::rank(MPI_COMM_WORLD);
  UnitTrainer whole(small_config(0), MPI_COMM_WORLD);
  UnitTrainer sharded(small_config(1), MPI_COMM_WORLD);
  const size_t P = whole.model().parameters().size();
  EXPECT_EQ(sharded.optimizer().first_moment().size(), zero_shard(P, rank, 2).size());
  EXPECT_LE(sharded.optimizer().first_moment().size(), P / 2 + kNormBlock);

  std::vector<float> start(P);
  whole.gpu()->download_parameters(start);
  const size_t n = 4 * 64;
  int clipped = 0;
  for (int step = 0; step < 20; ++step) {
    const uint64_t seed = 1000 * static_cast<uint64_t>(rank) + static_cast<uint64_t>(step);
    const auto in = random_tokens(n, 100 + seed), tgt = random_tokens(n, 500 + seed);
    const StepStats a = whole.step_on(in.data(), tgt.data());
    const StepStats b = sharded.step_on(in.data(), tgt.data());
    EXPECT_FLOAT_EQ(b.loss, a.loss) << "step " << step;
    EXPECT_NEAR(b.grad_norm, a.grad_norm, 1e-5 * a.grad_norm) << "step " << step;
    clipped += a.grad_norm > 0.5;
  }
  EXPECT_GT(clipped, 0) << "no step was clipped: the sharded norm was never used";
  sharded.check_replicas();  // both ranks hold the same θ (throws otherwise)
  std::vector<float> a(P), b(P);
  whole.gpu()->download_parameters(a);
  sharded.gpu()->download_parameters(b);
  double apart = 0, moved = 0;
  for (size_t i = 0; i < P; ++i) {
    apart = std::max(apart, std::abs(static_cast<double>(a[i]) - b[i]));
    moved = std::max(moved, std::abs(static_cast<double>(a[i]) - start[i]));
  }
  if (rank == 0)
    std::printf("gpu zero: max |θ_sharded − θ_whole| %.3g after 20 steps, max |Δθ| %.3g; %d steps clipped\n",
                apart, moved, clipped);
  EXPECT_GT(moved, 1e-3);
  EXPECT_LE(apart, 1e-4 * moved) << "the sharded update is not the unsharded one";

  const UnitTrainer::Moments mw = whole.gather_moments(), ms = sharded.gather_moments();
  EXPECT_EQ(ms.step, 20);
  if (rank == 0) {
    ASSERT_EQ(ms.m.size(), P);
    double dm = 0, mm = 0;
    for (size_t i = 0; i < P; ++i) {
      dm = std::max(dm, std::abs(static_cast<double>(ms.m[i]) - mw.m[i]));
      mm = std::max(mm, std::abs(static_cast<double>(mw.m[i])));
    }
    EXPECT_LE(dm, 1e-4 * mm) << "the gathered first moments are not the unsharded ones";
  }
}

}  // namespace
}  // namespace ddiloco
