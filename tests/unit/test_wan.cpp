// Emulated WAN links: the token bucket's rate and burst (on its own clock, then over a second
// of real traffic), latency and jitter, order, degraded links, and the per-unit configuration.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <thread>

#include "ddiloco/config.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/wan.hpp"

namespace ddiloco::wan {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

TEST(TokenBucket, BurstLeavesAtOnceThenTheRate) {
  TokenBucket bucket(1000.0, 500.0);  // 1000 B/s, 500 B deep
  EXPECT_DOUBLE_EQ(bucket.send(500, 0.0), 0.0);   // the burst
  EXPECT_DOUBLE_EQ(bucket.send(250, 0.0), 0.25);  // in debt: repaid at the rate
  EXPECT_DOUBLE_EQ(bucket.send(250, 0.0), 0.5);   // queued behind it
  // Idle for 10 s: the bucket refills to its depth, not beyond.
  EXPECT_DOUBLE_EQ(bucket.send(500, 10.5), 10.5);
  EXPECT_DOUBLE_EQ(bucket.send(1000, 10.5), 11.5);
}

TEST(TokenBucket, UnlimitedAndDegraded) {
  TokenBucket unlimited(0.0, 0.0);
  EXPECT_DOUBLE_EQ(unlimited.send(1e12, 3.0), 3.0);
  TokenBucket bucket(1000.0, 0.0);
  EXPECT_DOUBLE_EQ(bucket.send(100, 0.0, 0.1), 1.0);  // a tenth of the bandwidth left
}

TEST(LinkDirection, LatencyJitterOrderAndCounters) {
  LinkSpec spec;
  spec.bandwidth_bytes_per_s = 1e6;
  spec.latency_s = 0.05;
  spec.jitter_s = 0.02;
  spec.burst_bytes = 0;
  LinkDirection link(spec, 7);
  double previous = 0;
  for (int i = 0; i < 200; ++i) {
    const double start = i * 0.01;
    const Transfer t = link.transfer(1000, start);  // 1 ms on the wire each
    EXPECT_NEAR(t.left_s, start + 0.001, 1e-12);
    // Latency plus U(0, jitter), or the arrival of the message before it (which left 10 ms
    // earlier, so no later than this one's bound either).
    EXPECT_GE(t.arrive_s, t.left_s + spec.latency_s);
    EXPECT_LE(t.arrive_s, t.left_s + spec.latency_s + spec.jitter_s + 1e-12);
    EXPECT_GE(t.arrive_s, previous);  // never overtakes
    previous = t.arrive_s;
  }
  EXPECT_EQ(link.bytes(), 200'000u);
  EXPECT_EQ(link.messages(), 200u);
  // Messages further apart than the jitter never queue behind each other: each one's extra
  // delay is its own draw, spread over all of [0, jitter] (400 draws: each quarter of the range
  // expects 100 ± 9; seeded, so the same every run).
  LinkDirection spread(spec, 9);
  std::array<int, 4> quarters{};
  double least = spec.jitter_s, most = 0;
  for (int i = 0; i < 400; ++i) {
    const Transfer t = spread.transfer(1000, i * 0.1);
    const double extra = t.arrive_s - t.left_s - spec.latency_s;
    ASSERT_GE(extra, -1e-12);
    ASSERT_LE(extra, spec.jitter_s + 1e-12);
    ++quarters[std::min(3, static_cast<int>(4 * extra / spec.jitter_s))];
    least = std::min(least, extra);
    most = std::max(most, extra);
  }
  for (int q = 0; q < 4; ++q) EXPECT_GT(quarters[q], 60) << "quarter " << q << " of the jitter";
  EXPECT_LT(least, 0.05 * spec.jitter_s);
  EXPECT_GT(most, 0.95 * spec.jitter_s);
  // Without jitter a message arrives exactly its latency after it left.
  LinkSpec steady = spec;
  steady.jitter_s = 0;
  LinkDirection fixed(steady, 7);
  for (int i = 0; i < 10; ++i) {
    const Transfer t = fixed.transfer(1000, i * 0.1);
    EXPECT_NEAR(t.arrive_s - t.left_s, steady.latency_s, 1e-12);
  }
  // A message still arriving from an earlier hop cannot leave before it has.
  LinkDirection down(spec, 8);
  EXPECT_NEAR(down.transfer(1000, 0.0, 0.5).left_s, 0.5, 1e-12);
}

// A second of real traffic: a sender offers 4 KiB messages as fast as the link takes them
// (sleeping until each has left); the bytes that arrived by the end of the second, measured
// on the clock, less the initial burst, match the configured rate within 5 % (the 10 ms burst
// also absorbs a loaded machine's oversleeping). One message on an idle link arrives its
// latency after it was sent, on the link's clock exactly and on the real one within 1.5 times.
TEST(LinkDirection, DeliversItsRateOverASecondAndAddsItsLatency) {
  LinkSpec spec;
  spec.bandwidth_bytes_per_s = 2e6;  // 16 Mbit/s
  spec.latency_s = 0.0;
  spec.burst_bytes = 20000;
  LinkDirection link(spec, 1);
  const auto t0 = Clock::now();
  std::vector<double> arrivals;
  while (since(t0) < 1.0) {
    const Transfer t = link.transfer(4096, since(t0));
    arrivals.push_back(t.arrive_s);
    std::this_thread::sleep_for(std::chrono::duration<double>(std::max(0.0, t.left_s - since(t0))));
  }
  double delivered = 0;
  for (double a : arrivals)
    if (a <= 1.0) delivered += 4096;
  EXPECT_NEAR(delivered - spec.burst_bytes, spec.bandwidth_bytes_per_s, 0.05 * spec.bandwidth_bytes_per_s);

  // The link's delay is its latency, exactly; slept out on the clock it takes at least that
  // and at most 1.5 times it (0.15 s of slack for a loaded machine's oversleeping).
  spec.latency_s = 0.3;
  LinkDirection slow(spec, 2);
  const auto t1 = Clock::now();
  const Transfer t = slow.transfer(1000, since(t1));
  EXPECT_NEAR(t.arrive_s - t.left_s, spec.latency_s, 1e-12);
  std::this_thread::sleep_for(std::chrono::duration<double>(t.arrive_s - since(t1)));
  const double measured = since(t1);
  EXPECT_GE(measured, spec.latency_s);
  EXPECT_LE(measured, 1.5 * spec.latency_s);
}

TEST(WanConfig, PerUnitOverridesAndUnits) {
  Config c;
  c.mode = Mode::decoupled;
  c.units.count = 3;
  c.wan.bandwidth_mbit_s = 80;
  c.wan.latency_ms = 10;
  EXPECT_DOUBLE_EQ(link_spec(c, 1).bandwidth_bytes_per_s, 10e6);
  EXPECT_DOUBLE_EQ(link_spec(c, 1).latency_s, 0.01);
  c.wan.unit_bandwidth_mbit_s = {80, 8, 0};
  EXPECT_DOUBLE_EQ(link_spec(c, 1).bandwidth_bytes_per_s, 1e6);
  EXPECT_DOUBLE_EQ(link_spec(c, 2).bandwidth_bytes_per_s, 0.0);
  EXPECT_TRUE(emulated(c));
  EXPECT_FALSE(emulated(Config{}));
  {  // one unit's latency, or jitter alone, is a limited link; per-unit zeros are not
    Config d = c;
    d.wan.bandwidth_mbit_s = d.wan.latency_ms = 0;
    d.wan.unit_bandwidth_mbit_s = {0, 0, 0};
    EXPECT_FALSE(emulated(d));
    d.wan.unit_latency_ms = {0, 0, 5};
    EXPECT_TRUE(emulated(d));
    EXPECT_DOUBLE_EQ(link_spec(d, 2).latency_s, 0.005);
    EXPECT_FALSE(d.wan.emulated(2));  // units 0 and 1 only
    d.wan.unit_latency_ms.clear();
    d.wan.jitter_ms = 1;
    EXPECT_TRUE(emulated(d));
  }
  c.wan.unit_latency_ms = {1, 2};
  EXPECT_THROW(validate(c, "t.yaml"), Error);
  c.wan.unit_latency_ms.clear();
  // Out of any WAN's range (and beyond what the clocks can wait out).
  for (auto [key, value] : {std::pair<std::string, std::string>{"wan.latency_ms", "1e300"},
                            {"wan.bandwidth_mbit_s", "1e-300"}, {"wan.jitter_ms", "1e9"},
                            {"wan.block", "100000000"}, {"wan.chunk", "16777217"}, {"wan.topk", "4097"}}) {
    Config bad = c;
    apply_override(bad, key + "=" + value, "--set");
    try {
      validate(bad, "--set");
      ADD_FAILURE() << key << "=" << value << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
  Config single = c;
  single.mode = Mode::single;
  single.units.count = 1;
  single.wan.unit_bandwidth_mbit_s.clear();
  EXPECT_THROW(validate(single, "t.yaml"), Error);  // no links to emulate
  c.mode = Mode::ddp;
  for (const char* format : {"int8", "int4", "int2", "sparse"}) {
    c.wan.format = format;
    try {
      validate(c, "t.yaml");
      ADD_FAILURE() << "ddp with " << format << " accepted";
    } catch (const Error& e) {
      const std::string want = "wan.format: ddp all-reduces gradients over the links in fp32 or bf16, got ";
      EXPECT_NE(std::string(e.what()).find(want + format), std::string::npos) << e.what();
    }
  }
}

// wire_codec: wan.format with its parameters, as both sides of a window and ddp's ring use it.
TEST(WanConfig, WireCodecCarriesEveryParameter) {
  Config c;
  c.wan.format = "sparse";
  c.wan.block = 32;
  c.wan.chunk = 1024;
  c.wan.topk = 16;
  c.wan.value_bits = 4;
  const wire::Codec codec = wire_codec(c);
  EXPECT_EQ(codec.format, wire::Format::sparse);
  EXPECT_EQ(codec.block, 32u);
  EXPECT_EQ(codec.chunk, 1024u);
  EXPECT_EQ(codec.topk, 16u);
  EXPECT_EQ(codec.value_bits, 4);
  c.wan.format = "int2";
  EXPECT_EQ(wire_codec(c).format, wire::Format::int2);
  c.wan.format = "fp16";
  EXPECT_THROW(wire_codec(c), Error);
}

}  // namespace
}  // namespace ddiloco::wan
