// Goodput simulator: a discrete-event model of one pre-training run on N chips that fail,
// for planning a deployment (learner units M, quorum K, checkpoint interval) before renting
// a cluster. It reproduces the comparison of the paper's chaos simulation (Douillard et al.
// 2026, arXiv 2604.21428, "Reported results"; docs/algorithm.md): data
// parallel without elasticity, elastic data parallel, and Decoupled DiLoCo, 150k–2.4M chips,
// every chip failing on average once a year.
//
// The model (docs/simulator.md "Goodput simulator" states it in full, with the source of each part):
//   * Faults. Chip failures are a Poisson process: each healthy chip fails at rate
//     1/chips.mtbi_hours; a failed chip is back (repaired, or replaced by a hot spare) after a
//     recovery time drawn from chips.recovery (fixed | exponential | lognormal). The fault
//     trace depends on sim.seed and the chips.* keys only, so every strategy faces the same
//     failures (common random numbers), and a unit is the chips [m·N/M, (m+1)·N/M).
//   * Speed. Optional per-chip speed variance (chips.speed_sigma): a chip's step-time factor
//     is exp(σ·|z|) ≥ 1, z ~ N(0,1) (nominal is a chip's best speed), redrawn when it is
//     replaced; a synchronous group steps at its slowest chip (a failed chip counts until it
//     is back).
//   * Saves. A group saves its state every so many steps of compute (a save point), every
//     chip of the group waiting while it is written: dp's checkpoints (dp.checkpoint_*), the
//     elastic groups' in-memory checkpoints (elastic.checkpoint_*); both at the Young–Daly
//     interval √(2·δ·MTBF) of the group by default. A failure throws away the work since the
//     group's last save point, a save interrupted by the failure included.
//   * dp: one group; any failure stops every chip until all failed chips are back, then a
//     restart (dp.restart_seconds, itself interruptible); it resumes from its last checkpoint.
//   * elastic_dp: one group; a failure rolls the survivors back to their last in-memory
//     checkpoint and pauses every chip for elastic.rescale_seconds (a failure during the pause
//     extends it), then the survivors continue; a recovered chip rejoins after another such
//     pause. With elastic.checkpoint_seconds 0 and elastic.checkpoint_minutes 0 the survivors
//     keep the state of the last completed step: a failure costs only the step in progress.
//   * decoupled: M units of N/M chips, each elastic on its own chips (in-memory checkpoints
//     included; a unit's publish is a save point too) or down until its chips are back
//     (decoupled.on_chip_failure); a down unit loses its state, i.e. the work since its last
//     merged snapshot, and rejoins from Θ (decoupled.rejoin_seconds). A unit publishes a
//     snapshot every H inner steps and never waits; the syncer merges once K units have fresh
//     snapshots and all live ones have reported or the adaptive grace window (docs/algorithm.md,
//     Syncer step 2) has passed. Work counts as useful once merged.
// At the end, dp's work is in the model; the live units' work reaches it in a last merge
// if they make a quorum, else it is pending, not useful.
// Outputs: goodput = useful chip-time ÷ allocated chip-time (N × wall time), the uptime of
// the global model (fraction of wall time it is not stalled by failures: the job up, or at
// least K units up; a routine save counts as up), where the rest of the chip-time went, and
// the quorum sizes of the merges.
//
// Between two events (a failure, a recovery, the end of a pause or restart, a publish, a
// grace deadline) every group runs at constant speed, so its saves are periodic and are
// accounted in closed form: the event count does not grow with the number of saves.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ddiloco::sim {

enum class Strategy { dp, elastic_dp, decoupled };
const char* strategy_name(Strategy s);
/// Throws ddiloco::Error naming `source` for anything but dp | elastic_dp | decoupled.
Strategy parse_strategy(const std::string& name, const std::string& source);

/// Recovery-time distribution of a failed chip.
enum class Distribution { fixed, exponential, lognormal };

struct SimConfig {
  // sim
  double days = 30;          ///< simulated wall time per run, days
  int64_t seed = 1;          ///< fault trace and chip speeds
  int repeats = 8;           ///< independent runs (seeds seed, seed+1, ...) averaged
  std::vector<std::string> strategies = {"dp", "elastic_dp", "decoupled"};
  // chips
  int64_t chips = 150'000;             ///< N, allocated for the whole run
  bool failures = true;                ///< false: no chip ever fails
  double mtbi_hours = 8760;            ///< mean time between interruptions of one chip, hours
  std::string recovery = "fixed";      ///< fixed | exponential | lognormal
  /// Mean time until a failed chip is back (repaired, or a hot spare swapped in), minutes.
  /// Fitted with dp.checkpoint_seconds to the paper's dp goodput at 150k and 1.2M chips
  /// (docs/simulator.md "Goodput simulator", calibration).
  double recovery_minutes = 0.02947;
  double recovery_sigma = 0.5;         ///< lognormal: σ of log(recovery time)
  double speed_sigma = 0;              ///< σ of a chip's log step-time factor; 0 = all equal
  // train
  double step_seconds = 5;  ///< one inner (data-parallel) step of a group at nominal speed
  // dp
  double checkpoint_minutes = 0;    ///< compute between checkpoints; 0 = Young–Daly optimum
  /// Writing one checkpoint, seconds (every chip paused). Fitted with chips.recovery_minutes.
  double checkpoint_seconds = 7.082;
  double restart_seconds = 10;      ///< restart from a checkpoint once every chip is back
  // elastic (elastic_dp, and decoupled units with on_chip_failure: elastic)
  /// Every chip of the group paused when a chip leaves or rejoins, seconds. Fitted with
  /// elastic.checkpoint_seconds to the paper's elastic dp goodput at 150k and 1.2M chips.
  double rescale_seconds = 5.085;
  /// Writing one in-memory checkpoint of an elastic group's state, seconds (every chip of the
  /// group paused); a failure rolls the survivors back to the last one, as Pathways' elastic
  /// training does with its snapshots. Fitted with elastic.rescale_seconds. 0 (with
  /// elastic_checkpoint_minutes 0): the survivors keep the state of the last completed step.
  double elastic_checkpoint_seconds = 0.9212;
  /// Compute between an elastic group's in-memory checkpoints, minutes; 0 = Young–Daly.
  double elastic_checkpoint_minutes = 0;
  // decoupled
  int learners = 4;                          ///< M units of N/M chips
  int quorum = 1;                            ///< K
  int h = 100;                               ///< inner steps between two snapshots
  int overlap = 2;                           ///< τ, in inner steps (grace window budget)
  double grace_gamma = 0.5;                  ///< γ of the adaptive grace window
  double grace_cap_steps = 1;                ///< grace window cap, in inner steps
  double merge_seconds = 1;                  ///< ξ_sync: one merge and its transfer
  std::string on_chip_failure = "elastic";   ///< elastic | down
  double rejoin_seconds = 10;                ///< down unit: fetch Θ and restart
  // calibration (`ddiloco simulate --calibrate`): the paper's goodputs at calibration.chips
  std::vector<int64_t> calibration_chips = {150'000, 1'200'000};
  std::vector<double> calibration_dp = {0.72, 0.27};          ///< per calibration.chips
  std::vector<double> calibration_elastic_dp = {0.88, 0.58};  ///< per calibration.chips
  /// At calibration.chips[0], per sweep.learners (compared, not fitted).
  std::vector<double> calibration_decoupled = {0.94, 0.96, 0.98, 0.99};
  /// At calibration.chips[1]: decoupled with this M (compared, not fitted).
  int calibration_headline_learners = 8;
  double calibration_headline_decoupled = 0.88;
  // sweep
  std::vector<int64_t> sweep_chips = {150'000, 300'000, 600'000, 1'200'000, 2'400'000};
  std::vector<int> sweep_learners = {2, 4, 8, 16};

  Distribution recovery_distribution() const;
  /// dp's compute between checkpoints, seconds: checkpoint_minutes, or with 0 the Young–Daly
  /// first-order optimum √(2·δ·MTBF) for the job's failure rate (Young 1974, Daly 2006);
  /// infinite without failures.
  double checkpoint_interval_s() const;
  /// An elastic group's compute between in-memory checkpoints, seconds, for a group of
  /// `group_chips`: elastic_checkpoint_minutes, or with 0 the Young–Daly optimum
  /// √(2·elastic_checkpoint_seconds·MTBF) of the group (0 when elastic_checkpoint_seconds is
  /// 0: every completed step is kept); infinite without failures.
  double elastic_checkpoint_interval_s(int64_t group_chips) const;
};

/// Loads a simulator config (YAML with sections sim, chips, train, dp, elastic, decoupled,
/// sweep; `ddiloco simulate --list` prints every key) plus `key=value` overrides; an empty
/// path gives the defaults. Throws ddiloco::Error naming the file or --set, the key and the
/// expected value.
SimConfig load_sim_config(const std::string& path, const std::vector<std::string>& overrides);
/// The checks load_sim_config makes beyond each key's own range: quorum ≤ learners ≤ chips,
/// and a bound on the work of each result of sim.strategies (events × units × repeats) so
/// that a typo does not run for hours; sweep() checks each of its cells the same way. Throws
/// ddiloco::Error naming `source` and the key.
void validate(const SimConfig& config, const std::string& source);
/// The effective config as YAML.
std::string to_yaml(const SimConfig& config);
struct SimKeyDoc {
  std::string key, default_value, doc;
};
std::vector<SimKeyDoc> sim_config_keys(const SimConfig& config = SimConfig{});

/// Where the allocated chip-time went, chip-seconds. The fields add up to chips × wall time.
struct ChipTime {
  double useful = 0;      ///< compute that reached the model (checkpointed, or merged)
  double lost = 0;        ///< compute thrown away: since the last save point, a lost unit
  double down = 0;        ///< chips idle: failed, or their group down or restarting
  double paused = 0;      ///< re-scale pauses
  double checkpoint = 0;  ///< writing checkpoints (dp's, and elastic groups' in memory)
  double straggler = 0;   ///< chips waiting for the slowest chip of their group
  /// At the end: units' compute (and its straggler wait) that no merge took because the live
  /// units were fewer than K. Not useful: a model that stopped merging shows here.
  double pending = 0;
  double total() const {
    return useful + lost + down + paused + checkpoint + straggler + pending;
  }
};

struct SimResult {
  Strategy strategy = Strategy::dp;
  int64_t chips = 0;
  int learners = 1;  ///< M (1 for dp and elastic_dp)
  int quorum = 1;
  int repeats = 1;
  double wall_seconds = 0;       ///< simulated, per run
  double goodput = 0;            ///< useful ÷ allocated chip-time, mean over repeats
  double goodput_stddev = 0;     ///< across repeats (0 with one)
  double uptime = 0;             ///< fraction of wall time not stalled by failures
  ChipTime chip_time;            ///< summed over repeats
  int64_t failures = 0;          ///< chip failures, summed over repeats
  int64_t checkpoints = 0;       ///< checkpoints completed (dp's, or an elastic group's)
  int64_t merges = 0;            ///< decoupled
  /// quorum_sizes[k] = merges that took k snapshots (k = 0..M), decoupled only.
  std::vector<int64_t> quorum_sizes;
  /// Compute between two checkpoints in use, seconds: dp's, or an elastic group's in-memory
  /// ones (a unit's, for decoupled); 0 = every step kept; infinite = never.
  double checkpoint_interval_s = 0;
  double run_seconds = 0;            ///< real time the simulation took, all repeats
  int64_t events = 0;                ///< events processed, all repeats (saves are not events)
};

/// One strategy on the config's chips (learners and quorum from the config for decoupled;
/// when M does not divide N the units differ by one chip), `config.repeats` runs, seeds
/// config.seed, config.seed + 1, ... Deterministic: the same config gives the same result.
/// Throws ddiloco::Error for a config validate() refuses (e.g. quorum > learners).
SimResult simulate(const SimConfig& config, Strategy strategy);

/// The paper-style grid: every chip count of sweep.chips × (dp, elastic_dp, decoupled for
/// each M of sweep.learners, K = min(quorum, M)), in that order. Every cell is validated
/// before the first runs (Error naming "--sweep" and the cell).
std::vector<SimResult> sweep(const SimConfig& config);

nlohmann::json to_json(const SimResult& r);

/// Throws Error (naming `source` and the key) unless `config` can be calibrated: two
/// calibration.chips, two goodputs each for dp and elastic dp, one per sweep.learners for
/// decoupled, failures on, every M ≤ calibration.chips[0], headline M ≤ calibration.chips[1].
void check_calibration(const SimConfig& config, const std::string& source);

/// `config` with dp.checkpoint_seconds and chips.recovery_minutes fitted to calibration.dp, then
/// elastic.checkpoint_seconds and elastic.rescale_seconds to calibration.elastic_dp (the goodput
/// at calibration.chips[0] and [1]; each pair by nested bisection, dp first: elastic dp's
/// rejoins depend on the recovery time). Throws Error where a target cannot be reached, or
/// check_calibration's errors.
SimConfig calibrate(SimConfig config, const std::string& source);

/// Closed-form goodput of dp with exponential failures of total rate Λ = N/MTBI, a fixed
/// recovery R, restart S and compute τ between checkpoints costing δ (all seconds), failures
/// possible while down and while restarting: downtime per failure
///   D = ((e^{ΛR} − 1) + (1 − e^{−ΛS})) / (Λ·e^{−ΛS}),
/// expected wall time per checkpointed segment E = (e^{Λ(τ+δ)} − 1)·(1/Λ + D), goodput τ/E.
/// (Renewal argument as in Daly 2006, with failures during recovery.) D depends on R and S
/// only through e^{Λ(R+S)}, and on the recovery distribution only through its mean (the
/// M/G/∞ busy period, Takács). The same form holds for elastic dp with in-memory
/// checkpoints and R < the re-scale pause s, with s in place of S: its pause ends R + s after
/// the last failure of a chain, every chip back.
double dp_goodput_closed_form(double lambda_per_s, double recovery_s, double restart_s,
                              double interval_s, double checkpoint_s);

}  // namespace ddiloco::sim
