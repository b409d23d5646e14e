// ranks: 3
// ddp's ring all-reduce over emulated WAN links (wan.hpp): the sum is right (exact in fp32 on
// integer-valued data, within bf16 rounding otherwise), identical on every leader, the byte
// counters are what a ring moves (2·(M−1) messages of 1/M of the data per leader), and the
// links' bandwidth and latency set its duration: at least what its messages need, at most 1.5
// times it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "ddiloco/config.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/wan.hpp"
#include "ddiloco/wire_format.hpp"
#include "mpi_test_main.hpp"

namespace ddiloco {
namespace {

Config ring_config(const std::string& format) {
  Config c;
  c.mode = Mode::ddp;
  c.units.count = mpi::size(MPI_COMM_WORLD);
  c.wan.format = format;
  return c;
}

std::vector<float> data_of(int rank, size_t n, bool integers) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i)
    x[i] = integers ? static_cast<float>((i * 7 + rank * 13) % 101) - 50.0f
                    : std::sin(0.001f * static_cast<float>(i) * (rank + 1)) * 3.0f;
  return x;
}

TEST(WanRing, Fp32SumIsExactAndCountersAreARing) {
  const int M = mpi::size(MPI_COMM_WORLD), rank = mpi::rank(MPI_COMM_WORLD);
  const size_t n = 10'001;  // not a multiple of M
  wan::WanRing ring(MPI_COMM_WORLD, ring_config("fp32"));
  std::vector<float> x = data_of(rank, n, true);
  ring.allreduce_sum(x);
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    float want = 0;
    for (int r = 0; r < M; ++r) want += data_of(r, n, true)[i];
    wrong += x[i] != want;
  }
  EXPECT_EQ(wrong, 0u);
  // Reduce-scatter sends chunks rank, rank−1, ...; all-gather chunks rank+1, rank, ...: 2·(M−1)
  // messages whose sizes add up to (M−1)/M of the data each way, up to the chunks' rounding.
  EXPECT_EQ(ring.link().up.messages(), static_cast<uint64_t>(2 * (M - 1)));
  EXPECT_EQ(ring.link().down.messages(), static_cast<uint64_t>(2 * (M - 1)));
  auto chunk = [&](int c) {
    const int k = ((c % M) + M) % M;
    return n * static_cast<size_t>(k + 1) / M - n * static_cast<size_t>(k) / M;
  };
  size_t up = 0, down = 0;
  for (int s = 0; s < M - 1; ++s) {
    up += chunk(rank - s) + chunk(rank + 1 - s);
    down += chunk(rank - s - 1) + chunk(rank - s);
  }
  EXPECT_EQ(ring.link().up.bytes(), up * 4);
  EXPECT_EQ(ring.link().down.bytes(), down * 4);
}

TEST(WanRing, Bf16SumIsCloseAndIdenticalEverywhere) {
  const int M = mpi::size(MPI_COMM_WORLD), rank = mpi::rank(MPI_COMM_WORLD);
  const size_t n = 4095;  // a multiple of M = 3
  wan::WanRing ring(MPI_COMM_WORLD, ring_config("bf16"));
  std::vector<float> x = data_of(rank, n, false);
  ring.allreduce_sum(x);
  // Each of the M−1 partial sums and the result are rounded to bf16 (relative 2⁻⁹ each).
  // (No ASSERT between collectives: a rank that left early would hang the others.)
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    float want = 0;
    for (int r = 0; r < M; ++r) want += data_of(r, n, false)[i];
    worst = std::max(worst, std::abs(static_cast<double>(x[i]) - want));
  }
  EXPECT_LE(worst, M * 3.0 * 3.0 / 256.0);
  std::vector<float> first(x);
  mpi::broadcast(first, 0, MPI_COMM_WORLD);
  EXPECT_EQ(x, first) << "leaders must end with identical gradients";
  EXPECT_EQ(ring.link().up.bytes(), 2 * (M - 1) * (n / M) * 2);  // n divisible by M: bf16, 2 bytes
  // A non-finite value goes raw (fp32) when every leader asks for it.
  std::vector<float> bad(n, 1.0f);
  if (rank == 1) bad[5] = std::nanf("");
  ring.allreduce_sum(bad, /*raw=*/true);
  EXPECT_TRUE(std::isnan(bad[5]));
}

// An all-reduce on `ring` over `n` values, in units of its floor: 2·(M−1) dependent steps, each
// a chunk's time on the wire (`wire_s`) plus two latencies (the sender's up direction, then
// ours down).
double in_floors(wan::WanRing& ring, size_t n, double wire_s, double latency_s) {
  const int M = mpi::size(MPI_COMM_WORLD);
  std::vector<float> x = data_of(mpi::rank(MPI_COMM_WORLD), n, true);
  mpi::barrier_patient(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  ring.allreduce_sum(x);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return took / (2 * (M - 1) * (wire_s + 2 * latency_s));
}

// Each duration is at least its floor and at most 1.5 times it. One ring is mostly latency
// (100 ms against 20 ms on the wire: doubled latency takes 1.9 floors), one mostly bandwidth
// (100 ms on the wire against 5 ms: half the bandwidth takes 1.9 floors, and the degraded link
// of a quarter of it, ignored, 0.27). 0.5 floors of slack (at least 0.2 s) for a loaded machine.
TEST(WanRing, BandwidthAndLatencyShowInItsDuration) {
  Config c = ring_config("fp32");
  c.wan.bandwidth_mbit_s = 8;  // 1 MB/s
  c.wan.burst_kb = 0;
  c.wan.latency_ms = 100;
  wan::WanRing slow(MPI_COMM_WORLD, c);
  const double latency_bound = in_floors(slow, 15'000, 0.020, 0.100);  // 20 kB chunks
  EXPECT_GE(slow.wait_s(), 0.9 * 4 * (0.020 + 2 * 0.100));
  c.wan.latency_ms = 5;
  wan::WanRing thin(MPI_COMM_WORLD, c);
  const double bandwidth_bound = in_floors(thin, 75'000, 0.100, 0.005);  // 100 kB chunks
  // A degraded link (chaos: a quarter of the bandwidth left) takes four times as long on the
  // wire. (A fresh ring: a bucket still repaying a message sent at the full rate would repay it
  // at the degraded one, an approximation of the chaos model.)
  wan::WanRing degraded_ring(MPI_COMM_WORLD, c);
  degraded_ring.set_rate_factor([] { return 0.25; });
  const double degraded = in_floors(degraded_ring, 75'000, 0.400, 0.005);
  for (double f : {latency_bound, bandwidth_bound, degraded}) {
    EXPECT_GE(f, 0.95);
    EXPECT_LE(f, 1.5);
  }
  std::printf("rank %d: ring all-reduce in floors: latency-bound %.2f, bandwidth-bound %.2f, "
              "degraded %.2f\n", mpi::rank(MPI_COMM_WORLD), latency_bound, bandwidth_bound, degraded);
}

}  // namespace
}  // namespace ddiloco
