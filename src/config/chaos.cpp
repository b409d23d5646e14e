#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>

#include "ddiloco/chaos.hpp"
#include "ddiloco/config.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/rng.hpp"

namespace ddiloco::chaos {

const char* kind_name(FaultKind kind) {
  switch (kind) {
    case FaultKind::crash: return "crash";
    case FaultKind::slow: return "slow";
    case FaultKind::link: return "link";
    case FaultKind::kill: return "kill";
    case FaultKind::kill_syncer: return "kill_syncer";
  }
  return "?";
}

namespace {

void sort_faults(std::vector<Fault>& faults) {
  std::sort(faults.begin(), faults.end(), [](const Fault& a, const Fault& b) {
    if (a.start_s != b.start_s) return a.start_s < b.start_s;
    if (a.unit != b.unit) return a.unit < b.unit;
    if (a.kind != b.kind) return a.kind < b.kind;
    return a.rank < b.rank;
  });
}

// Exp(mean) by inversion; 1 − U lies in (0, 1], so the logarithm is finite.
double exponential(Rng& rng, double mean) { return -mean * std::log(1.0 - rng.uniform()); }

// Episodes of one kind for one unit: gap ~ Exp(mtbf) from the end of the previous episode.
// Crashes draw their length; the other kinds have a fixed one.
void draw_episodes(std::vector<Fault>& out, const ChaosConfig& c, int unit, FaultKind kind) {
  const double mtbf = kind == FaultKind::crash  ? c.crash_mtbf_s
                      : kind == FaultKind::slow ? c.slow_mtbf_s
                                                : c.link_mtbf_s;
  if (mtbf <= 0) return;
  // One stream per (unit, kind): a unit's crashes do not move when its straggler rate changes.
  Rng rng(mix_seed(static_cast<uint64_t>(c.seed), 16 * static_cast<uint64_t>(unit) +
                                                      static_cast<uint64_t>(kind) + 1));
  double t = 0;
  for (;;) {
    t += exponential(rng, mtbf);
    if (t >= c.horizon_s) return;
    Fault f{.unit = unit, .kind = kind, .start_s = t};
    switch (kind) {
      case FaultKind::crash:
        f.duration_s = c.down_min_s + (c.down_max_s - c.down_min_s) * rng.uniform();
        break;
      case FaultKind::slow:
        f.duration_s = c.slow_duration_s;
        f.factor = c.slow_factor;
        break;
      case FaultKind::link:
        f.duration_s = c.link_duration_s;
        f.factor = c.link_factor;
        break;
      case FaultKind::kill:
      case FaultKind::kill_syncer:
        return;  // never drawn: only schedule files hold the launcher's kills
    }
    if (out.size() >= Schedule::kMaxDrawn)
      fail("chaos.horizon_s: the fault rates draw more than {} faults over {} s (mean gaps "
           "chaos.crash_mtbf_s = {}, slow_mtbf_s = {}, link_mtbf_s = {}); lower chaos.horizon_s "
           "or raise the mean gaps",
           Schedule::kMaxDrawn, c.horizon_s, c.crash_mtbf_s, c.slow_mtbf_s, c.link_mtbf_s);
    out.push_back(f);
    t = f.end_s();
  }
}

}  // namespace

Schedule Schedule::generate(const ChaosConfig& config, int units) {
  std::vector<int> which = config.units;
  if (which.empty())
    for (int u = 0; u < units; ++u) which.push_back(u);
  Schedule s;
  for (const int u : std::set<int>(which.begin(), which.end())) {
    if (u < 0 || u >= units) fail("chaos.units: every unit must be in [0, {}), got {}", units, u);
    for (const FaultKind k : {FaultKind::crash, FaultKind::slow, FaultKind::link})
      draw_episodes(s.faults, config, u, k);
  }
  sort_faults(s.faults);
  return s;
}

namespace {

// A schedule file parsed: a map with a list 'faults'.
// `load` parses the text (YAML::LoadFile or YAML::Load); `path` names it in errors.
template <typename Load>
YAML::Node read_schedule(Load&& load, const std::string& path) {
  YAML::Node root;
  try {
    root = load();
  } catch (const YAML::Exception& ex) {
    fail("{}: line {}: {}", path, ex.mark.line + 1, ex.msg);
  }
  if (!root.IsMap() || !root["faults"] || !root["faults"].IsSequence())
    fail("{}: expected a map with a list 'faults' of {{unit, kind, start_s, duration_s, "
         "factor}}",
         path);
  return root;
}

YAML::Node read_schedule_file(const std::string& path) {
  // The error_code form: a path the system refuses to look up (a name over 255 bytes) made
  // exists() throw std::filesystem::filesystem_error, naming neither the key nor the config.
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    if (ec && ec != std::errc::no_such_file_or_directory)
      fail("{}: chaos schedule file cannot be looked up ({}); chaos.schedule_file must name a "
           "readable file",
           path, ec.message());
    fail("{}: chaos schedule file not found", path);
  }
  return read_schedule([&] { return YAML::LoadFile(path); }, path);
}

// One entry of a schedule file's 'faults', read into a Fault: each key checked as it is read,
// and every error named by its place in the file (`where`).
class FaultEntry {
 public:
  FaultEntry(const YAML::Node& e, std::string where) : e_(e), where_(std::move(where)) {
    if (!e_.IsMap()) fail("{}: expected a map {{unit, kind, start_s, duration_s, factor}}", where_);
    for (const auto& kv : e_) {
      // A key must be a name: as<std::string>() of a list or map key would throw yaml-cpp's
      // bad conversion, naming neither the file nor the entry.
      if (!kv.first.IsScalar())
        fail("{}: a key must be a name (one of unit, kind, start_s, duration_s, factor, rank), "
             "got a {}",
             where_, kv.first.IsMap() ? "map" : kv.first.IsSequence() ? "list" : "null");
      const std::string key = kv.first.Scalar();
      if (key != "unit" && key != "kind" && key != "start_s" && key != "duration_s" &&
          key != "factor" && key != "rank")
        fail("{}: unknown key '{}' (expected unit, kind, start_s, duration_s, factor, rank)",
             where_, key);
    }
  }

  Fault read(int units, const std::vector<int>& unit_ranks) const {
    Fault f;
    f.kind = kind();
    f.unit = unit(f.kind, units);
    read_rank(f, unit_ranks);
    f.start_s = number("start_s", true, 0);
    if (f.start_s < 0) fail("{}.start_s: must be ≥ 0, got {}", where_, f.start_s);
    if (is_launcher_fault(f.kind)) read_launcher_fault(f);
    else read_episode(f);
    return f;
  }

 private:
  double number(const char* key, bool required, double fallback) const {
    if (!e_[key]) {
      if (required) fail("{}.{}: missing", where_, key);
      return fallback;
    }
    try {
      const double v = e_[key].as<double>();
      if (!std::isfinite(v)) fail("{}.{}: must be a finite number", where_, key);
      return v;
    } catch (const YAML::Exception&) {
      fail("{}.{}: expected a number, got '{}'", where_, key, e_[key].Scalar());
    }
  }

  FaultKind kind() const {
    const std::string kind = e_["kind"] ? e_["kind"].Scalar() : "";
    if (kind == "crash") return FaultKind::crash;
    if (kind == "slow") return FaultKind::slow;
    if (kind == "link") return FaultKind::link;
    if (kind == "kill") return FaultKind::kill;
    if (kind == "kill_syncer") return FaultKind::kill_syncer;
    fail("{}.kind: must be one of crash, slow, link, kill, kill_syncer, got '{}'", where_, kind);
  }

  int unit(FaultKind kind, int units) const {
    if (kind == FaultKind::kill_syncer) {
      // The syncer is no unit: the key may be left out, or say so with -1.
      const double unit = number("unit", false, kSyncerUnit);
      if (unit != kSyncerUnit)
        fail("{}.unit: kill_syncer kills the syncer, which is no unit: omit unit or give -1, got "
             "{}", where_, e_["unit"].Scalar());
      return kSyncerUnit;
    }
    const double unit = number("unit", true, 0);
    if (unit != std::floor(unit) || unit < 0 || unit >= units)
      fail("{}.unit: must be an integer in [0, {}), got {}", where_, units, e_["unit"].Scalar());
    return static_cast<int>(unit);
  }

  // Only a kill names a rank (0 when the file names none): one of its unit's.
  void read_rank(Fault& f, const std::vector<int>& unit_ranks) const {
    if (e_["rank"]) {
      if (f.kind != FaultKind::kill)
        fail("{}.rank: only a kill names a rank, got one for kind {}", where_, kind_name(f.kind));
      const double rank = number("rank", true, 0);
      if (rank != std::floor(rank) || rank < 0 || rank > 1e6)
        fail("{}.rank: must be an integer ≥ 0 (a rank of unit {}), got {}", where_, f.unit,
             e_["rank"].Scalar());
      f.rank = static_cast<int>(rank);
    }
    if (f.kind == FaultKind::kill && static_cast<size_t>(f.unit) < unit_ranks.size() &&
        f.rank >= unit_ranks[static_cast<size_t>(f.unit)])
      fail("{}.rank: unit {} has {} rank(s), 0 to {}, got {}", where_, f.unit,
           unit_ranks[static_cast<size_t>(f.unit)], unit_ranks[static_cast<size_t>(f.unit)] - 1,
           f.rank);
  }

  // A killed process is restarted by the launcher after launch.backoff_s, not after a
  // down-time of the schedule's.
  void read_launcher_fault(Fault& f) const {
    f.duration_s = number("duration_s", false, 0);
    if (f.duration_s != 0)
      fail("{}.duration_s: a {} has no duration (the launcher restarts the process after "
           "launch.backoff_s): omit it or give 0, got {}", where_, kind_name(f.kind), f.duration_s);
    f.factor = number("factor", false, 1.0);
    if (f.factor != 1)
      fail("{}.factor: a {} has no factor (1), got {}", where_, kind_name(f.kind), f.factor);
  }

  // A crash, a slow-down or a degraded link: an episode with a length and a factor.
  void read_episode(Fault& f) const {
    f.duration_s = number("duration_s", true, 0);
    // A crash may restart at once (down 0 s: what chaos.down_max_s = 0 draws); an episode
    // of slowness or a degraded link lasts.
    if (f.duration_s < 0 || (f.duration_s == 0 && f.kind != FaultKind::crash))
      fail("{}.duration_s: must be > 0 (≥ 0 for a crash), got {}", where_, f.duration_s);
    f.factor = number("factor", f.kind != FaultKind::crash, 1.0);
    if (f.kind == FaultKind::slow && f.factor < 1)
      fail("{}.factor: a slow-down must be ≥ 1, got {}", where_, f.factor);
    if (f.kind == FaultKind::link && (f.factor <= 0 || f.factor > 1))
      fail("{}.factor: a bandwidth fraction must be in (0, 1], got {}", where_, f.factor);
    if (f.kind == FaultKind::crash && f.factor != 1)
      fail("{}.factor: a crash has no factor (1), got {}", where_, f.factor);
  }

  const YAML::Node e_;
  const std::string where_;
};

// A unit cannot crash while it is down (`faults` sorted).
void check_crashes_apart(const std::vector<Fault>& faults, int units, const std::string& path) {
  for (int u = 0; u < units; ++u) {
    double up_at = -1;
    for (const Fault& f : faults) {
      if (f.unit != u || f.kind != FaultKind::crash) continue;
      if (f.start_s < up_at)
        fail("{}: unit {} crashes at {} s while down from an earlier crash until {} s", path, u,
             f.start_s, up_at);
      up_at = f.end_s();
    }
  }
}

}  // namespace

namespace {
Schedule read_faults(const YAML::Node& root, const std::string& path, int units,
                     const std::vector<int>& unit_ranks) {
  const YAML::Node list = root["faults"];
  Schedule s;
  for (size_t i = 0; i < list.size(); ++i)
    s.faults.push_back(FaultEntry(list[i], fmt::format("{}: faults[{}]", path, i)).read(units, unit_ranks));
  sort_faults(s.faults);
  check_crashes_apart(s.faults, units, path);
  return s;
}
}  // namespace

Schedule Schedule::load(const std::string& path, int units, const std::vector<int>& unit_ranks) {
  return read_faults(read_schedule_file(path), path, units, unit_ranks);
}

Schedule Schedule::parse(const std::string& yaml, const std::string& source, int units,
                         const std::vector<int>& unit_ranks) {
  return read_faults(read_schedule([&] { return YAML::Load(yaml); }, source), source, units,
                     unit_ranks);
}

void validate(const Config& c) {
  const int M = c.units.count;
  for (const int u : c.chaos.units)
    if (u >= M) fail("chaos.units: every unit must be < units.count = {}, got {}", M, u);
  if (c.chaos.down_max_s < c.chaos.down_min_s)
    fail("chaos.down_max_s: must be ≥ chaos.down_min_s = {}, got {}", c.chaos.down_min_s,
         c.chaos.down_max_s);
  if (c.chaos.enabled() && !mode_traits(c.mode).has_syncer)
    fail("chaos: faults are injected into learner units; mode single has none (choose mode "
         "ddp, diloco, streaming or decoupled)");
  if (c.chaos.enabled()) {
    // Drawn or read now, so that a bad schedule file is refused before any rank starts
    // (a kill's rank checked against its unit's ranks).
    std::vector<int> unit_ranks;
    for (int u = 0; u < M; ++u) unit_ranks.push_back(c.unit_ranks(u));
    const Schedule schedule = Schedule::from_config(c.chaos, M, unit_ranks);
    const bool crashes = std::any_of(schedule.faults.begin(), schedule.faults.end(),
                                     [](const Fault& f) { return f.kind == FaultKind::crash; });
    if (crashes && mode_traits(c.mode).outer_steps && !mode_traits(c.mode).can_rejoin)
      fail("chaos: crashes in mode streaming are not supported yet (a unit that crashes "
           "between sending a fragment and applying its merge leaves the others waiting for a "
           "merge it cannot complete); use mode diloco or decoupled, or slow and link faults only");
  }
}

Schedule Schedule::from_config(const ChaosConfig& config, int units,
                               const std::vector<int>& unit_ranks) {
  return config.schedule_file.empty() ? generate(config, units)
                                      : load(config.schedule_file, units, unit_ranks);
}

std::string Schedule::to_yaml() const {
  std::ostringstream os;
  os << "# ddiloco fault schedule: times in seconds since the job's start\nfaults:\n";
  // {} prints the shortest text that reads back to the same double.
  for (const Fault& f : faults) {
    if (f.kind == FaultKind::kill_syncer)
      os << fmt::format("  - {{kind: kill_syncer, start_s: {}}}\n", f.start_s);
    else if (f.kind == FaultKind::kill)
      os << fmt::format("  - {{unit: {}, kind: kill, rank: {}, start_s: {}}}\n", f.unit, f.rank,
                        f.start_s);
    else
      os << fmt::format("  - {{unit: {}, kind: {}, start_s: {}, duration_s: {}, factor: {}}}\n",
                        f.unit, kind_name(f.kind), f.start_s, f.duration_s, f.factor);
  }
  if (faults.empty()) os << "  []\n";
  return os.str();
}

std::vector<Fault> Schedule::of_unit(int unit) const {
  std::vector<Fault> out;
  for (const Fault& f : faults)
    if (f.unit == unit) out.push_back(f);
  return out;
}

std::vector<Fault> Schedule::launcher_faults() const {
  std::vector<Fault> out;
  for (const Fault& f : faults)
    if (is_launcher_fault(f.kind)) out.push_back(f);
  return out;
}

Schedule::Counts Schedule::counts(int unit) const {
  Counts c;
  for (const Fault& f : faults) {
    if (unit >= 0 && f.unit != unit) continue;
    switch (f.kind) {
      case FaultKind::crash: ++c.crashes, c.down_s += f.duration_s; break;
      case FaultKind::slow: ++c.slow, c.slow_s += f.duration_s; break;
      case FaultKind::link: ++c.link, c.link_s += f.duration_s; break;
      case FaultKind::kill: ++c.kills; break;
      case FaultKind::kill_syncer: ++c.syncer_kills; break;
    }
  }
  return c;
}

UnitTimeline::UnitTimeline(const Schedule& schedule, int unit) {
  for (const Fault& f : schedule.of_unit(unit)) {
    switch (f.kind) {
      case FaultKind::crash: crashes_.push_back(f); break;
      case FaultKind::slow: slows_.push_back(f); break;
      case FaultKind::link: links_.push_back(f); break;
      case FaultKind::kill:
      case FaultKind::kill_syncer: break;  // the launcher's (ddiloco launch), not the unit's
    }
  }
}

const Fault* UnitTimeline::crash_due(double now_s) {
  if (next_crash_ < crashes_.size() && crashes_[next_crash_].start_s <= now_s)
    return &crashes_[next_crash_++];
  return nullptr;
}

void UnitTimeline::skip_crashes_before(double t_s) {
  while (next_crash_ < crashes_.size() && crashes_[next_crash_].start_s < t_s) ++next_crash_;
}

bool UnitTimeline::crash_pending(double now_s) const {
  return next_crash_ < crashes_.size() && crashes_[next_crash_].start_s <= now_s;
}

double UnitTimeline::slowdown_at(double now_s) const {
  double factor = 1;
  for (const Fault& f : slows_)
    if (f.start_s <= now_s && now_s < f.end_s()) factor = std::max(factor, f.factor);
  return factor;
}

double UnitTimeline::link_factor_at(double now_s) const {
  double factor = 1;
  for (const Fault& f : links_)
    if (f.start_s <= now_s && now_s < f.end_s()) factor = std::min(factor, f.factor);
  return factor;
}

}  // namespace ddiloco::chaos
