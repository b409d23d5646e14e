// ranks: 2
// The window protocol in a lossy wire format (int4, blocks of 16): rank 0 is the syncer, rank 1
// the leader of unit 0. Deliveries are differences against the unit's reference, whose
// rounding never accumulates; snapshots carry error feedback, so that their sum loses only
// one rounding; a snapshot against a reference the syncer does not hold is refused; non-finite
// values travel raw. (EXPECT, never ASSERT, between barriers: a rank that left a test early
// would leave the other waiting.)
#include <algorithm>
#include <cmath>

#include "ddiloco/fragments.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/rng.hpp"
#include "ddiloco/mpi_memory.hpp"
#include "ddiloco/sync_window.hpp"
#include "mpi_test_main.hpp"

namespace ddiloco {
namespace {

constexpr size_t kBlock = 16;

struct Fixture {
  ParameterLayout layout = ParameterLayout::gpt2(GptConfig{16, 4, 1, 2, 8});
  protocol::FragmentPlan plan{layout, 1, 4};
  protocol::WindowLayout windows{plan, {.format = wire::Format::int4, .block = kBlock}};
  size_t n = windows.numel(0);
  bool syncer = mpi::rank(MPI_COMM_WORLD) == 0;
};

std::vector<float> randn(size_t n, uint64_t seed, float scale) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * static_cast<float>(rng.normal());
  return v;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// Θ_v = Θ₀ + Σ_{k ≤ v} d_k with steps d_k of size 0.01: int4 rounds a difference of absmax a
// to within a/14 per value.
std::vector<float> theta_at(int v, size_t n) {
  std::vector<float> t = randn(n, 1, 1.0f);
  for (int k = 1; k <= v; ++k) {
    const std::vector<float> d = randn(n, 100 + k, 0.01f);
    for (size_t i = 0; i < n; ++i) t[i] += d[i];
  }
  return t;
}

TEST(WireWindow, DeliveredRoundingNeverAccumulates) {
  Fixture f;
  constexpr int kVersions = 12;
  if (f.syncer) {
    comm::MpiRemoteMemory memory(MPI_COMM_WORLD, 1);
    protocol::SyncerWindow win(memory, f.windows);
    win.set_reference(0, 0, 0, theta_at(0, f.n));
    std::vector<protocol::UnitHeaders> h;
    for (int v = 1; v <= kVersions; ++v) {
      EXPECT_EQ(win.delivery_bytes(0, 0), f.windows.wire_bytes(0));
      EXPECT_EQ(win.deliver(0, 0, v, theta_at(v, f.n)), f.windows.wire_bytes(0));
      MPI_Barrier(MPI_COMM_WORLD);  // delivered
      MPI_Barrier(MPI_COMM_WORLD);  // taken
      win.poll(h);
      EXPECT_EQ(h[0].header(0, protocol::kInAck), v);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    win.close();
  } else {
    comm::MpiExposedMemory memory(MPI_COMM_WORLD, f.windows.bytes());
    protocol::LearnerWindow win(memory, f.windows);
    win.set_reference(0, 0, theta_at(0, f.n));
    std::vector<float> got(f.n);
    double worst = 0;
    for (int v = 1; v <= kVersions; ++v) {
      MPI_Barrier(MPI_COMM_WORLD);
      EXPECT_EQ(win.inbox_version(0), v);
      EXPECT_TRUE(win.take_inbox(0, got));
      EXPECT_EQ(win.reference_version(0), v);
      worst = std::max(worst, max_abs_diff(got, theta_at(v, f.n)));
      MPI_Barrier(MPI_COMM_WORLD);
    }
    // Each delivery's difference is one step (≈ 0.01, absmax ≈ 0.04 over a block) plus the
    // previous rounding: the error stays at one rounding, ≈ 0.04/14, however many versions.
    EXPECT_LT(worst, 0.006) << "rounding accumulated over deliveries";
    EXPECT_GT(worst, 0.0) << "int4 should round";
    MPI_Barrier(MPI_COMM_WORLD);
    win.close();
  }
}

TEST(WireWindow, SnapshotsCarryErrorFeedbackAndNameTheirReference) {
  Fixture f;
  constexpr int kSnapshots = 10;
  const std::vector<float> ref = theta_at(0, f.n);
  if (f.syncer) {
    comm::MpiRemoteMemory memory(MPI_COMM_WORLD, 1);
    protocol::SyncerWindow win(memory, f.windows);
    win.set_reference(0, 0, 0, ref);
    std::vector<protocol::UnitHeaders> h;
    std::vector<float> got(f.n), sum_sent(f.n, 0.0f), sum_got(f.n, 0.0f);
    double worst_single = 0;
    for (int k = 1; k <= kSnapshots; ++k) {
      MPI_Barrier(MPI_COMM_WORLD);  // published
      win.poll(h);
      EXPECT_EQ(h[0].header(0, protocol::kOutRef), 0);
      const auto fetched = win.fetch(0, 0, h[0], got);
      EXPECT_EQ(fetched.problem, "");
      EXPECT_EQ(fetched.wire_bytes, f.windows.wire_bytes(0));
      win.ack(0, 0, fetched.seq_after);
      const std::vector<float> theta = randn(f.n, 500 + k, 0.01f);  // what the learner meant: R + this
      for (size_t i = 0; i < f.n; ++i) {
        sum_sent[i] += theta[i];
        sum_got[i] += got[i] - ref[i];
        worst_single = std::max(worst_single, std::abs(static_cast<double>(got[i]) - ref[i] - theta[i]));
      }
      MPI_Barrier(MPI_COMM_WORLD);  // acknowledged
    }
    // Σ (θ̂_k − R) = Σ d_k − E_K: with error feedback the sum is off by the last residual only
    // (one rounding, ≤ absmax/14 ≈ 0.003 here), not by k of them.
    EXPECT_LT(max_abs_diff(sum_got, sum_sent), 0.004);
    EXPECT_GT(worst_single, 0.0) << "int4 should round";
    // The learner now names a reference version the syncer never held.
    MPI_Barrier(MPI_COMM_WORLD);
    win.poll(h);
    auto fetched = win.fetch(0, 0, h[0], got);
    EXPECT_NE(fetched.problem.find("reference version 7 is not held"), std::string::npos) << fetched.problem;
    win.ack(0, 0, fetched.seq_after);
    MPI_Barrier(MPI_COMM_WORLD);
    // Non-finite values go raw, for the syncer to refuse.
    MPI_Barrier(MPI_COMM_WORLD);
    win.poll(h);
    fetched = win.fetch(0, 0, h[0], got);
    EXPECT_EQ(h[0].header(0, protocol::kOutRef), -1);
    EXPECT_EQ(fetched.wire_bytes, f.n * sizeof(float));
    EXPECT_TRUE(std::isnan(got[3]));
    MPI_Barrier(MPI_COMM_WORLD);
    win.close();
  } else {
    comm::MpiExposedMemory memory(MPI_COMM_WORLD, f.windows.bytes());
    protocol::LearnerWindow win(memory, f.windows);
    win.set_reference(0, 0, ref);
    std::vector<float> theta(f.n);
    for (int k = 1; k <= kSnapshots; ++k) {
      const std::vector<float> d = randn(f.n, 500 + k, 0.01f);
      for (size_t i = 0; i < f.n; ++i) theta[i] = ref[i] + d[i];
      win.publish(0, theta, {k, k, k, 0});
      MPI_Barrier(MPI_COMM_WORLD);
      MPI_Barrier(MPI_COMM_WORLD);
    }
    win.set_reference(0, 7, ref);
    win.publish(0, theta, {1, 1, 1, 0});
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    theta[3] = std::nanf("");
    win.publish(0, theta, {1, 1, 1, 0});
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    win.close();
  }
}

}  // namespace
}  // namespace ddiloco
