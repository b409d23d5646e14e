// The fault schedule: reproducible from its seed, statistically what it claims, and a file
// round trip; bad schedule files refused with the entry and field named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <vector>

#include <fmt/format.h>
#include <unistd.h>

#include "ddiloco/chaos.hpp"
#include "ddiloco/config.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/goodput.hpp"
#include "ddiloco/unit_links.hpp"

namespace ddiloco::chaos {
namespace {

ChaosConfig busy_config(int64_t seed) {
  ChaosConfig c;
  c.seed = seed;
  c.horizon_s = 600;
  c.crash_mtbf_s = 60;
  c.down_min_s = 5;
  c.down_max_s = 15;
  c.slow_mtbf_s = 90;
  c.link_mtbf_s = 120;
  return c;
}

std::string write_file(const std::string& name, const std::string& text) {
  // ctest runs each test in its own process, in parallel: names unique per test and process.
  const auto path = std::filesystem::temp_directory_path() /
                    fmt::format("ddiloco_chaos_{}_{}_{}", getpid(),
                                ::testing::UnitTest::GetInstance()->current_test_info()->name(), name);
  std::ofstream(path) << text;
  return path.string();
}

void expect_error(const std::string& text, const std::string& needle,
                  const std::vector<int>& unit_ranks = {}) {
  const std::string path = write_file("bad.yaml", text);
  try {
    Schedule::load(path, 4, unit_ranks);
    ADD_FAILURE() << "no error for:\n" << text;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << needle;
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

TEST(ChaosSchedule, SameSeedSameScheduleOtherSeedAnother) {
  const Schedule a = Schedule::generate(busy_config(7), 4);
  const Schedule b = Schedule::generate(busy_config(7), 4);
  const Schedule c = Schedule::generate(busy_config(8), 4);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(ChaosSchedule, NoRatesNoFaults) {
  ChaosConfig c;
  EXPECT_FALSE(c.enabled());
  EXPECT_TRUE(Schedule::generate(c, 4).empty());
}

TEST(ChaosSchedule, StreamsAreIndependentPerUnitAndKind) {
  // Unit 2's crashes do not depend on other units being drawn, nor on the straggler rate.
  ChaosConfig only2 = busy_config(3);
  only2.units = {2};
  only2.slow_mtbf_s = 0;
  only2.link_mtbf_s = 0;
  std::vector<Fault> crashes_all;
  for (const Fault& f : Schedule::generate(busy_config(3), 4).of_unit(2))
    if (f.kind == FaultKind::crash) crashes_all.push_back(f);
  EXPECT_EQ(Schedule::generate(only2, 4).faults, crashes_all);
  for (const Fault& f : Schedule::generate(only2, 4).faults) EXPECT_EQ(f.unit, 2);
}

TEST(ChaosSchedule, CrashesArePoissonWhileUpAndDownTimesInRange) {
  ChaosConfig c;
  c.seed = 11;
  c.horizon_s = 2e6;
  c.crash_mtbf_s = 100;
  c.down_min_s = 10;
  c.down_max_s = 30;
  const Schedule s = Schedule::generate(c, 1);
  std::vector<double> up, down;
  double prev_end = 0;
  for (const Fault& f : s.faults) {
    ASSERT_EQ(f.kind, FaultKind::crash);
    ASSERT_GE(f.start_s, prev_end);  // never crashes while down
    ASSERT_GE(f.duration_s, 10);
    ASSERT_LE(f.duration_s, 30);
    ASSERT_LT(f.start_s, c.horizon_s);
    up.push_back(f.start_s - prev_end);
    down.push_back(f.duration_s);
    prev_end = f.end_s();
  }
  ASSERT_GT(up.size(), 10000u);
  const auto mean = [](const std::vector<double>& x) {
    return std::accumulate(x.begin(), x.end(), 0.0) / static_cast<double>(x.size());
  };
  // Coefficient of variation (standard deviation ÷ mean): 1 for the exponential up-times of a
  // Poisson process (a fixed period has 0), 1/√3 × 10/20 = 0.289 for down-times uniform in
  // [10, 30].
  const auto cv = [&](const std::vector<double>& x) {
    const double m = mean(x);
    double ss = 0;
    for (double v : x) ss += (v - m) * (v - m);
    return std::sqrt(ss / static_cast<double>(x.size() - 1)) / m;
  };
  // Mean up-time 100 s and mean down-time 20 s; with ~16k samples the standard errors are
  // ~0.8 % and ~0.5 %, those of the two CVs ~1.1 % and ~0.4 % (√(2/n) for the exponential):
  // these bounds, 4 standard errors or more, cannot fail by chance in practice (any seed).
  EXPECT_NEAR(mean(up), 100.0, 3.0);
  EXPECT_NEAR(mean(down), 20.0, 0.6);
  EXPECT_NEAR(cv(up), 1.0, 0.05);
  EXPECT_NEAR(cv(down), 10.0 / std::sqrt(3.0) / 20.0, 0.01);
  // Memoryless: P(up > 100 s) = e⁻¹, and P(up > 200 s | up > 100 s) = e⁻¹ too.
  const auto share_above = [&](double t) {
    return static_cast<double>(std::count_if(up.begin(), up.end(), [&](double v) { return v > t; })) /
           static_cast<double>(up.size());
  };
  EXPECT_NEAR(share_above(100), std::exp(-1.0), 0.015);
  EXPECT_NEAR(share_above(200) / share_above(100), std::exp(-1.0), 0.025);
}

TEST(ChaosSchedule, FileRoundTripIsExact) {
  const Schedule a = Schedule::generate(busy_config(5), 3);
  const std::string path = write_file("roundtrip.yaml", a.to_yaml());
  EXPECT_EQ(Schedule::load(path, 3), a);
  std::filesystem::remove(path);
  // Crashes with no down-time (chaos.down_max_s = 0) replay too; episodes must last.
  ChaosConfig instant = busy_config(5);
  instant.down_min_s = instant.down_max_s = 0;
  const Schedule b = Schedule::generate(instant, 3);
  const std::string zero = write_file("zero.yaml", b.to_yaml());
  EXPECT_EQ(Schedule::load(zero, 3), b);
  std::filesystem::remove(zero);
  expect_error("faults:\n  - {unit: 0, kind: slow, start_s: 1, duration_s: 0, factor: 2}\n",
               "faults[0].duration_s: must be > 0 (≥ 0 for a crash), got 0");
  const std::string empty = write_file("empty.yaml", Schedule{}.to_yaml());
  EXPECT_TRUE(Schedule::load(empty, 3).empty());
  std::filesystem::remove(empty);
}

TEST(ChaosSchedule, CountsPerUnitAndInAll) {
  const std::string path = write_file("counts.yaml",
                                      "faults:\n"
                                      "  - {unit: 0, kind: crash, start_s: 1, duration_s: 2}\n"
                                      "  - {unit: 0, kind: slow, start_s: 4, duration_s: 3, factor: 2}\n"
                                      "  - {unit: 1, kind: crash, start_s: 5, duration_s: 0.5}\n"
                                      "  - {unit: 1, kind: link, start_s: 6, duration_s: 4, factor: 0.5}\n");
  const Schedule s = Schedule::load(path, 2);
  std::filesystem::remove(path);
  const Schedule::Counts all = s.counts(), first = s.counts(0), second = s.counts(1);
  EXPECT_EQ(all.crashes, 2);
  EXPECT_DOUBLE_EQ(all.down_s, 2.5);
  EXPECT_EQ(all.slow + all.link, 2);
  EXPECT_EQ(first.crashes, 1);
  EXPECT_DOUBLE_EQ(first.slow_s, 3.0);
  EXPECT_EQ(first.link, 0);
  EXPECT_DOUBLE_EQ(second.down_s, 0.5);
  EXPECT_DOUBLE_EQ(second.link_s, 4.0);
}

TEST(ChaosSchedule, BadFilesRefusedWithEntryAndField) {
  expect_error("faults: 3\n", "expected a map with a list 'faults'");
  expect_error("faults:\n  - {unit: 4, kind: crash, start_s: 1, duration_s: 2}\n",
               "faults[0].unit: must be an integer in [0, 4), got 4");
  expect_error("faults:\n  - {unit: 0, kind: boom, start_s: 1, duration_s: 2}\n",
               "faults[0].kind: must be one of crash, slow, link, kill, kill_syncer, got 'boom'");
  expect_error("faults:\n  - {unit: 0, kind: slow, start_s: 1, duration_s: 2}\n",
               "faults[0].factor: missing");
  expect_error("faults:\n  - {unit: 0, kind: slow, start_s: 1, duration_s: 2, factor: 0.5}\n",
               "faults[0].factor: a slow-down must be ≥ 1, got 0.5");
  expect_error("faults:\n  - {unit: 0, kind: link, start_s: 1, duration_s: 2, factor: 0}\n",
               "faults[0].factor: a bandwidth fraction must be in (0, 1], got 0");
  expect_error("faults:\n  - {unit: 0, kind: crash, start_s: -1, duration_s: 2}\n",
               "faults[0].start_s: must be ≥ 0, got -1");
  expect_error("faults:\n  - {unit: 0, kind: crash, start_s: 1, duration_s: x}\n",
               "faults[0].duration_s: expected a number, got 'x'");
  expect_error("faults:\n  - {unit: 0, kind: crash, start: 1, duration_s: 2}\n",
               "faults[0]: unknown key 'start'");
  expect_error(
      "faults:\n  - {unit: 1, kind: crash, start_s: 10, duration_s: 20}\n"
      "  - {unit: 1, kind: crash, start_s: 25, duration_s: 5}\n",
      "unit 1 crashes at 25 s while down from an earlier crash until 30 s");
  EXPECT_THROW(Schedule::load("/nonexistent/chaos.yaml", 4), Error);
}

// Found by fuzz/chaos_schedule.cpp: a key that is no name (a map, a list, null) let yaml-cpp's
// bad-conversion exception through, naming neither the file nor the entry.
TEST(ChaosSchedule, KeyThatIsNoNameRefusedWithEntry) {
  expect_error("faults:\n  - {{unit: 1}: 1}\n", "faults[0]: a key must be a name");
  expect_error("faults:\n  - {unit: 0, [kind]: crash}\n", "faults[0]: a key must be a name");
  expect_error("faults:\n  - {unit: 0, ? : crash}\n", "faults[0]: a key must be a name");
}

TEST(ChaosKills, ParsedWithAndWithoutRankAndKillSyncerWithoutUnit) {
  const std::string path = write_file("kills.yaml",
                                      "faults:\n"
                                      "  - {unit: 1, kind: kill, start_s: 12}\n"
                                      "  - {unit: 2, kind: kill, rank: 1, start_s: 5.5}\n"
                                      "  - {kind: kill_syncer, start_s: 30}\n"
                                      "  - {unit: -1, kind: kill_syncer, start_s: 40, duration_s: 0}\n"
                                      "  - {unit: 1, kind: crash, start_s: 3, duration_s: 2}\n");
  const Schedule s = Schedule::load(path, 4, {1, 1, 2, 1});
  std::filesystem::remove(path);
  ASSERT_EQ(s.faults.size(), 5u);
  const std::vector<Fault> kills = s.launcher_faults();  // in start order, the crash left out
  ASSERT_EQ(kills.size(), 4u);
  EXPECT_EQ(kills[0], (Fault{.unit = 2, .kind = FaultKind::kill, .start_s = 5.5, .rank = 1}));
  EXPECT_EQ(kills[1], (Fault{.unit = 1, .kind = FaultKind::kill, .start_s = 12, .rank = 0}));
  EXPECT_EQ(kills[2], (Fault{.unit = kSyncerUnit, .kind = FaultKind::kill_syncer, .start_s = 30}));
  EXPECT_EQ(kills[3].kind, FaultKind::kill_syncer);
  EXPECT_EQ(kills[3].unit, kSyncerUnit);
  for (const Fault& f : kills) {
    EXPECT_EQ(f.duration_s, 0);
    EXPECT_EQ(f.factor, 1);
    EXPECT_TRUE(is_launcher_fault(f.kind));
  }
  EXPECT_FALSE(is_launcher_fault(FaultKind::crash));
  // Counted apart: a unit's kills with the unit, the syncer's only in the total.
  const Schedule::Counts all = s.counts(), one = s.counts(1), two = s.counts(2);
  EXPECT_EQ(all.kills, 2);
  EXPECT_EQ(all.syncer_kills, 2);
  EXPECT_EQ(all.crashes, 1);
  EXPECT_DOUBLE_EQ(all.down_s, 2.0);  // kills add no down-time
  EXPECT_EQ(one.kills, 1);
  EXPECT_EQ(one.crashes, 1);
  EXPECT_EQ(one.syncer_kills, 0);
  EXPECT_EQ(two.kills, 1);
  // The units ignore them: unit 1 sees its crash only, unit 2 nothing at all.
  UnitTimeline t1(s, 1), t2(s, 2);
  const Fault* crash = t1.crash_due(100);
  ASSERT_NE(crash, nullptr);
  EXPECT_EQ(crash->kind, FaultKind::crash);
  EXPECT_EQ(t1.crash_due(100), nullptr);
  EXPECT_FALSE(t2.crash_pending(100));
  EXPECT_EQ(t2.slowdown_at(6), 1);
  EXPECT_EQ(t2.link_factor_at(6), 1);  // a kill is no link degradation
  // Without the units' ranks a rank is only checked for being ≥ 0.
  const std::string wide = write_file("wide.yaml", "faults:\n  - {unit: 0, kind: kill, rank: 7, start_s: 1}\n");
  EXPECT_EQ(Schedule::load(wide, 1).faults.at(0).rank, 7);
  std::filesystem::remove(wide);
}

TEST(ChaosKills, RoundTripThroughToYaml) {
  Schedule a = Schedule::generate(busy_config(9), 3);
  a.faults.push_back({.unit = 2, .kind = FaultKind::kill, .start_s = 1.0 / 3, .rank = 1});
  a.faults.push_back({.unit = 0, .kind = FaultKind::kill, .start_s = 50});
  a.faults.push_back({.unit = kSyncerUnit, .kind = FaultKind::kill_syncer, .start_s = 0.1});
  std::sort(a.faults.begin(), a.faults.end(), [](const Fault& x, const Fault& y) {
    if (x.start_s != y.start_s) return x.start_s < y.start_s;
    if (x.unit != y.unit) return x.unit < y.unit;
    if (x.kind != y.kind) return x.kind < y.kind;
    return x.rank < y.rank;
  });
  const std::string text = a.to_yaml();
  EXPECT_NE(text.find("{kind: kill_syncer, start_s: 0.1}"), std::string::npos) << text;
  EXPECT_NE(text.find("{unit: 0, kind: kill, rank: 0, start_s: 50}"), std::string::npos) << text;
  const std::string path = write_file("kills_roundtrip.yaml", text);
  EXPECT_EQ(Schedule::load(path, 3, {1, 1, 2}), a);
  std::filesystem::remove(path);
}

TEST(ChaosKills, BadEntriesRefusedWithFileEntryAndField) {
  expect_error("faults:\n  - {unit: 0, kind: kill, rank: 2, start_s: 1}\n",
               "faults[0].rank: unit 0 has 2 rank(s), 0 to 1, got 2", {2, 1, 1, 1});
  expect_error("faults:\n  - {unit: 0, kind: kill, rank: -1, start_s: 1}\n",
               "faults[0].rank: must be an integer ≥ 0 (a rank of unit 0), got -1");
  expect_error("faults:\n  - {unit: 0, kind: kill, rank: 0.5, start_s: 1}\n",
               "faults[0].rank: must be an integer ≥ 0 (a rank of unit 0), got 0.5");
  expect_error("faults:\n  - {unit: 0, kind: kill, rank: x, start_s: 1}\n",
               "faults[0].rank: expected a number, got 'x'");
  expect_error("faults:\n  - {unit: 0, kind: crash, rank: 1, start_s: 1, duration_s: 2}\n",
               "faults[0].rank: only a kill names a rank, got one for kind crash");
  expect_error("faults:\n  - {unit: 0, kind: crash, start_s: 1, duration_s: 2}\n"
               "  - {unit: 2, kind: kill_syncer, start_s: 3}\n",
               "faults[1].unit: kill_syncer kills the syncer, which is no unit: omit unit or give "
               "-1, got 2");
  expect_error("faults:\n  - {kind: kill_syncer, rank: 0, start_s: 3}\n",
               "faults[0].rank: only a kill names a rank, got one for kind kill_syncer");
  expect_error("faults:\n  - {kind: kill, start_s: 3}\n", "faults[0].unit: missing");
  expect_error("faults:\n  - {unit: -1, kind: kill, start_s: 3}\n",
               "faults[0].unit: must be an integer in [0, 4), got -1");
  expect_error("faults:\n  - {unit: 1, kind: kill, start_s: 3, duration_s: 5}\n",
               "faults[0].duration_s: a kill has no duration");
  expect_error("faults:\n  - {kind: kill_syncer, start_s: 3, factor: 2}\n",
               "faults[0].factor: a kill_syncer has no factor (1), got 2");
  expect_error("faults:\n  - {unit: 1, kind: kill}\n", "faults[0].start_s: missing");
  expect_error("faults:\n  - {unit: 1, kind: kill, start_s: -2}\n",
               "faults[0].start_s: must be ≥ 0, got -2");
}

TEST(ChaosKills, ConfigChecksTheRankAgainstTheUnitsRanks) {
  const std::string path = write_file("cfg_kills.yaml",
                                      "faults:\n  - {unit: 1, kind: kill, rank: 1, start_s: 2}\n");
  EXPECT_NO_THROW(load_config("", {"mode=decoupled", "units.count=2", "units.ranks=[1, 2]",
                                   "chaos.schedule_file=" + path}));
  try {
    load_config("", {"mode=decoupled", "units.count=2", "chaos.schedule_file=" + path});
    ADD_FAILURE() << "a rank beyond the unit's was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path + ": faults[0].rank: unit 1 has 1 rank(s), 0 to 0, got 1"),
              std::string::npos) << what;
  }
  // Kills are no crash: mode streaming takes them (the launcher restarts the process).
  EXPECT_NO_THROW(load_config("", {"mode=streaming", "units.count=2", "units.ranks=[1, 2]",
                                   "chaos.schedule_file=" + path}));
  std::filesystem::remove(path);
}

TEST(ChaosTimeline, CrashesOnceEachAndEpisodeFactors) {
  Schedule s;
  s.faults = {{0, FaultKind::crash, 10, 5, 1},  {0, FaultKind::slow, 12, 10, 3},
              {0, FaultKind::slow, 15, 2, 5},   {0, FaultKind::link, 20, 4, 0.25},
              {1, FaultKind::crash, 1, 1, 1},   {0, FaultKind::crash, 30, 5, 1}};
  UnitTimeline t(s, 0);
  EXPECT_EQ(t.crash_due(9.9), nullptr);
  EXPECT_FALSE(t.crash_pending(9.9));
  EXPECT_TRUE(t.crash_pending(10.0));  // peeking does not take it
  EXPECT_TRUE(t.crash_pending(10.0));
  const Fault* first = t.crash_due(10.0);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->start_s, 10);
  EXPECT_EQ(t.crash_due(11), nullptr);  // returned once
  EXPECT_FALSE(t.crash_pending(11));
  EXPECT_EQ(t.crash_due(40)->start_s, 30);
  EXPECT_EQ(t.crash_due(50), nullptr);
  EXPECT_EQ(t.slowdown_at(11), 1);
  EXPECT_EQ(t.slowdown_at(12), 3);
  EXPECT_EQ(t.slowdown_at(16), 5);  // overlapping episodes: the larger
  EXPECT_EQ(t.slowdown_at(22), 1);
  EXPECT_EQ(t.link_factor_at(21), 0.25);
  EXPECT_EQ(t.link_factor_at(24), 1);
}

TEST(ChaosTimeline, AResumedJobSkipsTheCrashesItHasLived) {
  Schedule s;
  s.faults = {{0, FaultKind::crash, 10, 5, 1}, {0, FaultKind::crash, 30, 5, 1}};
  UnitTimeline t(s, 0);
  t.skip_crashes_before(12);  // resumed 12 s into the job: the first crash is history
  EXPECT_FALSE(t.crash_pending(20));
  EXPECT_EQ(t.crash_due(31)->start_s, 30);
}

TEST(ChaosConfig, ValidatedWithTheRest) {
  EXPECT_THROW(load_config("", {"mode=decoupled", "units.count=2", "chaos.units=[2]"}), Error);
  EXPECT_THROW(load_config("", {"mode=decoupled", "units.count=2", "chaos.down_min_s=9",
                                "chaos.down_max_s=3"}),
               Error);
  EXPECT_THROW(load_config("", {"chaos.crash_mtbf_s=10"}), Error);  // mode single
  EXPECT_NO_THROW(load_config("", {"mode=decoupled", "units.count=2", "chaos.crash_mtbf_s=10"}));
  // Crashes in streaming are refused (a crash between send and apply would deadlock the
  // synchronous round); slowness alone is fine there.
  EXPECT_THROW(load_config("", {"mode=streaming", "units.count=2", "chaos.crash_mtbf_s=10"}),
               Error);
  EXPECT_NO_THROW(load_config("", {"mode=streaming", "units.count=2", "chaos.slow_mtbf_s=10"}));
  // A schedule file is read with the config: a bad one stops every rank before it starts.
  EXPECT_THROW(load_config("", {"mode=decoupled", "units.count=2",
                                "chaos.schedule_file=/nonexistent/chaos.yaml"}),
               Error);
}

// Found by fuzz_config: a chaos.schedule_file over 255 bytes long made std::filesystem::exists
// throw filesystem_error (ENAMETOOLONG) out of load_config, naming neither the config nor the key.
TEST(ChaosConfig, ScheduleFileNameTheSystemRefusesIsAnError) {
  const std::string name(300, 'x');
  try {
    load_config("", {"mode=decoupled", "units.count=2", "chaos.schedule_file=" + name});
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "defaults with --set: " + name + ": chaos schedule file cannot be looked up (File "
              "name too long); chaos.schedule_file must name a readable file");
  }
}

// Found by reading what fuzz_config's slow inputs do: a horizon long beside the mean gaps drew
// faults until memory ran out (chaos.horizon_s = 1e9 with crash_mtbf_s = 1e-6 and no down-time
// never ends); a schedule now holds at most Schedule::kMaxDrawn faults.
TEST(ChaosConfig, RatesThatDrawTooManyFaultsAreRefused) {
  ChaosConfig c;
  c.slow_mtbf_s = 0.001;
  c.slow_duration_s = 0.001;
  c.horizon_s = 2100;  // about 1.05 million episodes per unit
  try {
    const Schedule s = Schedule::generate(c, 2);
    ADD_FAILURE() << s.faults.size() << " faults drawn";
  } catch (const Error& e) {
    EXPECT_TRUE(std::string(e.what()).starts_with(
        "chaos.horizon_s: the fault rates draw more than 1048576 faults over 2100 s"))
        << e.what();
  }
  c.horizon_s = 500;  // about 250 thousand per unit: drawn
  EXPECT_NO_THROW(Schedule::generate(c, 2));
  // A config is refused when it is read, not when the units draw their schedules.
  EXPECT_THROW(load_config("", {"mode=decoupled", "units.count=2", "chaos.slow_mtbf_s=0.001",
                                "chaos.slow_duration_s=0.001", "chaos.horizon_s=2100"}),
               Error);
}

}  // namespace
}  // namespace ddiloco::chaos

namespace ddiloco {
namespace {

TEST(GlobalDowntime, CountsOnlyGapsLongerThanTwiceTheNominalPeriodAfterTheFirstUpdate) {
  GlobalDowntime d(2.0);
  d.update(10.0, 1.0);  // the first round (0 → 10 s) is start-up, not downtime
  d.update(11.0, 1.0);
  d.update(12.9, 1.0);  // 1.9 s ≤ 2 × 1 s
  d.update(20.0, 1.0);  // 7.1 s: down
  d.update(21.0, 0.0);  // nominal unknown: not counted
  EXPECT_DOUBLE_EQ(d.seconds(), 7.1);
  EXPECT_DOUBLE_EQ(d.finish(26.0, 2.0), 7.1 + 5.0);  // the tail after the last update
  EXPECT_EQ(d.episodes(), 2);
  EXPECT_DOUBLE_EQ(d.longest_gap_s(), 7.1);
}

TEST(TimeBook, GoodputIsUsefulOverAllocatedAndSurvivesTheWire) {
  TimeBook b;
  b.compute = 80;
  b.discarded = 8;
  b.wait = 10;
  b.down = 5;
  b.other = 5;
  b.allocated = 100;
  EXPECT_DOUBLE_EQ(b.useful(), 72);
  EXPECT_DOUBLE_EQ(b.booked(), 100);
  EXPECT_DOUBLE_EQ(b.goodput(), 0.72);
  const auto v = b.to_vector();
  ASSERT_EQ(v.size(), static_cast<size_t>(TimeBook::kFields));
  const TimeBook c = TimeBook::from_vector(v.data());
  EXPECT_EQ(c.to_json(), b.to_json());
  TimeBook sum = b;
  sum += c;
  EXPECT_DOUBLE_EQ(sum.goodput(), 0.72);
}

// One knob for a link's bandwidth: a degradation (factor f) scales the unit's
// wan.bandwidth_mbit_s, or, where wan.* leaves the link unlimited, a nominal 80 Mbit/s
// (10 MB/s): a transfer of b raw bytes then lands b·(1/f − 1)/(10 MB/s) later.
TEST(UnitLinks, ADegradationScalesTheWanBandwidthOrTheNominalRate) {
  const std::string path = chaos::write_file("link.yaml",
                                      "faults:\n"
                                      "  - {unit: 0, kind: link, start_s: 0, duration_s: 100, factor: 0.5}\n"
                                      "  - {unit: 1, kind: link, start_s: 0, duration_s: 100, factor: 0.5}\n");
  Config c;
  c.units.count = 3;
  c.chaos.schedule_file = path;
  c.wan.burst_kb = 0;
  constexpr uint64_t kMB = 1'000'000;
  {
    syncer::UnitLinks links(c, 3);  // no wan.*: every link unlimited, nominally 10 MB/s
    EXPECT_FALSE(links.emulated());
    // 1 MB at 5 MB/s rather than 10: 0.1 s late; the raw (fp32) bytes count, not the wire's.
    EXPECT_DOUBLE_EQ(links.merged(0, kMB, kMB, 1.0), 1.1);
    EXPECT_DOUBLE_EQ(links.snapshot(1, kMB / 4, kMB, 1.0).arrive_s, 1.1);
    EXPECT_DOUBLE_EQ(links.merged(2, kMB, kMB, 1.0), 1.0);  // unit 2 is not degraded
  }
  // Unit 0 limited to 16 Mbit/s (2 MB/s), halved: 1 MB takes 1 s on its token bucket, and no
  // nominal delay on top. Units 1 and 2 unlimited, with latency: unit 1's degradation is
  // the nominal rate's again.
  c.wan.unit_bandwidth_mbit_s = {16, 0, 0};
  c.wan.latency_ms = 10;
  {
    syncer::UnitLinks links(c, 3);
    EXPECT_TRUE(links.emulated());
    EXPECT_DOUBLE_EQ(links.merged(0, kMB, kMB, 1.0), 1.0 + 1.0 + 0.01);
    EXPECT_DOUBLE_EQ(links.merged(1, kMB, kMB, 1.0), 1.0 + 0.01 + 0.1);
    EXPECT_DOUBLE_EQ(links.merged(2, kMB, kMB, 1.0), 1.0 + 0.01);
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace ddiloco
