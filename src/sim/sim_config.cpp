// The simulator's table of configuration keys (configs/sim/*.yaml), read and written with
// the same machinery as the run configuration.
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>

#include "ddiloco/error.hpp"
#include "ddiloco/simulate.hpp"
#include "config/config_schema.hpp"

namespace ddiloco::sim {

namespace {

using config_schema::at_least;
using config_schema::Entry;
using config_schema::in_range;
using config_schema::one_of;
using config_schema::positive;

constexpr const char* kListHint = "`ddiloco simulate --list` shows the known keys";
constexpr int64_t kMaxChips = 10'000'000'000;  // 1e10: far beyond any cluster; keeps N·M in int64
constexpr double kMaxWork = 3e9;

#define SIM_FIELD(T, KEY, MEMBER, DOC, ...)                                                 \
  config_schema::field<T, SimConfig>(KEY, [](SimConfig& c) -> T& { return c.MEMBER; }, DOC \
                                     __VA_OPT__(, ) __VA_ARGS__)

config_schema::Check<std::vector<std::string>> strategy_list() {
  return [](const std::vector<std::string>& v) -> std::string {
    if (v.empty()) return "must name at least one of dp, elastic_dp, decoupled";
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] != "dp" && v[i] != "elastic_dp" && v[i] != "decoupled")
        return "every element must be one of dp, elastic_dp, decoupled";
      for (size_t j = 0; j < i; ++j)
        if (v[j] == v[i]) return "must not name a strategy twice";
    }
    return "";
  };
}
// A non-empty list with every element in [lo, hi].
template <typename T>
config_schema::Check<std::vector<T>> list_in(T lo, T hi) {
  return [lo, hi](const std::vector<T>& v) -> std::string {
    if (v.empty()) return "must not be empty";
    for (const T& x : v)
      if (x < lo || x > hi) return fmt::format("every element must be in [{}, {}]", lo, hi);
    return "";
  };
}
config_schema::Check<int64_t> in_int64_range(int64_t lo, int64_t hi) {
  return [lo, hi](const int64_t& v) {
    return v >= lo && v <= hi ? std::string() : fmt::format("must be in [{}, {}]", lo, hi);
  };
}

const std::vector<Entry<SimConfig>>& entries() {
  static const std::vector<Entry<SimConfig>> table = {
      // sim
      SIM_FIELD(double, "sim.days", days, "simulated wall time of one run, days",
                in_range(0, 3650, true, false)),
      SIM_FIELD(int64_t, "sim.seed", seed, "seed of the fault trace and the chip speeds",
                in_int64_range(0, int64_t{1} << 53)),
      SIM_FIELD(int, "sim.repeats", repeats,
                "independent runs per result (seeds seed, seed+1, ...), averaged",
                config_schema::in_int_range(1, 1000)),
      SIM_FIELD(std::vector<std::string>, "sim.strategies", strategies,
                "what `ddiloco simulate` runs: dp, elastic_dp, decoupled", strategy_list()),
      // chips
      SIM_FIELD(int64_t, "chips.count", chips, "N, chips allocated for the whole run",
                in_int64_range(1, kMaxChips)),
      SIM_FIELD(bool, "chips.failures", failures, "false: no chip ever fails"),
      SIM_FIELD(double, "chips.mtbi_hours", mtbi_hours,
                "mean time between interruptions of one chip, hours (Poisson failures)",
                positive<double>()),
      SIM_FIELD(std::string, "chips.recovery", recovery,
                "distribution of the time until a failed chip is back: fixed | exponential | "
                "lognormal",
                one_of({"fixed", "exponential", "lognormal"})),
      SIM_FIELD(double, "chips.recovery_minutes", recovery_minutes,
                "mean time until a failed chip is back (repaired or replaced), minutes",
                positive<double>()),
      SIM_FIELD(double, "chips.recovery_sigma", recovery_sigma,
                "lognormal recovery: σ of the log of the recovery time",
                in_range(0, 5, false, false)),
      SIM_FIELD(double, "chips.speed_sigma", speed_sigma,
                "chip speed variance: step-time factor exp(σ·|z|), z ~ N(0,1); a group steps "
                "at its slowest chip; 0 = all chips equal",
                in_range(0, 2, false, false)),
      // train
      SIM_FIELD(double, "train.step_seconds", step_seconds,
                "one inner step of a synchronous group at nominal speed, seconds",
                in_range(1e-3, 1e6, false, false)),
      // dp
      SIM_FIELD(double, "dp.checkpoint_minutes", checkpoint_minutes,
                "dp: compute between checkpoints, minutes; 0 = Young-Daly optimum "
                "sqrt(2 * checkpoint_seconds * job MTBF)",
                at_least(0.0)),
      SIM_FIELD(double, "dp.checkpoint_seconds", checkpoint_seconds,
                "dp: writing one checkpoint, seconds (every chip waits); a failure loses the "
                "work since the last one",
                at_least(0.0)),
      SIM_FIELD(double, "dp.restart_seconds", restart_seconds,
                "dp: restart from the checkpoint once every failed chip is back, seconds",
                at_least(0.0)),
      // elastic
      SIM_FIELD(double, "elastic.rescale_seconds", rescale_seconds,
                "elastic_dp and elastic units: pause of every chip of the group when a chip "
                "leaves or rejoins, seconds",
                at_least(0.0)),
      SIM_FIELD(double, "elastic.checkpoint_seconds", elastic_checkpoint_seconds,
                "elastic_dp and elastic units: writing one in-memory checkpoint, seconds (every "
                "chip of the group waits); a failure rolls the survivors back to the last one "
                "(Pathways elastic training); 0 with checkpoint_minutes 0 = every completed "
                "step is kept, a failure costs only the step in progress",
                at_least(0.0)),
      SIM_FIELD(double, "elastic.checkpoint_minutes", elastic_checkpoint_minutes,
                "elastic_dp and elastic units: compute between in-memory checkpoints, minutes; "
                "0 = Young-Daly optimum sqrt(2 * elastic.checkpoint_seconds * group MTBF)",
                at_least(0.0)),
      // decoupled
      SIM_FIELD(int, "decoupled.learners", learners, "M, learner units of N/M chips",
                config_schema::in_int_range(1, 4096)),
      SIM_FIELD(int, "decoupled.quorum", quorum, "K, fresh snapshots needed for a merge",
                config_schema::in_int_range(1, 4096)),
      SIM_FIELD(int, "decoupled.h", h, "H, inner steps between two snapshots of a unit",
                config_schema::in_int_range(1, 1'000'000)),
      SIM_FIELD(int, "decoupled.overlap", overlap,
                "τ, inner steps a merge may take to come back (grace window budget)",
                config_schema::in_int_range(0, 1'000'000)),
      SIM_FIELD(double, "decoupled.grace_gamma", grace_gamma,
                "γ of the adaptive grace window g = clamp(γ(τ·ξ_step − ξ_quorum − ξ_sync), 0, "
                "cap)",
                in_range(0, 1, false, false)),
      SIM_FIELD(double, "decoupled.grace_cap_steps", grace_cap_steps,
                "cap of the grace window, inner steps", at_least(0.0)),
      SIM_FIELD(double, "decoupled.merge_seconds", merge_seconds,
                "ξ_sync: one merge and its transfer, seconds", at_least(0.0)),
      SIM_FIELD(std::string, "decoupled.on_chip_failure", on_chip_failure,
                "elastic: the unit pauses and goes on with its other chips | down: the unit "
                "stops until its chips are back, loses its unmerged work, rejoins from Θ",
                one_of({"elastic", "down"})),
      SIM_FIELD(double, "decoupled.rejoin_seconds", rejoin_seconds,
                "down units: fetch Θ and restart once the chips are back, seconds",
                at_least(0.0)),
      // calibration
      SIM_FIELD(std::vector<int64_t>, "calibration.chips", calibration_chips,
                "--calibrate: the two chip counts the paper reports (columns fitted)",
                list_in<int64_t>(1, kMaxChips)),
      SIM_FIELD(std::vector<double>, "calibration.dp", calibration_dp,
                "--calibrate: the paper's dp goodput at each calibration.chips (fits "
                "dp.checkpoint_seconds and chips.recovery_minutes)",
                list_in<double>(0, 1)),
      SIM_FIELD(std::vector<double>, "calibration.elastic_dp", calibration_elastic_dp,
                "--calibrate: the paper's elastic_dp goodput at each calibration.chips (fits "
                "elastic.checkpoint_seconds and elastic.rescale_seconds)",
                list_in<double>(0, 1)),
      SIM_FIELD(std::vector<double>, "calibration.decoupled", calibration_decoupled,
                "--calibrate: the paper's decoupled goodputs at calibration.chips[0], one per "
                "sweep.learners (compared, not fitted)",
                list_in<double>(0, 1)),
      SIM_FIELD(int, "calibration.headline_learners", calibration_headline_learners,
                "--calibrate: M of the paper's decoupled goodput at calibration.chips[1]",
                config_schema::in_int_range(1, 4096)),
      SIM_FIELD(double, "calibration.headline_decoupled", calibration_headline_decoupled,
                "--calibrate: the paper's decoupled goodput with calibration.headline_learners "
                "units at calibration.chips[1] (compared, not fitted)",
                in_range(0, 1, true, true)),
      // sweep
      SIM_FIELD(std::vector<int64_t>, "sweep.chips", sweep_chips,
                "--sweep: the chip counts (columns)", list_in<int64_t>(1, kMaxChips)),
      SIM_FIELD(std::vector<int>, "sweep.learners", sweep_learners,
                "--sweep: the values of M for decoupled (rows)", list_in<int>(1, 4096)),
  };
  return table;
}

#undef SIM_FIELD

}  // namespace

void validate(const SimConfig& c, const std::string& source) {
  if (c.learners > c.chips)
    fail("{}: decoupled.learners: must be ≤ chips.count = {}, got {}", source, c.chips,
         c.learners);
  if (c.quorum > c.learners)
    fail("{}: decoupled.quorum: must be ≤ decoupled.learners = {}, got {}", source, c.learners,
         c.quorum);
  for (int m : c.sweep_learners)
    for (int64_t n : c.sweep_chips)
      if (m > n)
        fail("{}: sweep.learners: {} units need at least {} chips, sweep.chips has {}", source,
             m, m, n);
  // Bound the work of one result (events × the O(M) cost of each, × repeats) so that a
  // typo does not run for hours: about 4e8 group updates a second on one core here.
  // Checkpoints are not events (a group's compute / checkpoint cycle is accounted in
  // closed form between events), so only failures and publishes count.
  const auto check_work = [&](const char* strategy, int64_t chips, int learners) {
    const double seconds = c.days * 86400;
    const double failures =
        c.failures ? static_cast<double>(chips) * seconds / (c.mtbi_hours * 3600) : 0;
    double events = 4 * failures;  // failure, recovery, and a pause end after each
    const std::string name = strategy;
    if (name == "decoupled")
      events += static_cast<double>(learners) * seconds / (c.h * c.step_seconds);
    const double work = events * (learners + 1) * c.repeats;
    if (work > kMaxWork)
      fail("{}: {} on {} chips{}: about {:.2g} event-unit updates over sim.days = {} and "
           "sim.repeats = {}, more than the {:.0e} (about ten seconds) allowed per result; "
           "lower sim.days, sim.repeats or the units, or raise train.step_seconds or "
           "decoupled.h",
           source, strategy, chips,
           name == "decoupled" ? fmt::format(" with {} units", learners) : std::string(),
           work, c.days, c.repeats, kMaxWork);
  };
  // (sweep() checks each of its cells the same way before running any.)
  for (const auto& strategy : c.strategies)
    check_work(strategy.c_str(), c.chips, strategy == "decoupled" ? c.learners : 1);
}

Distribution SimConfig::recovery_distribution() const {
  if (recovery == "exponential") return Distribution::exponential;
  if (recovery == "lognormal") return Distribution::lognormal;
  return Distribution::fixed;
}

namespace {
// Young (1974), Daly (2006): the first-order optimum √(2·δ·MTBF) of compute between two
// saves costing δ each, for the failure rate of `group_chips` chips; infinite without
// failures.
double young_daly_s(const SimConfig& c, double save_s, int64_t group_chips) {
  if (!c.failures) return std::numeric_limits<double>::infinity();
  const double group_mtbf_s = c.mtbi_hours * 3600 / static_cast<double>(group_chips);
  return std::sqrt(2 * save_s * group_mtbf_s);
}
}  // namespace

double SimConfig::checkpoint_interval_s() const {
  if (checkpoint_minutes > 0) return checkpoint_minutes * 60;
  return young_daly_s(*this, checkpoint_seconds, chips);
}

double SimConfig::elastic_checkpoint_interval_s(int64_t group_chips) const {
  if (elastic_checkpoint_minutes > 0) return elastic_checkpoint_minutes * 60;
  return young_daly_s(*this, elastic_checkpoint_seconds, group_chips);
}

SimConfig load_sim_config(const std::string& path, const std::vector<std::string>& overrides) {
  SimConfig c;
  std::string source = "defaults";
  if (!path.empty()) {
    source = path;
    if (!std::filesystem::exists(path)) fail("{}: config file not found", path);
    YAML::Node root;
    try {
      root = YAML::LoadFile(path);
    } catch (const YAML::Exception& ex) {
      fail("{}: line {}: {}", path, ex.mark.line + 1, ex.msg);
    }
    config_schema::load_node(entries(), kListHint, c, root, "", path);
  }
  for (const auto& o : overrides) config_schema::apply_override(entries(), kListHint, c, o, "--set");
  validate(c, overrides.empty() ? source : source + " with --set");
  return c;
}

std::string to_yaml(const SimConfig& config) { return config_schema::to_yaml(entries(), config); }

std::vector<SimKeyDoc> sim_config_keys(const SimConfig& config) {
  std::vector<SimKeyDoc> docs;
  for (const auto& e : entries())
    if (e.removed.empty()) docs.push_back({e.key, e.show(config), e.doc});
  return docs;
}

}  // namespace ddiloco::sim
