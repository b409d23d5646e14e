// ranks: 3
// ddp's ring all-reduce over emulated WAN links (wan.hpp): the sum is right (exact in fp32 on
// integer-valued data, within bf16 rounding otherwise), identical on every leader, the byte
// counters are what a ring moves (2·(M−1) messages of 1/M of the data per leader), and the
// links' bandwidth and latency show in its duration.
#include <chrono>
#include <algorithm>
#include <cmath>

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

TEST(WanRing, BandwidthAndLatencyShowInItsDuration) {
  const int M = mpi::size(MPI_COMM_WORLD), rank = mpi::rank(MPI_COMM_WORLD);
  Config c = ring_config("fp32");
  c.wan.bandwidth_mbit_s = 8;  // 1 MB/s
  c.wan.latency_ms = 20;
  c.wan.burst_kb = 0;
  const size_t n = 30'000;  // 120 kB: 40 kB chunks, 40 ms each on the wire
  wan::WanRing ring(MPI_COMM_WORLD, c);
  std::vector<float> x = data_of(rank, n, true);
  mpi::barrier_patient(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  ring.allreduce_sum(x);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // 2·(M−1) dependent steps, each at least a chunk's time on the wire plus two latencies.
  const double floor = 2 * (M - 1) * (0.040 + 2 * 0.020);
  EXPECT_GE(took, floor * 0.95);
  EXPECT_LT(took, floor + 2.0);  // generous: a loaded machine
  EXPECT_GE(ring.wait_s(), floor * 0.9);
  // A degraded link (chaos: a quarter of the bandwidth left) takes four times as long on the wire.
  ring.set_rate_factor([] { return 0.25; });
  mpi::barrier_patient(MPI_COMM_WORLD);
  const auto t1 = std::chrono::steady_clock::now();
  ring.allreduce_sum(x);
  const double degraded = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  EXPECT_GE(degraded, 2 * (M - 1) * (4 * 0.040 + 2 * 0.020) * 0.95);
}

}  // namespace
}  // namespace ddiloco
