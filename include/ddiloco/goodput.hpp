// Goodput accounting (docs/architecture.md, "Chaos and goodput"; the paper's §on goodput):
// every rank books its wall time, and the syncer measures global downtime.
#pragma once

#include <nlohmann/json.hpp>

#include <vector>

namespace ddiloco {

/// Where one rank's wall time went, in seconds. Each category is measured by its own clock,
/// so booked() ≈ allocated is a check, not an identity.
///   compute    forward, backward and optimizer steps (emulated slowness included: a slow chip
///              is still computing)
///   wait       gradient all-reduce, waiting for merges or the syncer, the unit's broadcasts
///   down       crashed: the down-time and the rejoin (fetching Θ)
///   other      logging and evaluations
///   discarded  the part of `compute` whose result never reached the global model: work lost
///              in a crash before it was sent, work on a fragment overwritten when a merge is
///              applied τ steps after the snapshot (outer.apply overwrite; blend keeps α of it,
///              carry all), work after a unit's last snapshot
///   allocated  the rank's wall time from the job's common start to its end
/// Goodput = (compute − discarded) ÷ allocated.
struct TimeBook {
  double compute = 0, wait = 0, down = 0, other = 0, discarded = 0, allocated = 0;

  double useful() const { return compute - discarded; }
  double booked() const { return compute + wait + down + other; }
  double goodput() const { return allocated > 0 ? useful() / allocated : 0.0; }
  TimeBook& operator+=(const TimeBook& o);
  nlohmann::json to_json() const;  ///< every field, plus useful and goodput

  static constexpr int kFields = 6;
  std::vector<double> to_vector() const;
  static TimeBook from_vector(const double* v);
};

/// Global downtime: the total length of the intervals between two consecutive outer updates
/// (of any fragment; or the last one and the end of training) that are longer than `factor`
/// times the nominal fragment period (H inner steps, the period of each fragment's
/// synchronisation, at the units' median step time; one step in ddp). Counted
/// from the first update on: before it every mode is still in its first round, which is not
/// downtime. The nominal period is passed with every update, as measured while the job runs.
class GlobalDowntime {
 public:
  explicit GlobalDowntime(double factor = 2.0) : factor_(factor) {}
  /// An outer update was applied at `now_s`; `nominal_period_s` ≤ 0 means not known yet (the
  /// interval is then not counted).
  void update(double now_s, double nominal_period_s);
  /// Closes the last interval at `end_s` and returns the total downtime, seconds.
  double finish(double end_s, double nominal_period_s);
  double seconds() const { return downtime_; }
  int64_t episodes() const { return episodes_; }
  double longest_gap_s() const { return longest_; }

 private:
  void interval(double length, double nominal);
  double factor_;
  bool started_ = false;
  double last_ = 0, downtime_ = 0, longest_ = 0;
  int64_t episodes_ = 0;
};

}  // namespace ddiloco
