// The launcher's supervision core with real child processes (/bin/sh scripts): restarts and
// their backoff, give-up, signal forwarding to process groups, the drain → SIGTERM → SIGKILL
// end, chaos kills from pid files, orphans; and that no process is left afterwards. Also the
// command lines `ddiloco launch` plans.
#include <gtest/gtest.h>

#include <algorithm>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ddiloco/config.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/launch.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/run_dir.hpp"
#include "temp_dir.hpp"

namespace ddiloco::launch {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

ChildSpec sh(Role role, int unit, const std::string& script) {
  ChildSpec c;
  c.role = role;
  c.unit = unit;
  c.argv = {"/bin/sh", "-c", script};
  return c;
}

SupervisorOptions quick(const test::TempDir& dir) {
  SupervisorOptions o;
  o.restart.max_restarts = 3;
  o.restart.backoff_s = 0.05;
  o.restart.backoff_max_s = 0.15;
  o.drain_s = 2;
  o.term_grace_s = 1;
  o.poll_s = 0.02;
  o.log_path = dir / "launch.jsonl";
  o.print = false;
  o.pid_dir = dir / "pids";
  return o;
}

std::vector<json> events(const fs::path& log, const std::string& kind = "") {
  std::vector<json> out;
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (kind.empty() || j.at("event") == kind) out.push_back(j);
  }
  return out;
}

std::vector<json> of(const std::vector<json>& all, const std::string& role, int unit) {
  std::vector<json> out;
  for (const json& j : all)
    if (j.value("role", "") == role && j.value("unit", -2) == unit) out.push_back(j);
  return out;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

pid_t pid_in(const fs::path& p) { return static_cast<pid_t>(std::stol(slurp(p))); }

// Gone for good: not even a zombie waiting to be reaped.
bool gone(pid_t pid) { return ::kill(pid, 0) == -1 && errno == ESRCH; }

void expect_every_spawned_process_gone(const fs::path& log) {
  for (const json& s : events(log, "spawn")) {
    const pid_t pid = s.at("pid").get<pid_t>();
    EXPECT_TRUE(gone(pid)) << "left behind: " << s.dump();
  }
}

// A stop signal once `at_s` seconds have passed (then `again_s`, if > 0).
std::function<int()> signal_at(int sig, double at_s, double again_s = 0) {
  auto clock = std::make_shared<Stopwatch>();
  auto sent = std::make_shared<int>(0);
  return [=]() -> int {
    const bool due = (*sent == 0 && clock->seconds() >= at_s) ||
                     (*sent == 1 && again_s > 0 && clock->seconds() >= again_s);
    if (!due) return 0;
    ++*sent;
    return sig;
  };
}

TEST(LaunchBackoff, DoublesFromTheFirstAndStopsAtTheCap) {
  RestartPolicy p{.max_restarts = 10, .backoff_s = 1, .backoff_max_s = 30};
  EXPECT_DOUBLE_EQ(p.backoff(1), 1);
  EXPECT_DOUBLE_EQ(p.backoff(2), 2);
  EXPECT_DOUBLE_EQ(p.backoff(5), 16);
  EXPECT_DOUBLE_EQ(p.backoff(6), 30);
  EXPECT_DOUBLE_EQ(p.backoff(1'000'000), 30);  // no overflow on the way
  p.backoff_s = 0;
  EXPECT_DOUBLE_EQ(p.backoff(3), 0);
}

TEST(Supervisor, ChildrenThatExitZeroAreDoneAndTheSyncersEndEndsTheRun) {
  test::TempDir dir;
  SupervisorOptions o = quick(dir);
  const fs::path env = dir / "env";
  ChildSpec syncer = sh(Role::syncer, -1, "sleep 0.3; exit 0");
  ChildSpec u0 = sh(Role::unit, 0,
                    fmt::format("echo \"$DDILOCO_RESTART $DDILOCO_LAUNCH_PID $EXTRA\" > {}; exit 0",
                                env.string()));
  u0.env = {"EXTRA=given"};
  const SupervisorResult r =
      Supervisor(o).run(syncer, {u0, sh(Role::unit, 1, "sleep 0.1; exit 0")});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.syncer_restarts, 0);
  EXPECT_EQ(r.unit_restarts, (std::vector<int>{0, 0}));
  EXPECT_TRUE(r.given_up.empty());
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(slurp(env), fmt::format("0 {} given\n", ::getpid()));
  const auto all = events(o.log_path);
  EXPECT_EQ(events(o.log_path, "spawn").size(), 3u);
  EXPECT_EQ(events(o.log_path, "exit").size(), 3u);
  EXPECT_TRUE(events(o.log_path, "restart").empty());
  EXPECT_EQ(all.front().at("event"), "spawn");
  EXPECT_EQ(all.front().at("role"), "syncer");  // the syncer first
  EXPECT_EQ(all.front().at("argv"), (std::vector<std::string>{"/bin/sh", "-c", "sleep 0.3; exit 0"}));
  const json done = all.back();
  EXPECT_EQ(done.at("event"), "done");
  EXPECT_EQ(done.at("status"), 0);
  EXPECT_EQ(done.at("restarts").at("units"), (std::vector<int>{0, 0}));
  for (const json& j : all) EXPECT_TRUE(j.contains("elapsed_s")) << j.dump();
  expect_every_spawned_process_gone(o.log_path);
}

TEST(Supervisor, AFailingUnitIsRestartedWithDoublingBackoffThenGivenUp) {
  test::TempDir dir;
  SupervisorOptions o = quick(dir);  // 3 restarts: 0.05, 0.1, 0.15 (capped) s
  const fs::path starts = dir / "starts";
  const SupervisorResult r = Supervisor(o).run(
      sh(Role::syncer, -1, "sleep 1.5; exit 0"),
      {sh(Role::unit, 0, fmt::format("echo $DDILOCO_RESTART >> {}; exit 3", starts.string())),
       sh(Role::unit, 1, "sleep 0.2; exit 0")});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.unit_restarts, (std::vector<int>{3, 0}));
  EXPECT_EQ(r.given_up, (std::vector<int>{0}));
  EXPECT_EQ(slurp(starts), "0\n1\n2\n3\n");  // DDILOCO_RESTART of each start
  const auto all = events(o.log_path);
  const auto unit0 = of(all, "unit", 0);
  std::vector<double> backoffs;
  double exited_at = -1;
  for (const json& j : unit0) {
    if (j.at("event") == "exit") {
      EXPECT_EQ(j.at("status"), 3);
      EXPECT_EQ(j.at("signal"), 0);
      exited_at = j.at("elapsed_s");
    }
    if (j.at("event") == "restart") backoffs.push_back(j.at("backoff_s"));
    if (j.at("event") == "spawn" && j.at("restart") > 0) {
      // Started again no sooner than its backoff after it exited.
      EXPECT_GE(j.at("elapsed_s").get<double>() - exited_at, backoffs.back() - 1e-3) << j.dump();
    }
  }
  ASSERT_EQ(backoffs.size(), 3u);
  EXPECT_DOUBLE_EQ(backoffs[0], 0.05);
  EXPECT_DOUBLE_EQ(backoffs[1], 0.1);
  EXPECT_DOUBLE_EQ(backoffs[2], 0.15);
  ASSERT_EQ(events(o.log_path, "give_up").size(), 1u);
  const json g = events(o.log_path, "give_up")[0];
  EXPECT_EQ(g.at("unit"), 0);
  EXPECT_EQ(g.at("restarts"), 3);
  // The job went on without it: the syncer ran to its end.
  EXPECT_EQ(of(all, "syncer", -1).back().at("status"), 0);
  expect_every_spawned_process_gone(o.log_path);
}

TEST(Supervisor, MaxRestartsZeroNeverRestartsAndAProgramThatCannotRunIsGivenUpAtOnce) {
  test::TempDir dir;
  SupervisorOptions o = quick(dir);
  o.restart.max_restarts = 0;
  ChildSpec missing = sh(Role::unit, 1, "");
  missing.argv = {"/nonexistent/mpirun", "-np", "1"};
  ChildSpec unknown = sh(Role::unit, 2, "");
  unknown.argv = {"ddiloco-no-such-program"};
  const SupervisorResult r = Supervisor(o).run(sh(Role::syncer, -1, "sleep 0.3; exit 0"),
                                               {sh(Role::unit, 0, "exit 1"), missing, unknown});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.unit_restarts, (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(r.given_up, (std::vector<int>{1, 2, 0}));  // the two that cannot start, at once
  EXPECT_TRUE(events(o.log_path, "restart").empty());
  const auto give_ups = events(o.log_path, "give_up");
  ASSERT_EQ(give_ups.size(), 3u);
  EXPECT_NE(give_ups[0].at("reason").get<std::string>().find(
                "cannot run '/nonexistent/mpirun': No such file or directory"),
            std::string::npos) << give_ups[0].dump();
  EXPECT_NE(give_ups[1].at("reason").get<std::string>().find(
                "cannot run 'ddiloco-no-such-program': not found in PATH"),
            std::string::npos) << give_ups[1].dump();
  EXPECT_NE(give_ups[2].at("reason").get<std::string>().find("launch.max_restarts is 0"),
            std::string::npos) << give_ups[2].dump();
  expect_every_spawned_process_gone(o.log_path);
}

TEST(Supervisor, ASyncerKilledWithSigkillIsRestartedWithItsRestartCommand) {
  test::TempDir dir;
  SupervisorOptions o = quick(dir);
  o.kills = {{.at_s = 0.3, .role = Role::syncer}};
  ChildSpec syncer = sh(Role::syncer, -1, "exec sleep 30");
  syncer.restart_argv = {"/bin/sh", "-c", "echo resumed $DDILOCO_RESTART > " + (dir / "r").string()};
  const SupervisorResult r =
      Supervisor(o).run(syncer, {sh(Role::unit, 0, "sleep 0.5; exit 0")});
  EXPECT_EQ(r.status, 0);  // the restarted syncer's
  EXPECT_EQ(r.syncer_restarts, 1);
  EXPECT_EQ(r.kills, 1);
  EXPECT_EQ(slurp(dir / "r"), "resumed 1\n");
  const auto s = of(events(o.log_path), "syncer", -1);
  ASSERT_GE(s.size(), 5u);  // spawn, kill, exit, restart, spawn, exit
  EXPECT_EQ(s[1].at("event"), "kill");
  EXPECT_EQ(s[1].at("missed"), false);
  EXPECT_EQ(s[1].at("pid"), s[0].at("pid"));
  EXPECT_EQ(s[2].at("event"), "exit");
  EXPECT_EQ(s[2].at("signal"), SIGKILL);
  EXPECT_EQ(s[2].at("status"), 128 + SIGKILL);
  EXPECT_EQ(s[3].at("event"), "restart");
  EXPECT_EQ(s[4].at("argv")[2], "echo resumed $DDILOCO_RESTART > " + (dir / "r").string());
  expect_every_spawned_process_gone(o.log_path);
}

TEST(Supervisor, ASyncerGivenUpEndsTheJobWithItsStatusAndUnitsAreStopped) {
  test::TempDir dir;
  SupervisorOptions o = quick(dir);
  o.restart.max_restarts = 1;
  o.drain_s = 0.2;
  const Stopwatch clock;
  const SupervisorResult r = Supervisor(o).run(sh(Role::syncer, -1, "exit 5"),
                                               {sh(Role::unit, 0, "sleep 30")});
  EXPECT_LT(clock.seconds(), 5);
  EXPECT_EQ(r.status, 5);
  EXPECT_EQ(r.syncer_restarts, 1);
  EXPECT_EQ(r.unit_restarts, (std::vector<int>{0}));  // stopped by the end: not restarted
  const auto u = of(events(o.log_path), "unit", 0);
  ASSERT_EQ(u.back().at("event"), "exit");
  EXPECT_EQ(u.back().at("signal"), SIGTERM);
  EXPECT_EQ(events(o.log_path, "terminate").size(), 1u);
  expect_every_spawned_process_gone(o.log_path);
}

TEST(Supervisor, AStopSignalReachesEveryProcessGroupTheSyncerFirstAndStopsRestarts) {
  test::TempDir dir;
  SupervisorOptions o = quick(dir);
  o.next_signal = signal_at(SIGTERM, 0.5);
  const auto trap = [&](const std::string& name, int code) {
    return fmt::format("trap 'echo TERM >> {}; exit {}' TERM; sleep 30 & wait",
                       (dir / name).string(), code);
  };
  // Unit 1's "rank" runs in a process group (and session) of its own, as Open MPI's ranks do:
  // its parent's group does not hold it.
  const std::string rank = fmt::format(
      "setsid sh -c 'echo $$ > {}; trap \"echo TERM >> {}; exit 0\" TERM; sleep 30 & wait' & "
      "trap 'wait $!; exit 0' TERM; wait",
      (dir / "rank.pid").string(), (dir / "rank").string());
  const Stopwatch clock;
  const SupervisorResult r = Supervisor(o).run(
      sh(Role::syncer, -1, trap("syncer", 143)),
      {sh(Role::unit, 0, trap("unit0", 1)), sh(Role::unit, 1, rank)});
  EXPECT_LT(clock.seconds(), 5);
  EXPECT_EQ(r.signal, SIGTERM);
  EXPECT_EQ(r.status, 143);  // the syncer's
  EXPECT_EQ(slurp(dir / "syncer"), "TERM\n");
  EXPECT_EQ(slurp(dir / "unit0"), "TERM\n");
  EXPECT_EQ(slurp(dir / "rank"), "TERM\n");
  // Unit 0 exited 1 after the signal: not restarted.
  EXPECT_TRUE(events(o.log_path, "restart").empty());
  EXPECT_EQ(r.unit_restarts, (std::vector<int>{0, 0}));
  const auto forward = events(o.log_path, "forward");
  ASSERT_EQ(forward.size(), 1u);
  EXPECT_EQ(forward[0].at("signal"), SIGTERM);
  EXPECT_EQ(forward[0].at("syncer"), true);
  EXPECT_EQ(forward[0].at("units"), (std::vector<int>{0, 1}));
  expect_every_spawned_process_gone(o.log_path);
  EXPECT_TRUE(gone(pid_in(dir / "rank.pid")));
}

TEST(Supervisor, ASecondStopSignalKillsEveryChild) {
  test::TempDir dir;
  SupervisorOptions o = quick(dir);
  o.next_signal = signal_at(SIGINT, 0.3, 0.6);
  // Both ignore SIGINT (sleep inherits the ignored disposition).
  const Stopwatch clock;
  const SupervisorResult r = Supervisor(o).run(sh(Role::syncer, -1, "trap '' INT; sleep 30"),
                                               {sh(Role::unit, 0, "trap '' INT; sleep 30")});
  EXPECT_LT(clock.seconds(), 5);
  EXPECT_EQ(r.signal, SIGINT);
  EXPECT_EQ(r.status, 128 + SIGKILL);
  const auto forward = events(o.log_path, "forward");
  ASSERT_EQ(forward.size(), 2u);
  EXPECT_EQ(forward[1].at("signal"), SIGKILL);
  EXPECT_EQ(forward[1].at("received"), SIGINT);
  expect_every_spawned_process_gone(o.log_path);
}

TEST(Supervisor, AfterTheSyncerUnitsDrainThenGetSigtermThenSigkill) {
  test::TempDir dir;
  SupervisorOptions o = quick(dir);
  o.drain_s = 0.6;
  o.term_grace_s = 0.5;
  const std::string polite = fmt::format("trap 'echo TERM > {}; exit 0' TERM; sleep 30 & wait",
                                         (dir / "polite").string());
  const Stopwatch clock;
  const SupervisorResult r = Supervisor(o).run(
      sh(Role::syncer, -1, "sleep 0.1; exit 0"),
      {sh(Role::unit, 0, "sleep 0.3; exit 0"),     // ends by itself within the drain
       sh(Role::unit, 1, "trap '' TERM; sleep 30"),  // refuses SIGTERM
       sh(Role::unit, 2, polite)});
  const double took = clock.seconds();
  EXPECT_EQ(r.status, 0);
  EXPECT_GE(took, 0.1 + 0.6 + 0.5 - 0.05);
  EXPECT_LT(took, 5);
  EXPECT_EQ(slurp(dir / "polite"), "TERM\n");
  const auto all = events(o.log_path);
  EXPECT_EQ(of(all, "unit", 0).back().at("status"), 0);
  EXPECT_TRUE(of(events(o.log_path, "terminate"), "unit", 0).empty());
  const auto t1 = of(events(o.log_path, "terminate"), "unit", 1);
  ASSERT_EQ(t1.size(), 2u);
  EXPECT_EQ(t1[0].at("signal"), "SIGTERM");
  EXPECT_EQ(t1[1].at("signal"), "SIGKILL");
  EXPECT_EQ(of(all, "unit", 1).back().at("signal"), SIGKILL);
  const auto t2 = of(events(o.log_path, "terminate"), "unit", 2);
  ASSERT_EQ(t2.size(), 1u);
  EXPECT_EQ(t2[0].at("signal"), "SIGTERM");
  EXPECT_EQ(of(all, "unit", 2).back().at("status"), 0);
  EXPECT_EQ(events(o.log_path, "drain").size(), 1u);
  EXPECT_TRUE(events(o.log_path, "restart").empty());
  expect_every_spawned_process_gone(o.log_path);
}

TEST(Supervisor, ChaosKillsARanksProcessFromItsPidFileAndMissesStaleOnes) {
  test::TempDir dir;
  SupervisorOptions o = quick(dir);
  const fs::path P = o.pid_dir;
  fs::create_directories(P);
  // Unit 0: "rank 0" is the job's process, "rank 1" a process below it; both write their pid
  // files (atomically, as write_pid_file does). A restart exits 0 at once.
  const std::string unit0 = fmt::format(
      "[ \"$DDILOCO_RESTART\" = 1 ] && exit 0; "
      "sh -c 'echo $$ > {0}/r1.tmp; mv {0}/r1.tmp {0}/unit0.rank1.pid; exec sleep 30' & "
      "echo $$ > {0}/r0.tmp; mv {0}/r0.tmp {0}/unit0.rank0.pid; wait $!; exit $?",
      P.string());
  // Unit 2: killed at rank 0, its own process.
  const std::string unit2 = fmt::format(
      "[ \"$DDILOCO_RESTART\" = 1 ] && exit 0; echo $$ > {0}/unit2.rank0.pid; sleep 30",
      P.string());
  // The syncer writes unit 1's rank-1 file with its own pid (alive, fresh, but no process of
  // unit 1's), and rank 3's with the pid of a process that has ended; after unit 1's start.
  const std::string syncer = fmt::format(
      "sleep 0.2; echo $$ > {0}/unit1.rank1.pid; sh -c 'echo $$ > {0}/unit1.rank3.pid'; "
      "sleep 1.3; exit 0",
      P.string());
  // Written before the launch: stale by its time (and a pid no process has).
  write_text_atomically(P / "unit1.rank2.pid", "2147483000\n");
  fs::last_write_time(P / "unit1.rank2.pid",
                      fs::file_time_type::clock::now() - std::chrono::hours(1));
  write_text_atomically(P / "unit1.rank4.pid", "abc\n");
  o.kills = {{.at_s = 0.6, .role = Role::unit, .unit = 0, .rank = 1},
             {.at_s = 0.6, .role = Role::unit, .unit = 2},
             {.at_s = 0.6, .role = Role::unit, .unit = 1, .rank = 0},
             {.at_s = 0.6, .role = Role::unit, .unit = 1, .rank = 1},
             {.at_s = 0.6, .role = Role::unit, .unit = 1, .rank = 2},
             {.at_s = 0.6, .role = Role::unit, .unit = 1, .rank = 3},
             {.at_s = 0.6, .role = Role::unit, .unit = 1, .rank = 4},
             {.at_s = 0.6, .role = Role::unit, .unit = 5}};
  const SupervisorResult r = Supervisor(o).run(
      sh(Role::syncer, -1, syncer),
      {sh(Role::unit, 0, unit0), sh(Role::unit, 1, "sleep 1; exit 0"), sh(Role::unit, 2, unit2)});
  EXPECT_EQ(r.status, 0);  // the syncer, though its pid was in a unit's file, lived on
  EXPECT_EQ(r.kills, 2);
  EXPECT_EQ(r.kills_missed, 6);
  EXPECT_EQ(r.unit_restarts, (std::vector<int>{1, 0, 1}));
  const auto kills = events(o.log_path, "kill");
  ASSERT_EQ(kills.size(), 8u);
  const pid_t rank1 = pid_in(P / "unit0.rank1.pid");
  EXPECT_EQ(kills[0].at("missed"), false);
  EXPECT_EQ(kills[0].at("pid"), rank1);
  EXPECT_EQ(kills[0].at("rank"), 1);
  EXPECT_EQ(kills[1].at("missed"), false);
  const auto u0 = of(events(o.log_path, "exit"), "unit", 0);
  EXPECT_EQ(u0[0].at("status"), 128 + SIGKILL);  // wait $! saw its rank killed
  const auto u2 = of(events(o.log_path, "exit"), "unit", 2);
  EXPECT_EQ(u2[0].at("signal"), SIGKILL);
  const auto reason = [&](size_t i) { return kills[i].at("reason").get<std::string>(); };
  for (size_t i = 2; i < kills.size(); ++i) EXPECT_EQ(kills[i].at("missed"), true) << i;
  EXPECT_NE(reason(2).find("no pid file " + (P / "unit1.rank0.pid").string()), std::string::npos)
      << reason(2);
  EXPECT_NE(reason(3).find("is not part of unit 1's job"), std::string::npos) << reason(3);
  EXPECT_NE(reason(4).find("written before unit 1's job started"), std::string::npos) << reason(4);
  EXPECT_NE(reason(5).find("is gone"), std::string::npos) << reason(5);
  EXPECT_NE(reason(6).find("unit1.rank4.pid: expected one positive pid, got 'abc'"),
            std::string::npos) << reason(6);
  EXPECT_NE(reason(7).find("no unit 5 in this launch"), std::string::npos) << reason(7);
  expect_every_spawned_process_gone(o.log_path);
  EXPECT_TRUE(gone(rank1));
}

TEST(Supervisor, OrphansLeftByAChildThatEndedAreKilledAndReaped) {
  test::TempDir dir;
  SupervisorOptions o = quick(dir);
  o.restart.max_restarts = 0;
  // A process in a session of its own outlives its parent's group: killpg cannot reach it.
  const std::string unit = fmt::format("setsid sleep 30 & echo $! > {}; sleep 0.2; exit 4",
                                       (dir / "orphan.pid").string());
  const SupervisorResult r =
      Supervisor(o).run(sh(Role::syncer, -1, "sleep 0.8; exit 0"), {sh(Role::unit, 0, unit)});
  EXPECT_EQ(r.status, 0);
  const pid_t orphan = pid_in(dir / "orphan.pid");
  const auto orphans = events(o.log_path, "orphan");
  ASSERT_EQ(orphans.size(), 1u);
  EXPECT_EQ(orphans[0].at("pid"), orphan);
  EXPECT_EQ(orphans[0].at("comm"), "sleep");
  EXPECT_TRUE(gone(orphan));
  expect_every_spawned_process_gone(o.log_path);
}

// A unit job under the real mpirun, whose ranks it puts in process groups of their own (Open
// MPI 4.1): a kill of one rank ends the job, which is restarted; SIGTERM reaches the ranks.
TEST(Supervisor, ARealMpirunJobLosesARankIsRestartedAndItsRanksGetTheStopSignal) {
  if (::system("command -v mpirun > /dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun";
  test::TempDir dir;
  SupervisorOptions o = quick(dir);
  const fs::path P = o.pid_dir;
  fs::create_directories(P);
  const std::string rank_script = fmt::format(
      "r=$OMPI_COMM_WORLD_RANK; echo $$ > {0}/t$r; mv {0}/t$r {0}/unit0.rank$r.pid; "
      "[ \"$DDILOCO_RESTART\" = 0 ] && exec sleep 30; "
      "trap \"echo TERM >> {1}/term$r; exit 0\" TERM; touch {1}/ready$r; sleep 30 & wait",
      P.string(), dir.path().string());
  ChildSpec unit = sh(Role::unit, 0, "");
  unit.argv = {"mpirun", "-q", "--oversubscribe", "--bind-to", "none", "-np", "2",
               "/bin/sh", "-c", rank_script};
  unit.env = {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "OMPI_MCA_pml=ob1",
              "OMPI_MCA_btl=self,vader,tcp"};
  o.kills = {{.at_s = 2.0, .role = Role::unit, .unit = 0, .rank = 1}};
  // SIGTERM once the restarted job's ranks are ready for it.
  const fs::path ready0 = dir / "ready0", ready1 = dir / "ready1";
  bool sent = false;
  const Stopwatch clock;
  o.next_signal = [&]() -> int {
    if (sent || !fs::exists(ready0) || !fs::exists(ready1)) return 0;
    sent = true;
    return SIGTERM;
  };
  const SupervisorResult r =
      Supervisor(o).run(sh(Role::syncer, -1, "trap 'exit 143' TERM; sleep 30 & wait"), {unit});
  EXPECT_LT(clock.seconds(), 10);
  EXPECT_EQ(r.kills, 1) << slurp(o.log_path);
  EXPECT_EQ(r.unit_restarts, (std::vector<int>{1}));
  EXPECT_EQ(r.signal, SIGTERM);
  EXPECT_EQ(r.status, 143);
  const auto exits = of(events(o.log_path, "exit"), "unit", 0);
  ASSERT_EQ(exits.size(), 2u);
  EXPECT_NE(exits[0].at("status"), 0);  // mpirun ends the job that lost a rank
  // Each rank got the stop signal: from the launcher (every descendant's process group) and
  // from mpirun, which forwards it too; two close together may both run the trap.
  for (const char* f : {"term0", "term1"}) {
    const std::string got = slurp(dir / f);
    EXPECT_TRUE(got == "TERM\n" || got == "TERM\nTERM\n") << f << ": " << got;
  }
  expect_every_spawned_process_gone(o.log_path);
  EXPECT_TRUE(gone(pid_in(P / "unit0.rank0.pid")));
  EXPECT_TRUE(gone(pid_in(P / "unit0.rank1.pid")));
}

// ---------------------------------------------------------------- what ddiloco launch runs

TEST(LaunchPlan, SyncerAndUnitCommandLines) {
  Config c = load_config("", {"mode=decoupled", "units.count=3", "units.ranks=[1, 2, 1]",
                              "launch.mpirun=/opt/mpirun", "launch.mpirun_args=[--mca, x, y]",
                              "run.threads=2"});
  const LaunchArgs args{.config_path = "c.yaml",
                        .overrides = {"units.count=3", "train.lr=1e-3"},
                        .resume = "runs/x/checkpoints/ckpt_00000002",
                        .overwrite = true,
                        .self = "/bin/ddiloco"};
  const LaunchPlan p = plan_launch(c, args);
  using V = std::vector<std::string>;
  EXPECT_EQ(p.syncer.role, Role::syncer);
  EXPECT_EQ(p.syncer.argv, (V{"/bin/ddiloco", "syncer", "--config", "c.yaml", "--set",
                              "units.count=3", "--set", "train.lr=1e-3", "--set",
                              "syncer.http=127.0.0.1:0", "--resume",
                              "runs/x/checkpoints/ckpt_00000002", "--overwrite"}));
  EXPECT_EQ(p.syncer.restart_argv, (V{"/bin/ddiloco", "syncer", "--config", "c.yaml", "--set",
                                      "units.count=3", "--set", "train.lr=1e-3", "--set",
                                      "syncer.http=127.0.0.1:0", "--resume", "auto"}));
  ASSERT_EQ(p.units.size(), 3u);
  EXPECT_EQ(p.units[1].unit, 1);
  EXPECT_EQ(p.units[1].argv,
            (V{"/opt/mpirun", "-q", "--oversubscribe", "--bind-to", "none", "--mca", "x", "y",
               "-np", "2", "/bin/ddiloco", "unit", "--config", "c.yaml", "--unit", "1", "--set",
               "units.count=3", "--set", "train.lr=1e-3"}));
  EXPECT_EQ(p.units[2].argv[9], "1");  // -np of unit 2
  EXPECT_TRUE(p.units[0].restart_argv.empty());  // a unit restarts as it started

  // run.threads: 0 is shared out over the syncer and every unit's ranks, as in one job.
  c.run.threads = 0;
  const LaunchPlan shared = plan_launch(c, args);
  for (const auto* argv : {&shared.syncer.argv, &shared.units[0].argv, &shared.units[1].argv}) {
    const auto it = std::find_if(argv->begin(), argv->end(),
                                 [](const std::string& a) { return a.starts_with("run.threads="); });
    ASSERT_NE(it, argv->end());
    EXPECT_GE(std::stoi(it->substr(12)), 1);
  }

  for (const char* mode : {"ddp", "single"}) {
    Config m = load_config("", {std::string("mode=") + mode});
    try {
      plan_launch(m, args);
      ADD_FAILURE() << mode << " was planned";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("launch: mode ") + mode),
                std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("ddiloco train"), std::string::npos) << e.what();
    }
  }
  for (const char* mode : {"diloco", "streaming"})
    EXPECT_NO_THROW(plan_launch(load_config("", {std::string("mode=") + mode}), args));
}

TEST(LaunchPlan, KillsComeFromTheChaosSchedule) {
  test::TempDir dir;
  test::write_bytes(dir / "faults.yaml",
                    "faults:\n"
                    "  - {unit: 1, kind: crash, start_s: 3, duration_s: 2}\n"
                    "  - {unit: 1, kind: kill, rank: 1, start_s: 12}\n"
                    "  - {kind: kill_syncer, start_s: 30}\n");
  const Config c = load_config("", {"mode=decoupled", "units.count=2", "units.ranks=[1, 2]",
                                    "chaos.schedule_file=" + (dir / "faults.yaml").string()});
  const std::vector<ScheduledKill> k = scheduled_kills(c);
  ASSERT_EQ(k.size(), 2u);
  EXPECT_EQ(k[0].role, Role::unit);
  EXPECT_EQ(k[0].unit, 1);
  EXPECT_EQ(k[0].rank, 1);
  EXPECT_DOUBLE_EQ(k[0].at_s, 12);
  EXPECT_EQ(k[1].role, Role::syncer);
  EXPECT_DOUBLE_EQ(k[1].at_s, 30);
  EXPECT_TRUE(scheduled_kills(load_config("", {"mode=decoupled"})).empty());
}

}  // namespace
}  // namespace ddiloco::launch
