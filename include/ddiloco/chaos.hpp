// Fault injection: a seeded, reproducible schedule of unit crashes, straggler episodes and link
// degradations (docs/architecture.md, "Chaos and goodput"; docs/algorithm.md on the failure model).
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
//
// Real faults, for the isolated deployment (`ddiloco launch`, include/ddiloco/launch.hpp):
//   kill         the launcher sends SIGKILL to one rank's process of unit `unit` (`rank`,
//                default 0: the leader) at start_s, seconds since the launch began;
//   kill_syncer  ... to the syncer's process (no unit: omit it or write -1).
// Only schedule files hold them (no rate draws them). The units and the syncer ignore them:
// UnitTimeline never returns them, and they count apart in Counts.
#pragma once

#include <string>
#include <vector>

namespace ddiloco {
struct ChaosConfig;
struct Config;
}

namespace ddiloco::chaos {

// New kinds go at the end: a kind's number seeds its random stream (Schedule::generate).
enum class FaultKind { crash, slow, link, kill, kill_syncer };
const char* kind_name(FaultKind kind);
/// kill and kill_syncer: faults the launcher carries out on real processes, not the job.
inline bool is_launcher_fault(FaultKind kind) {
  return kind == FaultKind::kill || kind == FaultKind::kill_syncer;
}

/// `unit` of a kill_syncer fault: it names no unit.
inline constexpr int kSyncerUnit = -1;

/// One injected fault. `factor`: slow-down ≥ 1 (slow), bandwidth fraction in (0, 1] (link),
/// 1 for a crash and the kills. `duration_s` is 0 for the kills (the launcher restarts a
/// killed process after launch.backoff_s).
struct Fault {
  int unit = 0;           ///< kSyncerUnit for kill_syncer
  FaultKind kind = FaultKind::crash;
  double start_s = 0;     ///< seconds since the job's start (the launch's start for the kills)
  double duration_s = 0;  ///< down-time (crash) or episode length, seconds
  double factor = 1;
  int rank = 0;           ///< kill: the unit's rank whose process is killed (0 = its leader)

  double end_s() const { return start_s + duration_s; }
  bool operator==(const Fault&) const = default;
};

/// Every fault of a job, sorted by start time (then unit, then kind).
struct Schedule {
  std::vector<Fault> faults;

  /// Most faults a drawn schedule may hold: a month of faults every ten minutes of each kind
  /// for 64 units is under a million; more is a typing error (chaos.horizon_s over the
  /// chaos.*_mtbf_s), which would otherwise take gigabytes and minutes to draw.
  static constexpr size_t kMaxDrawn = size_t{1} << 20;

  /// Draws the schedule of `units` units over [0, config.horizon_s) from config.seed. No
  /// faults when every rate is 0. Throws Error on a config that names a unit ≥ units, or whose
  /// rates draw more than kMaxDrawn faults.
  static Schedule generate(const ChaosConfig& config, int units);

  /// Reads a YAML schedule (`faults:` list of {unit, kind, start_s, duration_s, factor},
  /// and `rank` for a kill). Throws Error naming the file, the entry and the field on anything
  /// malformed: unknown kind or key, unit outside [0, units) (a kill_syncer with a unit other
  /// than -1), negative times, factor out of range, a rank on another kind than kill, a rank
  /// outside [0, unit_ranks[unit]) (checked when unit_ranks is given: the ranks of each unit),
  /// two crashes of one unit that overlap.
  static Schedule load(const std::string& path, int units,
                       const std::vector<int>& unit_ranks = {});

  /// Like load(), from YAML text; `source` names it in errors (fuzz/chaos_schedule.cpp).
  static Schedule parse(const std::string& yaml, const std::string& source, int units,
                        const std::vector<int>& unit_ranks = {});

  /// The config's schedule: load(schedule_file) when given, else generate().
  static Schedule from_config(const ChaosConfig& config, int units,
                              const std::vector<int>& unit_ranks = {});

  /// YAML that load() reads back to the same schedule (times printed exactly).
  std::string to_yaml() const;

  /// The faults of one unit, in start order (its kills included; kill_syncer is no unit's).
  std::vector<Fault> of_unit(int unit) const;

  /// The kill and kill_syncer faults, in start order: what `ddiloco launch` carries out.
  std::vector<Fault> launcher_faults() const;

  /// How many faults of each kind, and their total durations (seconds).
  struct Counts {
    int64_t crashes = 0, slow = 0, link = 0;
    double down_s = 0, slow_s = 0, link_s = 0;
    int64_t kills = 0;         ///< kill faults (of the unit, or of every unit)
    int64_t syncer_kills = 0;  ///< kill_syncer faults (counted only for unit < 0)
  };
  /// ... of one unit, or of every unit and the syncer (unit < 0).
  Counts counts(int unit = -1) const;

  bool empty() const { return faults.empty(); }
  bool operator==(const Schedule&) const = default;
};

/// The chaos.* checks of a configuration; config's validate() (include/ddiloco/config.hpp)
/// makes them at load time, in its order, and prefixes the source. Every chaos.units entry
/// < units.count, down_max_s ≥ down_min_s, faults only where there are learner units (not
/// mode single), and, when chaos is on, the schedule drawn or read now (so that a bad
/// schedule file, or a kill's rank outside its unit, is refused before any rank starts) with
/// no crash in mode streaming. Throws Error.
void validate(const Config& config);

/// One unit's view of the schedule as its clock advances (crash, slow and link faults; the
/// launcher's kills are not the unit's to act on and are left out).
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
