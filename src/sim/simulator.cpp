// The goodput simulator's event loop: a fault trace (chip failures and recoveries), the
// groups of chips that train synchronously (the dp job, the elastic job, or each learner
// unit), and for decoupled the syncer's quorum and grace window. Model: simulate.hpp.
//
// Time advances from event to event; between events every group's chip-time accrues at
// constant rates (chips up, chips failed, its slowest chip), so a month on millions of chips
// costs a few hundred thousand events, not per-step work.
#include "ddiloco/simulate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <queue>
#include <unordered_set>

#include "ddiloco/error.hpp"
#include "ddiloco/rng.hpp"

namespace ddiloco::sim {

namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();
constexpr double kHour = 3600.0;

// Chip failures and recoveries, a function of the seed and the chips.* keys only: the same
// trace for every strategy. Failures of the N − f healthy chips form a Poisson process of
// rate λ·(N − f); after any change of f the next failure is redrawn (memorylessness makes
// that exact). The failed chip is uniform over the healthy ones.
class FaultTrace {
 public:
  FaultTrace(const SimConfig& c, uint64_t seed)
      : chips_(c.chips),
        rate_(c.failures ? 1.0 / (c.mtbi_hours * kHour) : 0.0),
        recovery_(c.recovery_distribution()),
        recovery_mean_s_(c.recovery_minutes * 60.0),
        recovery_sigma_(c.recovery_sigma),
        rng_(mix_seed(seed, 0x5EED'FA17)) {
    draw_next_failure(0.0);
  }

  struct Event {
    double time;
    bool failure;  // else a recovery
    int64_t chip;
  };

  double next_time() const {
    const double r = recoveries_.empty() ? kNever : recoveries_.top().first;
    return std::min(next_failure_, r);
  }

  Event pop() {
    const double r = recoveries_.empty() ? kNever : recoveries_.top().first;
    if (next_failure_ <= r) {
      const double t = next_failure_;
      int64_t chip = 0;
      do chip = static_cast<int64_t>(rng_.below(static_cast<uint64_t>(chips_)));
      while (failed_.contains(chip));
      failed_.insert(chip);
      recoveries_.push({t + draw_recovery(), chip});
      draw_next_failure(t);
      return {t, true, chip};
    }
    const auto [t, chip] = recoveries_.top();
    recoveries_.pop();
    failed_.erase(chip);
    draw_next_failure(t);
    return {t, false, chip};
  }

 private:
  void draw_next_failure(double now) {
    const double healthy = static_cast<double>(chips_ - static_cast<int64_t>(failed_.size()));
    if (rate_ <= 0 || healthy <= 0) {
      next_failure_ = kNever;
      return;
    }
    next_failure_ = now - std::log1p(-rng_.uniform()) / (rate_ * healthy);
  }

  double draw_recovery() {
    switch (recovery_) {
      case Distribution::fixed: return recovery_mean_s_;
      case Distribution::exponential: return -std::log1p(-rng_.uniform()) * recovery_mean_s_;
      case Distribution::lognormal: {
        // mean = exp(μ + σ²/2), so μ = ln(mean) − σ²/2.
        const double mu = std::log(recovery_mean_s_) - 0.5 * recovery_sigma_ * recovery_sigma_;
        return std::exp(mu + recovery_sigma_ * rng_.normal());
      }
    }
    return recovery_mean_s_;
  }

  using Pending = std::pair<double, int64_t>;  // (time back, chip)
  int64_t chips_;
  double rate_;
  Distribution recovery_;
  double recovery_mean_s_, recovery_sigma_;
  Rng rng_;
  double next_failure_ = kNever;
  std::unordered_set<int64_t> failed_;
  std::priority_queue<Pending, std::vector<Pending>, std::greater<Pending>> recoveries_;
};

// Per-chip step-time factors exp(σ·|z|) ≥ 1 (nominal speed is a chip's best), redrawn when a chip is replaced; only kept when
// σ > 0. Own stream, so the fault trace does not depend on it.
class ChipSpeeds {
 public:
  ChipSpeeds(const SimConfig& c, uint64_t seed)
      : sigma_(c.speed_sigma), rng_(mix_seed(seed, 0x5EED'5BEED)) {
    if (sigma_ > 0) {
      factor_.resize(static_cast<size_t>(c.chips));
      for (auto& f : factor_) f = static_cast<float>(draw());
    }
  }
  bool varied() const { return sigma_ > 0; }
  double factor(int64_t chip) const { return varied() ? factor_[chip] : 1.0; }
  /// Redraws `chip`'s factor; returns the new one.
  double replace(int64_t chip) {
    if (!varied()) return 1.0;
    factor_[chip] = static_cast<float>(draw());
    return factor_[chip];
  }

 private:
  double draw() { return std::exp(sigma_ * std::fabs(rng_.normal())); }
  double sigma_;
  Rng rng_;
  std::vector<float> factor_;
};

// How a group's work becomes useful.
enum class Commit {
  continuous,  // elastic_dp: as it is done (only a step in progress can be lost)
  checkpoint,  // dp: when a checkpoint completes
  merge,       // decoupled: when the syncer merges the snapshot that holds it
};
// What a failed chip does to its group.
enum class OnFailure {
  restart,  // every chip stops until all are back, then a restart (state since the last
            // checkpoint or merge is lost)
  elastic,  // the step in progress is lost, a re-scale pause, then the survivors go on
};
enum class State { running, writing, paused, down, restarting };

// Chip-time of work not yet useful; moved to ChipTime::useful (and straggler, checkpoint)
// when committed, or to ChipTime::lost.
struct AtRisk {
  double compute = 0, straggler = 0, checkpoint = 0;
  void add(const AtRisk& o) {
    compute += o.compute;
    straggler += o.straggler;
    checkpoint += o.checkpoint;
  }
};

// Chips [lo, hi) training synchronously.
struct Group {
  int64_t lo = 0, hi = 0;
  int64_t failed = 0;
  State state = State::running;
  double until = kNever;  // end of a pause, restart or checkpoint write
  double slow = 1;        // step-time factor of the slowest chip
  int64_t slow_chip = -1;
  double steps = 0;       // inner steps since the segment or round began (fractional)
  double segment_steps = 0;  // dp: steps of this checkpoint segment, set when it begins
  AtRisk unpublished;     // merge: since the last snapshot; checkpoint: since the last one
  AtRisk published;       // merge: in a snapshot the syncer has not merged yet
  int64_t size() const { return hi - lo; }
  int64_t up() const { return hi - lo - failed; }
  bool computing() const { return state == State::running && up() > 0; }
  bool live() const { return state != State::down && state != State::restarting; }
};

class Simulation {
 public:
  Simulation(const SimConfig& c, Strategy s, uint64_t seed)
      : c_(c), trace_(c, seed), speeds_(c, seed) {
    const int M = s == Strategy::decoupled ? c.learners : 1;
    quorum_ = s == Strategy::decoupled ? c.quorum : 1;
    commit_ = s == Strategy::dp ? Commit::checkpoint
              : s == Strategy::elastic_dp ? Commit::continuous
                                          : Commit::merge;
    on_failure_ = s == Strategy::dp ? OnFailure::restart
                  : s == Strategy::elastic_dp ? OnFailure::elastic
                  : c.on_chip_failure == "down" ? OnFailure::restart
                                                : OnFailure::elastic;
    restart_s_ = s == Strategy::dp ? c.restart_seconds : c.rejoin_seconds;
    interval_s_ = s == Strategy::dp ? c.checkpoint_interval_s() : kNever;
    groups_.resize(static_cast<size_t>(M));
    for (int m = 0; m < M; ++m) {
      Group& g = groups_[m];
      g.lo = c.chips * m / M;
      g.hi = c.chips * (m + 1) / M;
      rescan_slowest(g);
      begin_segment(g);
    }
    fresh_.assign(static_cast<size_t>(M), false);
    result_.quorum_sizes.assign(static_cast<size_t>(M + 1), 0);
  }

  SimResult run() {
    const double horizon = c_.days * 24 * kHour;
    for (;;) {
      const double t_fault = trace_.next_time();
      double t_group = kNever;
      size_t g_next = 0;
      for (size_t i = 0; i < groups_.size(); ++i) {
        const double t = next_event(groups_[i]);
        if (t < t_group) {
          t_group = t;
          g_next = i;
        }
      }
      const double t = std::min({t_fault, t_group, grace_deadline_});
      if (t >= horizon) break;
      ++result_.events;
      advance_all(t);
      if (t_group <= t_fault && t_group <= grace_deadline_)
        group_event(g_next, t);
      else if (grace_deadline_ <= t_fault)
        grace_expired();
      else
        fault_event(trace_.pop());
    }
    advance_all(horizon);
    // The end of the job. dp's work since its last checkpoint is in the model (only at risk
    // until then). Units' work reaches the global model in a last merge of the live units,
    // as the runtime's final flush does, if they make a quorum; otherwise it stays pending:
    // a model that stopped merging shows in goodput instead of being credited at the end.
    int live = 0;
    for (const Group& g : groups_) live += g.live() ? 1 : 0;
    const bool final_merge = commit_ != Commit::merge || live >= quorum_;
    for (Group& g : groups_) {
      g.unpublished.add(g.published);
      g.published = AtRisk{};
      if (final_merge) {
        commit(g.unpublished);
      } else {
        ct_.pending += g.unpublished.compute + g.unpublished.straggler;
        g.unpublished = AtRisk{};
      }
    }
    result_.wall_seconds = horizon;
    const double allocated = static_cast<double>(c_.chips) * horizon;
    result_.goodput = allocated > 0 ? ct_.useful / allocated : 0;
    result_.uptime = horizon > 0 ? uptime_s_ / horizon : 0;
    result_.chip_time = ct_;
    result_.checkpoint_interval_s = interval_s_;
    return result_;
  }

 private:
  size_t group_of(int64_t chip) const {
    const int64_t M = static_cast<int64_t>(groups_.size());
    // Inverse of lo = N·m/M; the correction covers the rounding.
    size_t m = static_cast<size_t>(chip * M / c_.chips);
    while (m + 1 < groups_.size() && chip >= groups_[m + 1].lo) ++m;
    while (m > 0 && chip < groups_[m].lo) --m;
    return m;
  }

  double step_wall(const Group& g) const { return c_.step_seconds * g.slow; }

  // A new checkpoint segment (dp) or round: the interval is compute time, so it is counted in
  // steps at the group's current speed.
  void begin_segment(Group& g) const {
    g.steps = 0;
    g.segment_steps = std::isfinite(interval_s_)
                          ? std::max(1.0, std::round(interval_s_ / step_wall(g)))
                          : kNever;
  }

  double next_event(const Group& g) const {
    switch (g.state) {
      case State::writing:
      case State::paused:
      case State::restarting: return g.until;
      case State::down: return kNever;
      case State::running: {
        if (g.up() <= 0) return kNever;
        const double target = commit_ == Commit::merge        ? c_.h
                              : commit_ == Commit::checkpoint ? g.segment_steps
                                                              : kNever;
        if (!std::isfinite(target)) return kNever;
        return now_ + std::max(0.0, target - g.steps) * step_wall(g);
      }
    }
    return kNever;
  }

  // Accrues every group's chip-time and the model's uptime from now_ to t.
  void advance_all(double t) {
    const double dt = t - now_;
    if (dt <= 0) return;
    int computing = 0;
    for (Group& g : groups_) {
      const double up = static_cast<double>(g.up());
      const double failed = static_cast<double>(g.failed);
      switch (g.state) {
        case State::running:
          if (g.up() > 0) {
            g.unpublished.compute += up * dt / g.slow;
            g.unpublished.straggler += up * dt * (1 - 1 / g.slow);
            g.steps += dt / step_wall(g);
            ++computing;
          }
          ct_.down += failed * dt;
          break;
        case State::writing:
          g.unpublished.checkpoint += up * dt;
          ct_.down += failed * dt;
          break;
        case State::paused:
          ct_.paused += up * dt;
          ct_.down += failed * dt;
          break;
        case State::down:
        case State::restarting: ct_.down += static_cast<double>(g.size()) * dt; break;
      }
      if (commit_ == Commit::continuous) commit(g.unpublished);
    }
    if (computing >= quorum_) uptime_s_ += dt;
    now_ = t;
  }

  void commit(AtRisk& w) {
    ct_.useful += w.compute;
    ct_.straggler += w.straggler;
    ct_.checkpoint += w.checkpoint;
    w = AtRisk{};
  }
  void lose(AtRisk& w) {
    ct_.lost += w.compute + w.straggler + w.checkpoint;
    w = AtRisk{};
  }

  void pause(Group& g, double t) {
    g.until = g.state == State::paused ? std::max(g.until, t + c_.rescale_seconds)
                                       : t + c_.rescale_seconds;
    g.state = State::paused;
  }

  void fault_event(const FaultTrace::Event& e) {
    const size_t m = group_of(e.chip);
    Group& g = groups_[m];
    const double t = e.time;
    if (e.failure) {
      ++result_.failures;
      // A step is in progress while running, and also through a pause for a rejoin.
      const bool in_step = (g.state == State::running || g.state == State::paused) && g.up() > 0;
      ++g.failed;
      if (on_failure_ == OnFailure::restart) {
        if (g.state == State::down) return;
        if (g.live()) {
          // The state since the last checkpoint or merge is gone, and so is a snapshot
          // the syncer has not merged yet.
          lose(g.unpublished);
          lose(g.published);
          g.steps = 0;
          unit_lost(m, t);
        }
        g.state = State::down;
        g.until = kNever;
        return;
      }
      // Elastic: the step in progress is aborted on every chip that was computing it. Its
      // chip-time is taken at the current chip count and speed, which a rejoin or a speed
      // change earlier in the same step makes slightly off (by at most one step of the
      // chips that changed); the totals stay exact.
      if (in_step) {
        const double partial = g.steps - std::floor(g.steps);
        const double up_before = static_cast<double>(g.up() + 1);
        const double wall = partial * step_wall(g);
        AtRisk step{up_before * wall / g.slow, up_before * wall * (1 - 1 / g.slow), 0};
        if (commit_ == Commit::continuous) {
          ct_.useful -= step.compute;
          ct_.straggler -= step.straggler;
        } else {
          g.unpublished.compute -= step.compute;
          g.unpublished.straggler -= step.straggler;
        }
        ct_.lost += step.compute + step.straggler;
        g.steps = std::floor(g.steps);
      }
      if (g.state == State::running || g.state == State::paused) pause(g, t);
      return;
    }
    // Recovery: the chip (or its replacement) is back, with a new speed.
    --g.failed;
    const double f = speeds_.replace(e.chip);
    if (speeds_.varied()) {
      if (e.chip == g.slow_chip)
        rescan_slowest(g);
      else if (f > g.slow) {
        g.slow = f;
        g.slow_chip = e.chip;
      }
    }
    if (on_failure_ == OnFailure::restart) {
      if (g.state == State::down && g.failed == 0) {
        g.state = State::restarting;
        g.until = t + restart_s_;
      }
      return;
    }
    if (g.state == State::running || g.state == State::paused) pause(g, t);
  }

  void group_event(size_t m, double t) {
    Group& g = groups_[m];
    switch (g.state) {
      case State::paused:
        g.state = State::running;
        g.until = kNever;
        return;
      case State::restarting:
        g.state = State::running;
        g.until = kNever;
        begin_segment(g);  // from the last checkpoint, or (a unit) from Θ
        return;
      case State::writing:
        commit(g.unpublished);
        ++result_.checkpoints;
        g.state = State::running;
        g.until = kNever;
        begin_segment(g);
        return;
      case State::running:
        g.steps = 0;
        if (commit_ == Commit::checkpoint) {
          g.state = State::writing;
          g.until = t + c_.checkpoint_seconds;
          return;
        }
        publish(m, t);
        return;
      case State::down: return;
    }
  }

  // ---- the syncer (decoupled) ----
  void publish(size_t m, double t) {
    Group& g = groups_[m];
    g.published.add(g.unpublished);
    g.unpublished = AtRisk{};
    if (!fresh_[m]) {
      fresh_[m] = true;
      if (++fresh_count_ == 1) first_fresh_ = t;
    }
    try_merge(t);
  }

  void unit_lost(size_t m, double t) {
    if (commit_ != Commit::merge || !fresh_[m]) return;
    fresh_[m] = false;
    --fresh_count_;
    if (std::isfinite(grace_deadline_)) try_merge(t);
  }

  bool all_live_fresh() const {
    for (size_t m = 0; m < groups_.size(); ++m)
      if (groups_[m].live() && !fresh_[m]) return false;
    return true;
  }

  // Quorum K reached: merge at once if every live unit has reported, else open the grace
  // window g = clamp(γ·(τ·ξ_step − ξ_quorum − ξ_sync), 0, cap·ξ_step) (paper_notes.md).
  void try_merge(double t) {
    if (fresh_count_ < quorum_) return;
    if (all_live_fresh()) {
      merge();
      return;
    }
    if (std::isfinite(grace_deadline_)) return;
    double step = 0;
    for (const Group& g : groups_)
      if (g.live()) step = std::max(step, step_wall(g));
    const double quorum_wait = t - first_fresh_;
    const double grace = std::clamp(
        c_.grace_gamma * (c_.overlap * step - quorum_wait - c_.merge_seconds), 0.0,
        c_.grace_cap_steps * step);
    if (grace <= 0)
      merge();
    else
      grace_deadline_ = t + grace;
  }

  void grace_expired() {
    grace_deadline_ = kNever;
    if (fresh_count_ >= quorum_) merge();
  }

  void merge() {
    for (size_t m = 0; m < groups_.size(); ++m) {
      if (!fresh_[m]) continue;
      commit(groups_[m].published);
      fresh_[m] = false;
    }
    ++result_.quorum_sizes[static_cast<size_t>(fresh_count_)];
    ++result_.merges;
    fresh_count_ = 0;
    grace_deadline_ = kNever;
  }

  void rescan_slowest(Group& g) {
    g.slow = 1;
    g.slow_chip = -1;
    if (!speeds_.varied()) return;
    g.slow = 0;
    for (int64_t i = g.lo; i < g.hi; ++i)
      if (speeds_.factor(i) > g.slow) {
        g.slow = speeds_.factor(i);
        g.slow_chip = i;
      }
  }

  const SimConfig& c_;
  FaultTrace trace_;
  ChipSpeeds speeds_;
  Commit commit_ = Commit::continuous;
  OnFailure on_failure_ = OnFailure::elastic;
  int quorum_ = 1;
  double restart_s_ = 0;
  double interval_s_ = kNever;  // dp: compute (wall) seconds between checkpoints
  std::vector<Group> groups_;
  std::vector<bool> fresh_;
  int fresh_count_ = 0;
  double first_fresh_ = 0;
  double grace_deadline_ = kNever;
  double now_ = 0;
  double uptime_s_ = 0;
  ChipTime ct_;
  SimResult result_;
};

}  // namespace

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::dp: return "dp";
    case Strategy::elastic_dp: return "elastic_dp";
    case Strategy::decoupled: return "decoupled";
  }
  return "?";
}

Strategy parse_strategy(const std::string& name, const std::string& source) {
  for (Strategy s : {Strategy::dp, Strategy::elastic_dp, Strategy::decoupled})
    if (name == strategy_name(s)) return s;
  fail("{}: unknown strategy '{}', expected dp, elastic_dp or decoupled", source, name);
}

SimResult simulate(const SimConfig& config, Strategy strategy) {
  validate(config, "simulate");
  const auto start = std::chrono::steady_clock::now();
  SimResult total;
  std::vector<double> goodputs;
  double uptime = 0;
  for (int r = 0; r < config.repeats; ++r) {
    Simulation sim(config, strategy, static_cast<uint64_t>(config.seed) + static_cast<uint64_t>(r));
    const SimResult one = sim.run();
    if (r == 0) {
      total = one;
    } else {
      total.chip_time.useful += one.chip_time.useful;
      total.chip_time.lost += one.chip_time.lost;
      total.chip_time.down += one.chip_time.down;
      total.chip_time.paused += one.chip_time.paused;
      total.chip_time.checkpoint += one.chip_time.checkpoint;
      total.chip_time.straggler += one.chip_time.straggler;
      total.chip_time.pending += one.chip_time.pending;
      total.failures += one.failures;
      total.checkpoints += one.checkpoints;
      total.merges += one.merges;
      total.events += one.events;
      for (size_t k = 0; k < one.quorum_sizes.size(); ++k)
        total.quorum_sizes[k] += one.quorum_sizes[k];
    }
    goodputs.push_back(one.goodput);
    uptime += one.uptime;
  }
  double mean = 0;
  for (double g : goodputs) mean += g;
  mean /= static_cast<double>(goodputs.size());
  double var = 0;
  for (double g : goodputs) var += (g - mean) * (g - mean);
  total.goodput = mean;
  total.goodput_stddev =
      goodputs.size() > 1 ? std::sqrt(var / static_cast<double>(goodputs.size() - 1)) : 0;
  total.uptime = uptime / config.repeats;
  total.strategy = strategy;
  total.chips = config.chips;
  total.learners = strategy == Strategy::decoupled ? config.learners : 1;
  total.quorum = strategy == Strategy::decoupled ? config.quorum : 1;
  total.repeats = config.repeats;
  if (strategy != Strategy::decoupled) total.quorum_sizes.clear();
  total.run_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return total;
}

namespace {
std::vector<std::pair<SimConfig, Strategy>> sweep_cells(const SimConfig& config) {
  std::vector<std::pair<SimConfig, Strategy>> cells;
  for (int64_t n : config.sweep_chips) {
    SimConfig c = config;
    c.chips = n;
    c.strategies = {"dp"};
    cells.emplace_back(c, Strategy::dp);
    c.strategies = {"elastic_dp"};
    cells.emplace_back(c, Strategy::elastic_dp);
    c.strategies = {"decoupled"};
    for (int m : config.sweep_learners) {
      c.learners = m;
      c.quorum = std::min(config.quorum, m);
      cells.emplace_back(c, Strategy::decoupled);
    }
  }
  return cells;
}
}  // namespace

std::vector<SimResult> sweep(const SimConfig& config) {
  const auto cells = sweep_cells(config);
  // Every cell is checked before the first one runs.
  for (const auto& [c, s] : cells) validate(c, "--sweep");
  std::vector<SimResult> out;
  for (const auto& [c, s] : cells) out.push_back(simulate(c, s));
  return out;
}

double dp_goodput_closed_form(double lambda, double recovery_s, double restart_s,
                              double interval_s, double checkpoint_s) {
  if (lambda <= 0) return interval_s / (interval_s + checkpoint_s);
  const double down = (std::expm1(lambda * recovery_s) - std::expm1(-lambda * restart_s)) /
                      (lambda * std::exp(-lambda * restart_s));
  const double segment = std::expm1(lambda * (interval_s + checkpoint_s)) * (1 / lambda + down);
  return interval_s / segment;
}

nlohmann::json to_json(const SimResult& r) {
  nlohmann::json j = {
      {"strategy", strategy_name(r.strategy)},
      {"chips", r.chips},
      {"learners", r.learners},
      {"goodput", r.goodput},
  };
  if (r.strategy == Strategy::decoupled) j["quorum"] = r.quorum;
  j["goodput_stddev"] = r.goodput_stddev;
  j["uptime"] = r.uptime;
  j["repeats"] = r.repeats;
  j["simulated_days"] = r.wall_seconds / (24 * kHour);
  j["failures"] = r.failures;
  const double total = r.chip_time.total();
  auto share = [&](double x) { return total > 0 ? x / total : 0.0; };
  j["chip_time"] = {{"useful", share(r.chip_time.useful)},
                    {"lost", share(r.chip_time.lost)},
                    {"down", share(r.chip_time.down)},
                    {"paused", share(r.chip_time.paused)},
                    {"checkpoint", share(r.chip_time.checkpoint)},
                    {"straggler", share(r.chip_time.straggler)},
                    {"pending", share(r.chip_time.pending)}};
  if (r.strategy == Strategy::dp) {
    j["checkpoints"] = r.checkpoints;
    if (std::isfinite(r.checkpoint_interval_s))
      j["checkpoint_interval_s"] = r.checkpoint_interval_s;
    else
      j["checkpoint_interval_s"] = nullptr;
  }
  if (r.strategy == Strategy::decoupled) {
    j["merges"] = r.merges;
    j["quorum_sizes"] = r.quorum_sizes;
  }
  j["run_seconds"] = r.run_seconds;
  return j;
}

}  // namespace ddiloco::sim
