// Fault injection: a seeded, reproducible schedule of unit crashes, straggler episodes and link
// degradations (architecture.md, "Chaos and goodput"; paper_notes.md on the failure model).
//
// Times are wall-clock seconds since the job's common start (all ranks leave one barrier
// together, so every rank reads the same schedule against the same clock). Each unit's faults
// come from its own random streams, one per kind, so adding a unit or a kind of fault never
// changes the faults drawn for another.
//
//   crashes     a Poisson process per unit with mean time between failures `crash_mtbf_s`,
//               counted while the unit is up: the next crash comes Exp(mtbf) after the
//               previous down-time ended; each down-time is drawn uniformly from
//               [down_min_s, down_max_s].
//   stragglers  episodes as a Poisson process (mean gap `slow_mtbf_s` between the end of one
//               and the start of the next), each `slow_duration_s` long, during which the
//               unit's inner steps take `slow_factor` times as long.
//   links       episodes likewise, during which the unit ↔ syncer link carries `link_factor`
//               of its bandwidth (transfers take 1/link_factor as long).
//
// A schedule can also be written by hand (or saved from a run: `chaos_schedule.yaml` in the
// run directory) and loaded with `chaos.schedule_file`; it is validated like a config.
#pragma once

#include <string>
#include <vector>

namespace ddiloco {
struct ChaosConfig;
}

namespace ddiloco::chaos {

enum class FaultKind { crash, slow, link };
const char* kind_name(FaultKind kind);

/// One injected fault. `factor`: slow-down ≥ 1 (slow), bandwidth fraction in (0, 1] (link),
/// 1 for a crash.
struct Fault {
  int unit = 0;
  FaultKind kind = FaultKind::crash;
  double start_s = 0;     ///< seconds since the job's start
  double duration_s = 0;  ///< down-time (crash) or episode length, seconds
  double factor = 1;

  double end_s() const { return start_s + duration_s; }
  bool operator==(const Fault&) const = default;
};

/// Every fault of a job, sorted by start time (then unit, then kind).
struct Schedule {
  std::vector<Fault> faults;

  /// Draws the schedule of `units` units over [0, config.horizon_s) from config.seed. No
  /// faults when every rate is 0. Throws Error on a config that names a unit ≥ units.
  static Schedule generate(const ChaosConfig& config, int units);

  /// Reads a YAML schedule (`faults:` list of {unit, kind, start_s, duration_s, factor}).
  /// Throws Error naming the file, the entry and the field on anything malformed: unknown
  /// kind or key, unit outside [0, units), negative times, factor out of range, two crashes
  /// of one unit that overlap.
  static Schedule load(const std::string& path, int units);

  /// The config's schedule: load(schedule_file) when given, else generate().
  static Schedule from_config(const ChaosConfig& config, int units);

  /// YAML that load() reads back to the same schedule (times printed exactly).
  std::string to_yaml() const;

  /// The faults of one unit, in start order.
  std::vector<Fault> of_unit(int unit) const;

  /// How many faults of each kind, and their total durations (seconds).
  struct Counts {
    int64_t crashes = 0, slow = 0, link = 0;
    double down_s = 0, slow_s = 0, link_s = 0;
  };
  /// ... of one unit, or of every unit (unit < 0).
  Counts counts(int unit = -1) const;

  bool empty() const { return faults.empty(); }
  bool operator==(const Schedule&) const = default;
};

/// One unit's view of the schedule as its clock advances.
class UnitTimeline {
 public:
  UnitTimeline() = default;
  UnitTimeline(const Schedule& schedule, int unit);

  /// The next crash that has started by `now_s` and was not returned before; null if none.
  /// A crash whose start was passed while the unit was down (impossible in a generated
  /// schedule) is still returned, once.
  const Fault* crash_due(double now_s);
  /// Drops the crashes that start before `t_s`: a job resumed at job time t_s has lived them.
  void skip_crashes_before(double t_s);
  /// Is a crash due at `now_s` (without taking it)? Lets a unit that is waiting crash on time.
  bool crash_pending(double now_s) const;

  /// Inner-step slow-down at `now_s`: the largest factor of the slow episodes active then,
  /// 1 when none.
  double slowdown_at(double now_s) const;

  /// Link bandwidth fraction at `now_s`: the smallest factor of the link episodes active
  /// then, 1 when none.
  double link_factor_at(double now_s) const;

 private:
  std::vector<Fault> crashes_, slows_, links_;
  size_t next_crash_ = 0;
};

}  // namespace ddiloco::chaos
