// The syncer's model of every unit's link to the WAN (wan.hpp, docs/architecture.md "WAN
// emulation"): when a snapshot it read from a unit counts as arrived, when that unit's outbox
// may be acknowledged, and when a merged fragment lands in the unit's inbox. Nothing here
// sleeps or moves bytes: the syncer reads and writes windows at once and compares these times
// with its clock, so a slow link delays what a merge sees, never the syncer's loop.
//
// Two sources of delay:
//   - wan.* (an emulated link: bandwidth, latency, jitter); a chaos link degradation scales a
//     limited link's bandwidth (wan.bandwidth_mbit_s) down;
//   - where wan.* leaves a unit's link unlimited, a chaos link degradation alone: a transfer
//     of b raw bytes at the nominal rate r (ChaosConfig::kNominalLinkMbitS, 10 MB/s) takes
//     b·(1/factor − 1)/r longer than it would have. (Latency and jitter, if set, still apply.)
#pragma once

#include <cstdint>
#include <vector>

#include "ddiloco/chaos.hpp"
#include "ddiloco/wan.hpp"

namespace ddiloco {
struct Config;
}

namespace ddiloco::syncer {

class UnitLinks {
 public:
  /// One link per unit (wan::link_spec), seeded from run.seed; chaos link degradations from
  /// the configuration's schedule. Throws Error for a malformed chaos schedule.
  UnitLinks(const Config& config, int units);

  /// The runs this one resumes lasted `seconds` of job time: the chaos schedule runs on job
  /// time, the syncer's clock starts at 0.
  void set_elapsed_before(double seconds) { elapsed_before_s_ = seconds; }
  /// Is any link emulated (wan.* limits bandwidth or adds latency)?
  bool emulated() const { return emulated_; }

  /// A snapshot of `wire_bytes` (`raw_bytes` as fp32 values) read from unit u at `now_s`:
  /// `left_s`, when its last byte has left the unit (its outbox is busy until then), and
  /// `arrive_s`, when it counts at the syncer. Counted on u's up link.
  wan::Transfer snapshot(int u, uint64_t wire_bytes, uint64_t raw_bytes, double now_s);
  /// A merged fragment of `wire_bytes` (`raw_bytes` as fp32) sent to unit u at `now_s`: when it
  /// lands in u's inbox. Counted on u's down link.
  double merged(int u, uint64_t wire_bytes, uint64_t raw_bytes, double now_s);
  /// Θ served raw (`bytes`, fp32) to a unit that joins or rejoins, sent at `now_s`: when it
  /// lands (the syncer tells the unit it is served then; the unit waits for it). Counted on its
  /// down link.
  double served(int u, uint64_t bytes, double now_s);

  /// The chaos schedule the degradations come from (the syncer logs and saves it).
  const chaos::Schedule& schedule() const { return schedule_; }
  /// Bytes sent down every unit's link so far.
  uint64_t down_bytes() const;
  wan::LinkCounters counters(int u) const { return wan::LinkCounters::of(u, links_[u]); }

 private:
  double factor(int u, double now_s) const;
  double degradation_s(int u, uint64_t raw_bytes, double now_s) const;
  std::vector<bool> limited_;  ///< per unit: has wan.* a bandwidth (it carries degradations)
  bool emulated_;
  double elapsed_before_s_ = 0;
  chaos::Schedule schedule_;
  std::vector<chaos::UnitTimeline> chaos_;
  std::vector<wan::Link> links_;
};

}  // namespace ddiloco::syncer
