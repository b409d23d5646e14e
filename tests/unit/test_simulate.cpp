// The goodput simulator: exact where the answer is known (no failures, the closed form for
// dp, M = 1 decoupled against elastic dp), chip-time that adds up, reproducible from its seed,
// and configs refused with the key named.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "ddiloco/error.hpp"
#include "ddiloco/simulate.hpp"

namespace ddiloco::sim {
namespace {

SimConfig small_config() {
  SimConfig c;
  c.repeats = 1;
  c.chips = 1200;
  c.mtbi_hours = 1000;  // a failure of the job every 50 minutes
  c.days = 60;
  c.recovery_minutes = 6;
  c.rescale_seconds = 30;
  c.step_seconds = 5;
  c.learners = 4;
  c.quorum = 2;
  c.h = 20;
  // The tests written before in-memory checkpoints pin their model: an elastic group keeps
  // every completed step. The tests of the checkpoints turn them on themselves.
  c.elastic_checkpoint_seconds = 0;
  c.elastic_checkpoint_minutes = 0;
  return c;
}

double relative(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-300); }

// For the closed-form comparisons: 1000 chips over ten simulated years, so that the
// estimate's noise is well under 1 %, and the closed form at that failure rate.
SimConfig ten_years() {
  SimConfig c = small_config();
  c.chips = 1000;
  c.days = 3650;
  return c;
}
// Simulates `strategy` on `c` and expects dp_goodput_closed_form with these times within 1 %.
SimResult expect_closed_form(const SimConfig& c, Strategy strategy, double recovery_s,
                             double restart_s, double interval_s, double checkpoint_s) {
  const double lambda = static_cast<double>(c.chips) / (c.mtbi_hours * 3600);
  const double expected =
      dp_goodput_closed_form(lambda, recovery_s, restart_s, interval_s, checkpoint_s);
  const SimResult r = simulate(c, strategy);
  EXPECT_LT(relative(r.goodput, expected), 0.01)
      << strategy_name(strategy) << ", " << c.recovery << " recovery " << recovery_s
      << " s, restart or pause " << restart_s << " s: simulated " << r.goodput
      << ", closed form " << expected;
  return r;
}

TEST(Simulate, NoFailuresMeansFullGoodputForEveryStrategy) {
  SimConfig c = small_config();
  c.failures = false;
  for (int m : {1, 3, 4}) {
    c.learners = m;
    c.quorum = 1;
    for (Strategy s : {Strategy::dp, Strategy::elastic_dp, Strategy::decoupled}) {
      const SimResult r = simulate(c, s);
      EXPECT_NEAR(r.goodput, 1.0, 1e-12) << strategy_name(s) << " M=" << m;
      EXPECT_NEAR(r.uptime, 1.0, 1e-12) << strategy_name(s);
      EXPECT_EQ(r.failures, 0);
    }
  }
  // dp with no failures needs no checkpoint: the Young–Daly interval is infinite.
  EXPECT_TRUE(std::isinf(c.checkpoint_interval_s()));
}

TEST(Simulate, DataParallelMatchesTheClosedForm) {
  // Exponential failures, fixed recovery and restart, fixed checkpoint interval; ten
  // simulated years so that the estimate's noise is well under 1 %.
  for (const auto& [recovery_min, restart_s, interval_min, ckpt_s] :
       std::vector<std::tuple<double, double, double, double>>{
           {6, 180, 20, 60}, {30, 600, 10, 30}, {1, 30, 60, 120}}) {
    SimConfig c = ten_years();
    c.recovery_minutes = recovery_min;
    c.restart_seconds = restart_s;
    c.checkpoint_minutes = interval_min;
    c.checkpoint_seconds = ckpt_s;
    const SimResult r = expect_closed_form(c, Strategy::dp, recovery_min * 60, restart_s,
                                           interval_min * 60, ckpt_s);
    EXPECT_GT(r.failures, 50'000);
  }
}

TEST(Simulate, DataParallelIsInsensitiveToTheRecoveryDistribution) {
  // dp is down for the busy period of an M/G/∞ queue of failed chips, whose mean
  // (e^{Λ·E[R]} − 1)/Λ depends on the recovery time R only through its mean (Takács), so the
  // closed form for a fixed R holds for exponential and lognormal recoveries too.
  for (const char* recovery : {"exponential", "lognormal"}) {
    SimConfig c = ten_years();
    c.recovery = recovery;
    c.recovery_sigma = 1.0;
    c.recovery_minutes = 6;
    c.restart_seconds = 180;
    c.checkpoint_minutes = 20;
    c.checkpoint_seconds = 60;
    expect_closed_form(c, Strategy::dp, 360, 180, 1200, 60);
  }
}

TEST(Simulate, ElasticRollsBackToItsLastCheckpoint) {
  // An elastic group with in-memory checkpoints every τ (costing δ), a re-scale pause s and
  // chips back after R < s: a failure loses the work since the last checkpoint, and the pause
  // ends R + s after the last failure of a chain of failures each within R + s of the one
  // before (every chip is back before it ends). That is dp's renewal with recovery R and an
  // interruptible restart s: the same closed form (dp_goodput_closed_form).
  for (const auto& [recovery_min, rescale_s, interval_min, ckpt_s] :
       std::vector<std::tuple<double, double, double, double>>{
           {1, 180, 20, 60}, {0.5, 600, 10, 30}, {2, 150, 60, 120}}) {
    SimConfig c = ten_years();
    c.recovery_minutes = recovery_min;
    c.rescale_seconds = rescale_s;
    c.elastic_checkpoint_minutes = interval_min;
    c.elastic_checkpoint_seconds = ckpt_s;
    const SimResult r = expect_closed_form(c, Strategy::elastic_dp, recovery_min * 60, rescale_s,
                                           interval_min * 60, ckpt_s);
    EXPECT_GT(r.checkpoints, 0);
    EXPECT_DOUBLE_EQ(r.checkpoint_interval_s, interval_min * 60);
  }
}

TEST(Simulate, ElasticCheckpointIntervalIsTheGroupsYoungDaly) {
  SimConfig c = small_config();
  c.elastic_checkpoint_seconds = 2;
  const double mtbi_s = c.mtbi_hours * 3600;
  EXPECT_DOUBLE_EQ(c.elastic_checkpoint_interval_s(300), std::sqrt(2 * 2 * mtbi_s / 300));
  // A unit checkpoints at the failure rate of its own N/M chips, elastic dp at the job's.
  EXPECT_DOUBLE_EQ(simulate(c, Strategy::decoupled).checkpoint_interval_s,
                   c.elastic_checkpoint_interval_s(c.chips / c.learners));
  EXPECT_DOUBLE_EQ(simulate(c, Strategy::elastic_dp).checkpoint_interval_s,
                   c.elastic_checkpoint_interval_s(c.chips));
  // And it does checkpoint at that interval (in whole steps): with rare failures and no
  // publishes, each of the 4 units writes one checkpoint per interval + δ of a 60-day run.
  SimConfig rare = c;
  rare.mtbi_hours = 1e6;
  rare.h = 1'000'000;
  rare.quorum = 1;
  const double steps = std::round(rare.elastic_checkpoint_interval_s(300) / rare.step_seconds);
  const double per_unit = std::floor(rare.days * 86400 / (steps * rare.step_seconds + 2));
  EXPECT_LT(relative(static_cast<double>(simulate(rare, Strategy::decoupled).checkpoints),
                     4 * per_unit),
            0.01);
  c.elastic_checkpoint_minutes = 7;
  EXPECT_DOUBLE_EQ(c.elastic_checkpoint_interval_s(300), 420);
  c.elastic_checkpoint_minutes = 0;
  c.elastic_checkpoint_seconds = 0;  // every completed step is kept
  EXPECT_DOUBLE_EQ(c.elastic_checkpoint_interval_s(300), 0);
  EXPECT_EQ(simulate(c, Strategy::elastic_dp).checkpoints, 0);
  c.elastic_checkpoint_seconds = 2;
  c.failures = false;
  EXPECT_TRUE(std::isinf(c.elastic_checkpoint_interval_s(300)));
}

TEST(Simulate, CheckpointsAndPublishesHandTrace) {
  // One unit, no failures: steps of 5 s, an in-memory checkpoint every 3 steps costing 1 s,
  // a publish every 9 steps. The publish is itself a save point, so no checkpoint is written
  // at step 9: a round is 2 × (15 s + 1 s) + 15 s = 47 s with 2 checkpoints. A day holds
  // 1838 rounds (86386 s), then 14 s of compute. Elastic dp (no publishes): a cycle is 16 s,
  // 5400 in a day.
  SimConfig c = small_config();
  c.failures = false;
  c.days = 1;
  c.learners = 1;
  c.quorum = 1;
  c.h = 9;
  c.elastic_checkpoint_minutes = 15.0 / 60;
  c.elastic_checkpoint_seconds = 1;
  const SimResult unit = simulate(c, Strategy::decoupled);
  EXPECT_EQ(unit.merges, 1838);
  EXPECT_EQ(unit.checkpoints, 2 * 1838);
  EXPECT_NEAR(unit.goodput, 1 - 3676.0 / 86400, 1e-9);
  const double allocated = static_cast<double>(c.chips) * 86400;
  EXPECT_NEAR(unit.chip_time.checkpoint / allocated, 3676.0 / 86400, 1e-9);
  const SimResult elastic = simulate(c, Strategy::elastic_dp);
  EXPECT_EQ(elastic.checkpoints, 5400);
  EXPECT_NEAR(elastic.goodput, 1 - 5400.0 / 86400, 1e-9);
  // The uptime counts a routine checkpoint as up: no failure stalled anything.
  EXPECT_NEAR(unit.uptime, 1.0, 1e-12);
  EXPECT_NEAR(elastic.uptime, 1.0, 1e-12);
}

TEST(Simulate, ClosedFormLimits) {
  // No failures: only the checkpoint cost is lost.
  EXPECT_DOUBLE_EQ(dp_goodput_closed_form(0, 60, 60, 900, 100), 0.9);
  // Rare failures: goodput → τ/(τ+δ) from below.
  const double g = dp_goodput_closed_form(1e-9, 60, 60, 900, 100);
  EXPECT_LT(g, 0.9);
  EXPECT_GT(g, 0.9 - 1e-5);
}

TEST(Simulate, OneLearnerUnitIsElasticDataParallel) {
  for (double sigma : {0.0, 0.05}) {
    for (const char* recovery : {"fixed", "lognormal"}) {
      SimConfig c = small_config();
      c.learners = 1;
      c.quorum = 1;
      c.speed_sigma = sigma;
      c.recovery = recovery;
      const SimResult elastic = simulate(c, Strategy::elastic_dp);
      const SimResult decoupled = simulate(c, Strategy::decoupled);
      const ChipTime& d = decoupled.chip_time;
      const ChipTime& e = elastic.chip_time;
      EXPECT_LT(relative(decoupled.goodput, elastic.goodput), 1e-9)
          << recovery << " σ=" << sigma << ": " << decoupled.goodput << " vs "
          << elastic.goodput;
      EXPECT_LT(relative(d.straggler + 1, e.straggler + 1), 1e-9);
      EXPECT_LT(relative(decoupled.uptime, elastic.uptime), 1e-9);
      EXPECT_LT(relative(d.lost, e.lost), 1e-9);
      EXPECT_LT(relative(d.paused, e.paused), 1e-9);
      EXPECT_LT(relative(d.down, e.down), 1e-9);
      EXPECT_EQ(decoupled.failures, elastic.failures);
      EXPECT_EQ(e.pending, 0);
      EXPECT_EQ(d.pending, 0);  // one live unit makes the quorum of the last merge
      EXPECT_LT(elastic.goodput, 0.999);  // failures did cost something
    }
  }
}

TEST(Simulate, ChipTimeAddsUpToTheAllocation) {
  SimConfig c = small_config();
  c.speed_sigma = 0.03;
  c.recovery = "exponential";
  c.repeats = 2;  // chip-time is summed over the runs
  for (const char* policy : {"elastic", "down"}) {
    c.on_chip_failure = policy;
    for (Strategy s : {Strategy::dp, Strategy::elastic_dp, Strategy::decoupled}) {
      const SimResult r = simulate(c, s);
      const double allocated = static_cast<double>(c.chips) * c.days * 86400 * c.repeats;
      EXPECT_LT(relative(r.chip_time.total(), allocated), 1e-9) << strategy_name(s) << policy;
      EXPECT_NEAR(r.goodput, r.chip_time.useful / allocated, 1e-12);
      for (double part : {r.chip_time.useful, r.chip_time.lost, r.chip_time.down,
                          r.chip_time.paused, r.chip_time.checkpoint, r.chip_time.straggler,
                          r.chip_time.pending})
        EXPECT_GE(part, -1e-6 * allocated) << strategy_name(s) << policy;
    }
  }
}

TEST(Simulate, SameSeedSameOutputDifferentSeedDifferent) {
  SimConfig c = small_config();
  c.speed_sigma = 0.02;
  c.recovery = "lognormal";
  for (Strategy s : {Strategy::dp, Strategy::elastic_dp, Strategy::decoupled}) {
    nlohmann::json a = to_json(simulate(c, s));
    nlohmann::json b = to_json(simulate(c, s));
    a.erase("run_seconds");
    b.erase("run_seconds");
    EXPECT_EQ(a.dump(), b.dump()) << strategy_name(s);
    SimConfig other = c;
    other.seed = c.seed + 1;
    EXPECT_NE(simulate(other, s).goodput, simulate(c, s).goodput) << strategy_name(s);
  }
}

TEST(Simulate, RepeatsAverageIndependentSeeds) {
  SimConfig c = small_config();
  c.repeats = 3;
  const SimResult r = simulate(c, Strategy::elastic_dp);
  double sum = 0;
  for (int i = 0; i < 3; ++i) {
    SimConfig one = c;
    one.repeats = 1;
    one.seed = c.seed + i;
    sum += simulate(one, Strategy::elastic_dp).goodput;
  }
  EXPECT_NEAR(r.goodput, sum / 3, 1e-12);
  EXPECT_GT(r.goodput_stddev, 0);
}

TEST(Simulate, MoreUnitsLoseLessToEachFailure) {
  SimConfig c = small_config();
  c.quorum = 1;
  double previous = simulate(c, Strategy::elastic_dp).goodput;
  for (int m : {2, 4, 8}) {
    c.learners = m;
    const double g = simulate(c, Strategy::decoupled).goodput;
    EXPECT_GT(g, previous) << "M=" << m;
    previous = g;
  }
}

TEST(Simulate, QuorumDecidesUptimeAndMergeSizes) {
  SimConfig c = small_config();
  c.on_chip_failure = "down";
  c.learners = 4;
  c.quorum = 1;
  const SimResult any = simulate(c, Strategy::decoupled);
  c.quorum = 4;
  const SimResult all = simulate(c, Strategy::decoupled);
  // K = 1: some unit almost always computes; K = M stalls whenever a unit is down.
  EXPECT_GT(any.uptime, 0.999);
  EXPECT_LT(all.uptime, any.uptime - 0.01);
  // With K = M every merge holds all four snapshots.
  ASSERT_EQ(all.quorum_sizes.size(), 5u);
  EXPECT_GT(all.merges, 0);
  EXPECT_EQ(all.quorum_sizes[4], all.merges);
  int64_t counted = 0;
  for (int64_t n : any.quorum_sizes) counted += n;
  EXPECT_EQ(counted, any.merges);
  EXPECT_EQ(any.quorum_sizes[0], 0);
  // A down unit loses the work since its last merged snapshot; an elastic one only a step.
  c.quorum = 1;
  c.on_chip_failure = "elastic";
  EXPECT_LT(simulate(c, Strategy::decoupled).chip_time.lost, any.chip_time.lost);
}

TEST(Simulate, AStalledQuorumShowsInGoodput) {
  // Units that go down and stay down for months: with K = M the global model stops merging,
  // and the work the other units keep doing is never merged; with K = 1 it is.
  SimConfig c = small_config();
  c.chips = 8;
  c.learners = 8;
  c.mtbi_hours = 2000;
  c.recovery_minutes = 1e7;
  c.on_chip_failure = "down";
  c.days = 30;
  c.quorum = 1;
  const SimResult any = simulate(c, Strategy::decoupled);
  c.quorum = 8;
  const SimResult all = simulate(c, Strategy::decoupled);
  EXPECT_GT(all.failures, 0);
  EXPECT_LT(all.uptime, 0.9);
  EXPECT_LT(all.goodput, any.goodput - 0.1);
  EXPECT_GT(all.chip_time.pending, 0.1 * all.chip_time.total());
}

TEST(Simulate, CheckpointIntervalIsComputeTimeAtTheGroupsSpeed) {
  SimConfig c = small_config();
  c.failures = false;
  c.days = 1;
  c.checkpoint_minutes = 10;
  c.checkpoint_seconds = 0;
  for (double sigma : {0.0, 0.5}) {
    c.speed_sigma = sigma;
    const SimResult r = simulate(c, Strategy::dp);
    EXPECT_NEAR(static_cast<double>(r.checkpoints), 86400.0 / 600, 1.0) << "σ=" << sigma;
  }
}

TEST(Simulate, StragglersCostLessInSmallerGroups) {
  SimConfig c = small_config();
  c.failures = false;
  c.speed_sigma = 0.05;
  c.learners = 8;
  c.quorum = 1;
  const SimResult dp = simulate(c, Strategy::dp);
  const SimResult decoupled = simulate(c, Strategy::decoupled);
  // One group steps at the slowest of 1200 chips, a unit at the slowest of 150.
  EXPECT_GT(dp.chip_time.straggler, decoupled.chip_time.straggler);
  EXPECT_LT(dp.goodput, decoupled.goodput);
  EXPECT_LT(decoupled.goodput, 1.0);
}

TEST(Simulate, YoungDalyInterval) {
  SimConfig c = small_config();
  c.checkpoint_seconds = 8;
  c.checkpoint_minutes = 0;
  const double mtbf_s = c.mtbi_hours * 3600 / static_cast<double>(c.chips);
  EXPECT_DOUBLE_EQ(c.checkpoint_interval_s(), std::sqrt(2 * 8 * mtbf_s));
  c.checkpoint_minutes = 7;
  EXPECT_DOUBLE_EQ(c.checkpoint_interval_s(), 420);
}

std::string write_temp(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path) << text;
  return path.string();
}

void expect_error(const std::string& path, const std::vector<std::string>& overrides,
                  const std::string& needle) {
  try {
    load_sim_config(path, overrides);
    ADD_FAILURE() << "no error, expected one containing: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(SimConfig, BadInputIsRefusedWithTheKeyNamed) {
  const std::string file = write_temp("ddiloco_sim_bad.yaml", "chips:\n  count: 100\n");
  EXPECT_EQ(load_sim_config(file, {}).chips, 100);
  expect_error(file, {"decoupled.quorum=5"}, "decoupled.quorum: must be ≤ decoupled.learners = 4");
  expect_error(file, {"chips.mtbi_hours=0"}, "--set: chips.mtbi_hours: must be > 0, got 0");
  expect_error(file, {"chips.recovery=weibull"}, "chips.recovery: must be one of fixed");
  expect_error(file, {"chips.cout=5"}, "unknown key 'chips.cout' (did you mean 'chips.count'?)");
  expect_error(file, {"sim.strategies=[dp, ddp]"}, "sim.strategies: every element must be one of");
  expect_error(file, {"decoupled.learners=200"}, "decoupled.learners: must be ≤ chips.count = 100");
  expect_error(file, {"sim.strategies=[dp, dp]"}, "sim.strategies: must not name a strategy twice");
  expect_error(file, {"chips.count=1e12"}, "chips.count: must be in [1, 10000000000]");
  expect_error(file, {"decoupled.learners=100", "chips.count=1000000", "sim.days=300"},
               "decoupled on 1000000 chips with 100 units: about");
  SimConfig tiny;
  tiny.chips = 2;
  tiny.learners = 3;
  EXPECT_THROW(simulate(tiny, Strategy::decoupled), Error);
  const std::string typo = write_temp("ddiloco_sim_typo.yaml", "chips:\n  mtbi_hours: soon\n");
  expect_error(typo, {}, "ddiloco_sim_typo.yaml: chips.mtbi_hours: expected a finite number, got 'soon'");
  expect_error("/nonexistent/sim.yaml", {}, "/nonexistent/sim.yaml: config file not found");
  std::filesystem::remove(file);
  std::filesystem::remove(typo);
}

TEST(SimConfig, TheWorkBoundCountsRepeats) {
  // Decoupled on 10⁶ chips with 100 units for 300 days: about 8.6e8 event-unit updates per
  // run, under the bound of 3e9 once, over it 8 times (the default sim.repeats).
  const std::vector<std::string> big = {"decoupled.learners=100", "chips.count=1000000", "sim.days=300"};
  auto with = [&](const std::string& repeats) {
    auto o = big;
    o.push_back("sim.repeats=" + repeats);
    return o;
  };
  EXPECT_NO_THROW(load_sim_config("", with("1")));
  expect_error("", with("8"), "decoupled on 1000000 chips with 100 units: about 6.8e+09 event-unit "
                              "updates over sim.days = 300 and sim.repeats = 8");
}

TEST(SimConfig, YamlRoundTrip) {
  SimConfig c = load_sim_config("", {"chips.count=4242", "sweep.learners=[3, 5]"});
  const std::string yaml = to_yaml(c);
  const std::string file = write_temp("ddiloco_sim_round.yaml", yaml);
  const SimConfig back = load_sim_config(file, {});
  EXPECT_EQ(back.chips, 4242);
  EXPECT_EQ(back.sweep_learners, (std::vector<int>{3, 5}));
  EXPECT_EQ(to_yaml(back), yaml);
  std::filesystem::remove(file);
}

TEST(SimConfig, PaperConfigHoldsTheDefaults) {
  // The calibrated values live in the code's defaults and in configs/sim/paper.yaml; a refit
  // must change both.
  const SimConfig paper =
      load_sim_config(std::string(DDILOCO_FIXTURES_DIR) + "/../../configs/sim/paper.yaml", {});
  EXPECT_EQ(to_yaml(paper), to_yaml(SimConfig{}));
}

}  // namespace
}  // namespace ddiloco::sim
