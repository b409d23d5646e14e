// ranks: 3
// ZeRO stage 1 inside a unit (units.zero = 1, zero.hpp) against the whole state on every rank
// (units.zero = 0), over 20 inner steps with clipping active and weight decay: on 2 ranks
// (ranks 0 and 1 of the world) bit-identical parameters and AdamW state; on 3 ranks equal to
// fp32 rounding (the MPI library may add each element's three terms in another order), and
// the test prints whether they came out bit-identical too. Each rank holds 1/R of the state;
// the whole state gathered and set again continues the run exactly (a checkpoint's round trip).
#include <cmath>
#include <cstdio>
#include <cstring>

#include "ddiloco/config.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/rng.hpp"
#include "ddiloco/trainer.hpp"
#include "ddiloco/zero.hpp"
#include "mpi_test_main.hpp"

namespace ddiloco {
namespace {

constexpr int kB = 2, kT = 16;

Config tiny_config(int zero) {
  Config c;
  c.model = GptConfig{64, 16, 2, 2, 32};  // 17 K parameters: several norm blocks per shard
  c.train.batch_size = kB;
  c.train.steps = 20;
  c.train.warmup_steps = 2;
  c.train.lr = 3e-3;
  c.train.grad_clip = 0.5;  // below the norms of these random batches: every step clips
  c.train.weight_decay = 0.1;
  c.units.zero = zero;
  return c;
}

std::vector<int32_t> tokens(uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(kB) * kT);
  for (auto& x : t) x = static_cast<int32_t>(rng.below(64));
  return t;
}

// One step of every trainer on this rank's batch of `step`; their losses and gradient norms.
std::vector<StepStats> step_all(std::initializer_list<UnitTrainer*> trainers, MPI_Comm comm, int step) {
  const int rank = mpi::rank(comm);
  const auto in = tokens(1000 * step + rank), tgt = tokens(1000 * step + rank + 500);
  std::vector<StepStats> out;
  for (UnitTrainer* t : trainers) out.push_back(t->step_on(in.data(), tgt.data()));
  return out;
}

size_t differing(std::span<const float> a, std::span<const float> b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

// ‖a − b‖ / ‖a‖. (Element-wise ratios say little: AdamW's update m̂/√v̂ turns a rounding
// difference in a gradient near 0 into a step of up to lr in either direction.)
double relative_l2(std::span<const float> a, std::span<const float> b) {
  double d = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    s += double(a[i]) * a[i];
  }
  return std::sqrt(d / s);
}

// zero 0 and zero 1 side by side on `comm` (R ranks).
void compare(MPI_Comm comm) {
  const int R = mpi::size(comm), rank = mpi::rank(comm);
  UnitTrainer whole(tiny_config(0), comm), sharded(tiny_config(1), comm);
  const size_t n = whole.model().parameters().size();
  // Each rank holds its shard's moments only: at most ⌈n/R⌉ rounded up to a norm block.
  const StateShard s = sharded.optimizer().shard();
  EXPECT_EQ(s, zero_shard(n, rank, R));
  EXPECT_EQ(sharded.optimizer().first_moment().size(), s.size());
  EXPECT_LE(s.size(), (n + R - 1) / R + kNormBlock);
  EXPECT_GT(s.size(), 0u) << "a shard is empty: the model is too small to test " << R << " ranks";
  EXPECT_EQ(whole.optimizer().first_moment().size(), n);

  bool clipped = false;
  double worst_loss = 0, worst_norm = 0;
  for (int step = 0; step < 20; ++step) {
    const auto st = step_all({&whole, &sharded}, comm, step);
    clipped = clipped || st[0].grad_norm > 0.5;
    worst_loss = std::max(worst_loss, std::abs(st[0].loss - st[1].loss) / st[0].loss);
    worst_norm = std::max(worst_norm, std::abs(st[0].grad_norm - st[1].grad_norm) / st[0].grad_norm);
    if (R == 2) {
      EXPECT_EQ(st[0].loss, st[1].loss) << "step " << step;
      EXPECT_EQ(st[0].grad_norm, st[1].grad_norm) << "step " << step;
    }
  }
  EXPECT_TRUE(clipped) << "clipping never acted: the test would not cover the sharded norm";
  EXPECT_LT(worst_loss, 1e-6) << "a step's loss differs between units.zero 0 and 1";
  EXPECT_LT(worst_norm, 1e-5) << "a step's gradient norm differs between units.zero 0 and 1";
  const auto p = whole.model().parameters(), q = sharded.model().parameters();
  const UnitTrainer::Moments mw = whole.gather_moments(), ms = sharded.gather_moments();
  if (R == 2) {
    EXPECT_EQ(differing(p, q), 0u) << "2 ranks: parameters not bit-identical";
    if (rank == 0) {
      EXPECT_EQ(differing(mw.m, ms.m), 0u);
      EXPECT_EQ(differing(mw.v, ms.v), 0u);
    }
  } else {
    EXPECT_LT(relative_l2(p, q), 1e-5) << R << " ranks: parameters differ beyond fp32 rounding";
    if (rank == 0)
      std::printf("[zero] %d ranks, 20 steps: %zu of %zu parameters differ from units.zero = 0, "
                  "‖Δθ‖/‖θ‖ = %.2e; losses within %.1e, gradient norms within %.1e (relative)\n",
                  R, differing(p, q), n, relative_l2(p, q), worst_loss, worst_norm);
  }
  EXPECT_EQ(ms.step, 20);
  // Every rank holds the same θ.
  std::vector<float> root(q.begin(), q.end());
  mpi::broadcast(root, 0, comm);
  EXPECT_EQ(differing(root, q), 0u);

  // A checkpoint's round trip: the gathered state into a fresh sharded trainer goes on exactly.
  std::vector<float> m = ms.m, v = ms.v;
  m.resize(n);
  v.resize(n);
  mpi::broadcast(m, 0, comm);  // every rank reads the whole file on resume
  mpi::broadcast(v, 0, comm);
  UnitTrainer resumed(tiny_config(1), comm);
  std::copy(q.begin(), q.end(), resumed.model().parameters().begin());
  resumed.set_moments(m, v, ms.step);
  resumed.set_steps_done(sharded.steps_done());
  for (int step = 20; step < 25; ++step) step_all({&sharded, &resumed}, comm, step);
  EXPECT_EQ(differing(sharded.model().parameters(), resumed.model().parameters()), 0u);
}

// The rings in messages of 100 elements (shards of 10240 and 7552 elements: messages that end
// mid-shard, a last short one) give the one-message rings' θ bit for bit, and the gather the
// same state.
TEST(Zero, RingSegmentsDoNotChangeTheSum) {
  const Config c = tiny_config(1);
  const ParameterLayout layout = ParameterLayout::gpt2(c.model);
  const size_t n = layout.size();
  const AdamWConfig ac{c.train.beta1, c.train.beta2, c.train.eps, c.train.weight_decay};
  std::vector<float> result[2], gathered[2];
  for (size_t segment : {size_t{100}, n}) {
    ZeroStep zs(n, MPI_COMM_WORLD, segment);
    AdamW<float> opt(layout, ac, zs.shard());
    std::vector<float> params(n, 0.5f), grads(n);
    Rng rng(17 + static_cast<uint64_t>(mpi::rank(MPI_COMM_WORLD)));
    for (auto& g : grads) g = static_cast<float>(rng.normal());
    zs.step(params, grads, opt, 1e-3, 0.0);
    result[segment == n] = params;
    gathered[segment == n] = zs.gather(opt.second_moment());
  }
  EXPECT_EQ(differing(result[0], result[1]), 0u);
  EXPECT_EQ(gathered[0].size(), mpi::rank(MPI_COMM_WORLD) == 0 ? n : 0u);
  EXPECT_EQ(differing(gathered[0], gathered[1]), 0u);
}

TEST(Zero, ShardsTileTheBufferOnNormBlocks) {
  for (size_t n : {size_t{1}, size_t{1023}, size_t{1024}, size_t{7664}, size_t{100000}})
    for (int R = 1; R <= 5; ++R) {
      size_t at = 0;
      for (int r = 0; r < R; ++r) {
        const StateShard s = zero_shard(n, r, R);
        EXPECT_EQ(s.lo, at) << n << " " << R << " " << r;
        EXPECT_TRUE(s.lo % kNormBlock == 0 || s.lo == n);
        at = s.hi;
      }
      EXPECT_EQ(at, n);
    }
}

TEST(Zero, TwoRanksAreBitIdenticalToTheWholeState) {
  MPI_Comm two = MPI_COMM_NULL;
  const int rank = mpi::rank(MPI_COMM_WORLD);
  mpi::check(MPI_Comm_split(MPI_COMM_WORLD, rank < 2 ? 0 : MPI_UNDEFINED, rank, &two), "Comm_split");
  if (two != MPI_COMM_NULL) {
    compare(two);
    MPI_Comm_free(&two);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(Zero, ThreeRanksEqualTheWholeStateToRounding) {
  ASSERT_EQ(mpi::size(MPI_COMM_WORLD), 3);
  compare(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace ddiloco
