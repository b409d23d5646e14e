// The goodput simulator's event loop: a fault trace (chip failures and recoveries), the
// groups of chips that train synchronously (the dp job, the elastic job, or each learner
// unit), and for decoupled the syncer's quorum and grace window. Model: simulate.hpp.
//
// Time advances from event to event; between events every group runs with constant chips
// up, chips failed and slowest chip, so its compute / checkpoint cycle is periodic and its
// chip-time is accounted in closed form, lazily, when an event touches it. A month on
// millions of chips costs a few hundred thousand events, not per-step or per-checkpoint work,
// and an event costs O(1) but for the scan of the M groups' next events.
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
// rate λ·(N − f); after a failure the next one is drawn afresh, and after a recovery the time
// left to it is scaled by the ratio of the rates (by memorylessness, a residual Exp(a) scaled
// by a/b is an Exp(b), independent of the past: exact, and one logarithm fewer per failure).
// The failed chip is uniform over the healthy ones.
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
    const double healthy_before = healthy();
    failed_.erase(chip);
    if (std::isfinite(next_failure_) && healthy_before > 0)
      next_failure_ = t + (next_failure_ - t) * (healthy_before / healthy());
    else
      draw_next_failure(t);
    return {t, false, chip};
  }

 private:
  double healthy() const {
    return static_cast<double>(chips_ - static_cast<int64_t>(failed_.size()));
  }

  void draw_next_failure(double now) {
    if (rate_ <= 0 || healthy() <= 0) {
      next_failure_ = kNever;
      return;
    }
    next_failure_ = now - std::log1p(-rng_.uniform()) / (rate_ * healthy());
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

// How a group's saved work becomes useful.
enum class Commit {
  save,   // dp and elastic_dp: when the checkpoint that holds it is written
  merge,  // decoupled: when the syncer merges the snapshot that holds it
};
// What a failed chip does to its group.
enum class OnFailure {
  restart,  // every chip stops until all are back, then a restart (state since the last
            // checkpoint or merge is lost)
  elastic,  // the survivors roll back to their last checkpoint, pause to re-scale, go on
};
enum class Mode { running, paused, down, restarting };

// Chip-time of work not yet useful; moved to ChipTime::useful (and straggler, checkpoint)
// when committed, or to ChipTime::lost.
struct AtRisk {
  double compute = 0, straggler = 0, checkpoint = 0;
  void add(const AtRisk& o, double times = 1) {
    compute += times * o.compute;
    straggler += times * o.straggler;
    checkpoint += times * o.checkpoint;
  }
};

// Chips [lo, hi) training synchronously. While running it cycles through `seg_steps` steps
// of compute and the write of a checkpoint (none when seg_steps is infinite); its chip-time
// is accounted lazily, up to `t`, whenever an event touches it.
struct Group {
  int64_t lo = 0, hi = 0;
  int64_t failed = 0;
  Mode mode = Mode::running;
  double until = kNever;  // end of a pause or restart
  double slow = 1;        // step-time factor of the slowest chip
  int64_t slow_chip = -1;
  double t = 0;           // chip-time accounted up to here
  double seg = 0;         // steps since the last save point (= seg_steps while writing)
  double seg_steps = kNever;  // steps between two save points
  double write_left = 0;  // > 0: writing a checkpoint, seconds left
  double round = 0;       // merge: steps since the unit's last publish
  AtRisk unsaved;         // since the last save point: what a failure loses
  AtRisk saved;           // merge: checkpointed, not yet published
  AtRisk published;       // merge: in a snapshot the syncer has not merged yet
  int64_t size() const { return hi - lo; }
  int64_t up() const { return hi - lo - failed; }
  bool computing() const { return mode == Mode::running && up() > 0; }
  bool live() const { return mode != Mode::down && mode != Mode::restarting; }
};

class Simulation {
 public:
  Simulation(const SimConfig& c, Strategy s, uint64_t seed)
      : c_(c), trace_(c, seed), speeds_(c, seed) {
    const int M = s == Strategy::decoupled ? c.learners : 1;
    quorum_ = s == Strategy::decoupled ? c.quorum : 1;
    commit_ = s == Strategy::decoupled ? Commit::merge : Commit::save;
    on_failure_ = s == Strategy::dp ? OnFailure::restart
                  : s == Strategy::elastic_dp ? OnFailure::elastic
                  : c.on_chip_failure == "down" ? OnFailure::restart
                                                : OnFailure::elastic;
    restart_s_ = s == Strategy::dp ? c.restart_seconds : c.rejoin_seconds;
    save_s_ = s == Strategy::dp ? c.checkpoint_seconds : c.elastic_checkpoint_seconds;
    // Without in-memory checkpoints an elastic group keeps every completed step: a save
    // point per step, not a checkpoint.
    checkpointing_ = s == Strategy::dp ||
                     c.elastic_checkpoint_seconds > 0 || c.elastic_checkpoint_minutes > 0;
    groups_.resize(static_cast<size_t>(M));
    for (int m = 0; m < M; ++m) {
      Group& g = groups_[m];
      g.lo = c.chips * m / M;
      g.hi = c.chips * (m + 1) / M;
      rescan_slowest(g);
      set_segment(g);
      next_.push_back(next_event(g));
      if (g.computing()) ++computing_;
    }
    // A unit that goes down restarts from Θ: it keeps no checkpoint of its own.
    if (s == Strategy::dp)
      interval_s_ = c.checkpoint_interval_s();
    else if (on_failure_ == OnFailure::elastic)
      interval_s_ = c.elastic_checkpoint_interval_s(groups_[0].size());
    fresh_.assign(static_cast<size_t>(M), false);
    result_.quorum_sizes.assign(static_cast<size_t>(M + 1), 0);
  }

  SimResult run() {
    const double horizon = c_.days * 24 * kHour;
    for (;;) {
      const double t_fault = trace_.next_time();
      double t_group = kNever;
      size_t g_next = 0;
      for (size_t i = 0; i < next_.size(); ++i)
        if (next_[i] < t_group) {
          t_group = next_[i];
          g_next = i;
        }
      const double t = std::min({t_fault, t_group, grace_deadline_});
      if (t >= horizon) break;
      ++result_.events;
      advance_uptime(t);
      if (t_group <= t_fault && t_group <= grace_deadline_)
        group_event(g_next, t);
      else if (grace_deadline_ <= t_fault)
        grace_expired();
      else
        fault_event(trace_.pop());
    }
    advance_uptime(horizon);
    for (Group& g : groups_) advance(g, horizon);
    // The end of the job. dp's and elastic dp's work since their last checkpoint is in the
    // model (only at risk until then). Units' work reaches the global model in a last merge
    // of the live units, as the runtime's final flush does, if they make a quorum; otherwise
    // it stays pending: a model that stopped merging shows in goodput instead of being
    // credited at the end.
    int live = 0;
    for (const Group& g : groups_) live += g.live() ? 1 : 0;
    const bool final_merge = commit_ != Commit::merge || live >= quorum_;
    for (Group& g : groups_) {
      g.unsaved.add(g.saved);
      g.unsaved.add(g.published);
      g.saved = g.published = AtRisk{};
      if (final_merge) {
        commit(g.unsaved);
      } else {
        ct_.pending += g.unsaved.compute + g.unsaved.straggler;
        ct_.checkpoint += g.unsaved.checkpoint;
        g.unsaved = AtRisk{};
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

  // The save interval is compute time, so it is counted in steps at the group's current
  // speed; it is set again whenever that speed changes.
  void set_segment(Group& g) const {
    const double interval_s =
        on_failure_ == OnFailure::restart
            ? (commit_ == Commit::merge ? kNever : c_.checkpoint_interval_s())
            : c_.elastic_checkpoint_interval_s(g.size());
    g.seg_steps = std::isfinite(interval_s)
                      ? std::max(1.0, std::round(interval_s / step_wall(g)))
                      : kNever;
  }

  // Seconds of wall time until a running unit has made `steps` more steps: the compute, the
  // checkpoint being written and those that start before (one that would start exactly
  // then does not: the publish is the save point).
  double time_for_steps(const Group& g, double steps) const {
    double time = g.write_left + steps * step_wall(g);
    if (std::isfinite(g.seg_steps) && save_s_ > 0) {
      const double first = g.write_left > 0 ? g.seg_steps : g.seg_steps - g.seg;
      constexpr double kEps = 1e-9;  // steps
      if (steps > first + kEps)
        time += (std::floor((steps - first - kEps) / g.seg_steps) + 1) * save_s_;
    }
    return time;
  }

  double next_event(const Group& g) const {
    switch (g.mode) {
      case Mode::paused:
      case Mode::restarting: return g.until;
      case Mode::down: return kNever;
      case Mode::running:
        if (commit_ != Commit::merge || g.up() <= 0) return kNever;
        return g.t + time_for_steps(g, std::max(0.0, c_.h - g.round));
    }
    return kNever;
  }

  void advance_uptime(double t) {
    if (computing_ >= quorum_) uptime_s_ += t - now_;
    now_ = t;
  }

  // Accounts `g`'s chip-time up to t: at constant rates while paused or down, and through
  // its compute / checkpoint cycle while running (whole cycles in closed form).
  void advance(Group& g, double t) {
    double dt = t - g.t;
    if (dt <= 0) return;
    g.t = t;
    const double up = static_cast<double>(g.up());
    ct_.down += static_cast<double>(g.failed) * dt;
    if (g.mode == Mode::paused) {
      ct_.paused += up * dt;
      return;
    }
    if (g.mode != Mode::running) {
      ct_.down += up * dt;
      return;
    }
    if (g.up() <= 0) return;
    const double wall = step_wall(g);
    const auto compute = [&](double seconds) {
      g.unsaved.compute += up * seconds / g.slow;
      g.unsaved.straggler += up * seconds * (1 - 1 / g.slow);
      g.seg += seconds / wall;
      g.round += seconds / wall;
    };
    while (dt > 0) {
      if (g.write_left > 0) {
        const double w = std::min(dt, g.write_left);
        g.unsaved.checkpoint += up * w;
        dt -= w;
        g.write_left = w < g.write_left ? g.write_left - w : 0;
        if (g.write_left > 0) return;
        save_point(g);
      } else {
        const double to_end = std::max(0.0, g.seg_steps - g.seg) * wall;  // inf: no saves
        if (dt < to_end) {
          compute(dt);
          return;
        }
        compute(to_end);
        g.seg = std::max(g.seg, g.seg_steps);
        dt -= to_end;
        if (save_s_ > 0) {
          g.write_left = save_s_;
          continue;
        }
        save_point(g);
      }
      // At a save point: whole cycles of compute and checkpoint at once.
      const double cycle_s = g.seg_steps * wall + save_s_;
      const double cycles = std::floor(dt / cycle_s);
      if (cycles >= 1) {
        const AtRisk one{up * g.seg_steps * wall / g.slow,
                         up * g.seg_steps * wall * (1 - 1 / g.slow), up * save_s_};
        if (commit_ == Commit::save)
          commit_times(one, cycles);
        else
          g.saved.add(one, cycles);
        if (checkpointing_) result_.checkpoints += static_cast<int64_t>(cycles);
        g.round += cycles * g.seg_steps;
        dt -= cycles * cycle_s;
      }
    }
  }

  // The checkpoint just written (or, without a write, the step just completed) holds the
  // segment's work.
  void save_point(Group& g) {
    g.seg = 0;
    g.write_left = 0;
    if (checkpointing_) ++result_.checkpoints;
    if (commit_ == Commit::save) {
      commit(g.unsaved);
    } else {
      g.saved.add(g.unsaved);
      g.unsaved = AtRisk{};
    }
  }

  void commit(AtRisk& w) {
    commit_times(w, 1);
    w = AtRisk{};
  }
  void commit_times(const AtRisk& w, double times) {
    ct_.useful += times * w.compute;
    ct_.straggler += times * w.straggler;
    ct_.checkpoint += times * w.checkpoint;
  }
  void lose(AtRisk& w) {
    ct_.lost += w.compute + w.straggler + w.checkpoint;
    w = AtRisk{};
  }

  void pause(Group& g, double t) {
    g.until = g.mode == Mode::paused ? std::max(g.until, t + c_.rescale_seconds)
                                     : t + c_.rescale_seconds;
    g.mode = Mode::paused;
  }

  // Applies `change` to group m at time t (its chip-time accounted first), then refreshes
  // its next event and the count of computing groups.
  template <typename F>
  void touch(size_t m, double t, F change) {
    Group& g = groups_[m];
    advance(g, t);
    const bool was_computing = g.computing();
    change(g);
    computing_ += (g.computing() ? 1 : 0) - (was_computing ? 1 : 0);
    next_[m] = next_event(g);
  }

  void fault_event(const FaultTrace::Event& e) {
    const size_t m = group_of(e.chip);
    const double t = e.time;
    if (e.failure) {
      ++result_.failures;
      touch(m, t, [&](Group& g) { chip_failed(m, g, t); });
      return;
    }
    // Recovery: the chip (or its replacement) is back, with a new speed.
    touch(m, t, [&](Group& g) {
      --g.failed;
      const double f = speeds_.replace(e.chip);
      if (speeds_.varied()) {
        const double before = g.slow;
        if (e.chip == g.slow_chip)
          rescan_slowest(g);
        else if (f > g.slow) {
          g.slow = f;
          g.slow_chip = e.chip;
        }
        if (g.slow != before) set_segment(g);
      }
      if (on_failure_ == OnFailure::restart) {
        if (g.mode == Mode::down && g.failed == 0) {
          g.mode = Mode::restarting;
          g.until = t + restart_s_;
        }
        return;
      }
      if (g.mode == Mode::running || g.mode == Mode::paused) pause(g, t);
    });
  }

  void chip_failed(size_t m, Group& g, double t) {
    ++g.failed;
    if (on_failure_ == OnFailure::restart) {
      if (g.mode == Mode::down) return;
      if (g.live()) {
        // The state since the last checkpoint or merge is gone, and so is a snapshot the
        // syncer has not merged yet.
        lose(g.unsaved);
        lose(g.saved);
        lose(g.published);
        g.seg = g.round = g.write_left = 0;
        unit_lost(m, g.t);
      }
      g.mode = Mode::down;
      g.until = kNever;
      return;
    }
    // Elastic: the survivors roll back to their last checkpoint (without in-memory
    // checkpoints, to the last completed step); a checkpoint being written is lost with the
    // segment it was saving. (A failure during a failure's pause finds nothing to lose.)
    lose(g.unsaved);
    g.round = std::max(0.0, g.round - g.seg);
    g.seg = g.write_left = 0;
    pause(g, t);
  }

  void group_event(size_t m, double t) {
    touch(m, t, [&](Group& g) {
      switch (g.mode) {
        case Mode::paused:
          g.mode = Mode::running;
          g.until = kNever;
          return;
        case Mode::restarting:
          // From the last checkpoint, or (a unit) from Θ.
          g.mode = Mode::running;
          g.until = kNever;
          g.seg = g.round = g.write_left = 0;
          set_segment(g);
          return;
        case Mode::running: publish(m, t); return;
        case Mode::down: return;
      }
    });
  }

  // ---- the syncer (decoupled) ----
  // A unit's publish: its state is copied out for the syncer, which is also a save point.
  void publish(size_t m, double t) {
    Group& g = groups_[m];
    g.published.add(g.saved);
    g.published.add(g.unsaved);
    g.saved = g.unsaved = AtRisk{};
    g.seg = g.round = g.write_left = 0;
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
  // window g = clamp(γ·(τ·ξ_step − ξ_quorum − ξ_sync), 0, cap·ξ_step) (docs/algorithm.md).
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
  Commit commit_ = Commit::save;
  OnFailure on_failure_ = OnFailure::elastic;
  int quorum_ = 1;
  double restart_s_ = 0;
  double save_s_ = 0;           // writing one checkpoint (dp's, or an elastic group's)
  bool checkpointing_ = true;   // save points are checkpoints (counted in the result)
  double interval_s_ = kNever;  // compute (wall) seconds between checkpoints, reported
  int computing_ = 0;           // groups computing (Group::computing), for the uptime
  std::vector<Group> groups_;
  std::vector<double> next_;  // each group's next event (end of a pause or restart, a publish)
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
  j["checkpoints"] = r.checkpoints;
  if (std::isfinite(r.checkpoint_interval_s))
    j["checkpoint_interval_s"] = r.checkpoint_interval_s;
  else
    j["checkpoint_interval_s"] = nullptr;
  if (r.strategy == Strategy::decoupled) {
    j["merges"] = r.merges;
    j["quorum_sizes"] = r.quorum_sizes;
  }
  j["run_seconds"] = r.run_seconds;
  return j;
}

}  // namespace ddiloco::sim
