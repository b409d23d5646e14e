// Emulated wide-area links (issue 6; docs/architecture.md, "WAN emulation").
//
// Every unit has one link to the WAN, with two directions: up (unit → WAN) and down (WAN →
// unit). The syncer sits on the WAN backbone, so a snapshot crosses its unit's up direction
// and a merged fragment its unit's down direction; in ddp a leader's gradient chunk crosses its
// own up direction, then the receiving leader's down direction.
//
// A direction is a token bucket (bandwidth, burst) followed by a one-way delay (latency plus
// optional jitter):
//   * tokens are bytes; they accrue at `rate` bytes/s up to `burst` bytes;
//   * a message of b bytes offered at time t takes b tokens at once; if that leaves the bucket
//     in debt d > 0 its last byte leaves at t + d / rate (the fluid model of a paced sender:
//     back-to-back messages queue behind each other, and a long transfer runs at `rate`);
//   * it arrives latency + U(0, jitter) later, never before a message offered before it.
// Nothing here sleeps: callers compare the returned times with their clock (the syncer counts a
// snapshot from its arrival, a ddp leader waits for it).
//
// Scaling rule (docs/wan.md, "Emulated WAN links"): what decides how a mode behaves on a link is how
// many inner steps a transfer takes, bytes / bandwidth ÷ step time. A model of N parameters with
// step time T on bandwidth B behaves like one of N' parameters, step time T', on
//   B' = B · (N' / N) · (T / T'),
// and latency scales with the step time: L' = L · T' / T.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "ddiloco/wire_format.hpp"

namespace ddiloco {
struct Config;
}

namespace ddiloco::wan {

/// A fluid token bucket. Rates in bytes per second, sizes in bytes, times in seconds on the
/// caller's clock. rate ≤ 0: unlimited (every message leaves at once).
class TokenBucket {
 public:
  TokenBucket(double rate_bytes_per_s, double burst_bytes);
  /// Offers `bytes` at `now_s` with the bandwidth scaled by `rate_factor` (∈ (0, 1]: a degraded
  /// link); returns when its last byte has left (≥ now_s). Times must not go backwards.
  double send(double bytes, double now_s, double rate_factor = 1.0);
  double rate() const { return rate_; }

 private:
  double rate_, burst_;
  double level_;     // tokens at at_ (negative: debt)
  double at_ = 0.0;  // time of the last update
};

/// The parameters of one unit's link (both directions).
struct LinkSpec {
  double bandwidth_bytes_per_s = 0;  ///< ≤ 0: unlimited
  double latency_s = 0;              ///< one-way
  double jitter_s = 0;               ///< extra one-way delay, uniform in [0, jitter_s]
  double burst_bytes = 65536;
};

/// When a message's last byte left the sender's side of a link, and when it arrived.
struct Transfer {
  double left_s = 0, arrive_s = 0;
};

/// One direction of a link: the bucket, the delay, and what crossed it.
class LinkDirection {
 public:
  LinkDirection(const LinkSpec& spec, uint64_t seed);
  /// Offers a message of `bytes` at `start_s`, whose last byte cannot leave before
  /// `not_before_s` (it is still arriving from an earlier hop; ≤ start_s for none). Counts its
  /// bytes. `rate_factor` ∈ (0, 1] scales the bandwidth (a degraded link).
  Transfer transfer(uint64_t bytes, double start_s, double not_before_s = 0, double rate_factor = 1.0);
  uint64_t bytes() const { return bytes_; }
  uint64_t messages() const { return messages_; }
  const LinkSpec& spec() const { return spec_; }

 private:
  LinkSpec spec_;
  TokenBucket bucket_;
  std::mt19937_64 rng_;
  double last_arrival_ = 0;
  uint64_t bytes_ = 0, messages_ = 0;
};

/// A unit's link: up (unit → WAN) and down (WAN → unit).
struct Link {
  LinkDirection up, down;
  Link(const LinkSpec& spec, uint64_t seed) : up(spec, 2 * seed + 1), down(spec, 2 * seed + 2) {}
};

/// ddp across units: the leaders' gradient sum as a ring all-reduce (reduce-scatter, then
/// all-gather: 2·(M−1) messages of 1/M of the gradient per leader) in which every message
/// crosses the sender's up direction and the receiver's down direction. Messages travel in the
/// wire format (fp32 or bf16; partial sums are added in fp32; the all-gather forwards the
/// owner's encoded bytes, so every leader ends with identical values). A leader waits, asleep,
/// until each message would have arrived. Collective over `leaders` (one rank per unit, in
/// unit order). Rank r of `leaders` uses unit r's link (link_spec).
class WanRing {
 public:
  /// Throws Error when wan.format is neither fp32 nor bf16.
  WanRing(MPI_Comm leaders, const Config& config);
  /// In-place sum of `data` (the same length on every leader) over the leaders. `raw`: in
  /// fp32 whatever the wire format (every leader must pass the same; for non-finite values,
  /// which the wire formats refuse).
  void allreduce_sum(std::span<float> data, bool raw = false);
  const Link& link() const { return link_; }
  /// Seconds spent waiting for messages (emulated transfer time and peers) so far.
  double wait_s() const { return wait_s_; }
  /// The fraction of this leader's link bandwidth left now, ∈ (0, 1] (chaos link
  /// degradations); asked at every message. Default: 1.
  void set_rate_factor(std::function<double()> factor) { rate_factor_ = std::move(factor); }

 private:
  MPI_Comm comm_;
  int rank_, size_;
  Link link_;
  wire::Codec codec_;  // fp32 or bf16
  std::chrono::steady_clock::time_point t0_;
  double wait_s_ = 0;
  std::function<double()> rate_factor_ = [] { return 1.0; };
  std::vector<std::byte> send_, recv_;
  std::vector<float> decoded_;
  double now() const;
};

/// What crossed one unit's link, for the JSON lines (bytes of payload; the few words of control
/// a poll or a ring message carries are not counted).
struct LinkCounters {
  int64_t unit = -1;
  uint64_t up_bytes = 0, down_bytes = 0, up_messages = 0, down_messages = 0;
  static LinkCounters of(int unit, const Link& link);
  LinkCounters& operator+=(const LinkCounters& o);
};
/// Gathers every rank's counters to rank 0 of `comm` (collective); entries with unit −1 (no
/// link on that rank) are left out. Rank 0 gets them in rank order, the others nothing.
std::vector<LinkCounters> gather_link_counters(const LinkCounters& mine, MPI_Comm comm);

/// Unit u's link as the configuration sets it (wan.*, with the per-unit overrides).
LinkSpec link_spec(const Config& config, int unit);
/// Is any link limited (a bandwidth or a latency set)? Unlimited links are still counted.
bool emulated(const Config& config);
/// The wire codec the configuration names: wan.format with wan.block, wan.chunk, wan.topk and
/// wan.value_bits. Throws Error for an unknown format.
wire::Codec wire_codec(const Config& config);

}  // namespace ddiloco::wan
