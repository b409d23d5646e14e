// Recovery of Θ from the units (docs/deployments.md "The syncer dying"): a syncer restarted mid-run holds
// at best its last checkpoint, but every unit holds the newest merged fragments it was sent,
// copies of Θ_p at a known version. The restarted syncer asks every unit that reconnects for
// them (the unit's offer, sync_window.hpp kOfferFor), takes the newest version of each
// fragment, and only then merges, delivers or serves a rejoin.
//
// This file holds the decisions alone, apart from transports and clocks, so that they are
// tested on their own (tests/unit/test_recovery.cpp): which copy is taken, and when the
// syncer has heard enough.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ddiloco::syncer {

/// One unit's copy of Θ_p: `values` (numel(p) fp32) at merge `version` (≥ 1).
struct Offer {
  int unit = 0;
  int64_t version = 0;
  std::vector<float> values;
};

/// What recovery takes for one fragment.
struct Recovered {
  int64_t version = 0;        ///< the newest version offered (0: no copy was offered)
  std::vector<float> values;  ///< Θ_p at that version (empty when version is 0)
  std::vector<int> from;      ///< the units whose copy is at that version, ascending
  /// Exact copies (fp32 wire format): units whose copy at that version differs from the one
  /// taken. Each holds what the same syncer sent it, so a difference is a fault of that unit's
  /// memory or a lie: it is outvoted and logged.
  std::vector<int> outvoted;
  double max_diff = 0;        ///< the largest |difference| between two copies at that version
};

/// The copy of one fragment a restarted syncer takes from `offers` (any order, any versions):
/// the newest version. `exact` (fp32 wire format: every unit decoded the same raw values):
/// copies of one version must be bit-identical; if not, the largest group of identical copies
/// wins (a tie: the group holding the lowest unit), the others are `outvoted`. Otherwise (bf16,
/// int8, int4) each unit's copy is the reconstruction R of sync_window.hpp, which differs from
/// the syncer's Θ_p by the rounding of that unit's last delivery: their element-wise mean is
/// taken (the roundings of different units' differences are independent). Throws Error when
/// two copies differ in size.
Recovered choose_copy(std::span<const Offer> offers, bool exact);

/// When a restarted syncer has heard enough to go on: every unit has offered (a unit that
/// only asks to rejoin, holding nothing, offers nothing); or `quorum` units (K, at most the
/// units) have offered copies of Θ and `patience_s` has passed since the K-th, for the others
/// to come back (units reconnect with backoff, so one may come a few seconds after the rest,
/// holding the newest merge; a unit not back by then is taken as lost, as its silence would
/// make it anyway); or `timeout_s` has passed since `started_s` (then the syncer goes on with
/// what it has). Seconds on the syncer's clock.
class Recovery {
 public:
  /// Throws Error when units < 1, quorum < 1 or a time is negative.
  Recovery(int units, int quorum, double started_s, double timeout_s, double patience_s);
  /// Unit u's offer was read at `now_s`: `copies`, it held copies of Θ; otherwise it holds
  /// nothing (a new process, a unit back from a crash). A second call for u is ignored.
  void offered(int u, double now_s, bool copies);
  bool has_offered(int u) const { return offered_[static_cast<size_t>(u)]; }
  int offers() const { return count_; }
  int holders() const { return holders_; }  ///< offers with copies
  bool complete(double now_s) const;
  /// Did the wait end on the timeout, with fewer than K offers of copies?
  bool timed_out(double now_s) const;

 private:
  std::vector<bool> offered_;
  int count_ = 0, holders_ = 0;
  int quorum_;
  double started_s_, timeout_s_, patience_s_;
  double quorum_at_s_ = -1;  // when the K-th offer came
};

}  // namespace ddiloco::syncer
