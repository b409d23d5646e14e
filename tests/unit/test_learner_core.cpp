// A unit leader's decisions (learner_core.hpp) over the in-memory transport, with the
// syncer's side written by hand through a SyncerWindow and a job clock the test moves: what
// only the e2e tests reached before (take and apply after τ, waiting, stops, checkpoints,
// crashes, rejoins, a restarted syncer's offer, the budget spent alone).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "ddiloco/config.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/fragments.hpp"
#include "ddiloco/outer_plan.hpp"
#include "ddiloco/model.hpp"
#include "ddiloco/sync_window.hpp"
#include "local_link.hpp"
#include "learner/learner_core.hpp"

namespace ddiloco::learner {
namespace {

using protocol::Control;

// The plan of `mode` as a config gives it (OuterPlan::from: the mode table itself).
OuterPlan plan_of(const std::string& mode, int fragments = 1, int h = 4, int overlap = 0, int64_t warmup = 0) {
  return OuterPlan::from(load_config(
      "", {"mode=" + mode, "units.count=2", "outer.fragments=" + std::to_string(fragments),
           "outer.h=" + std::to_string(h), "outer.overlap=" + std::to_string(overlap),
           "outer.warmup_steps=" + std::to_string(warmup), "syncer.quorum=1"}));
}
OuterPlan decoupled(int fragments, int h, int overlap, int64_t warmup = 0) {
  return plan_of("decoupled", fragments, h, overlap, warmup);
}
OuterPlan diloco(int h) { return plan_of("diloco", 1, h); }

LearnerCore::Settings settings() {
  LearnerCore::Settings s;
  s.max_steps = 1000;
  s.token_budget = 1'000'000;
  s.job_step_tokens = 100;
  return s;
}

// One unit (u = 0) and the syncer's side of its window, on a job clock the test owns: the
// core's sleeps move it (no real time passes), and `tick` moves it at every reading.
struct Rig {
  ParameterLayout layout = ParameterLayout::gpt2(GptConfig{16, 4, 1, 2, 8});
  OuterPlan plan;
  protocol::FragmentPlan fragments;
  protocol::WindowLayout windows{fragments, wire::Codec{}};
  test::LocalRemote remote{1};
  test::LocalExposed memory{windows.bytes()};
  protocol::LearnerWindow window{memory, windows};
  protocol::SyncerWindow syncer{remote, windows};
  std::atomic<double> now{0};
  double tick = 0;
  std::vector<nlohmann::json> events;
  std::atomic<double> reconnect{-1};  // ≥ 0: the link's next answer, a restarted syncer admitted us
  std::optional<bool> present;      // a syncer connected (empty: the one-job deployment)
  int flushes = 0;                  // cuda's flush_snapshots calls
  LearnerCore core;

  explicit Rig(const OuterPlan& p, LearnerCore::Settings s = settings(), chaos::Schedule faults = {})
      : plan(p), fragments(layout, p.fragments, p.h, p.warmup), core(make(s, std::move(faults))) {
    remote.attach(0, &memory);
  }
  LearnerCore make(LearnerCore::Settings s, chaos::Schedule faults) {
    LearnerCore::Env env;
    env.job_time = [this] { return now = now + tick; };
    env.sleep = [this](double dt) { now = now + dt; };
    env.log = [this](nlohmann::json e) { events.push_back(std::move(e)); };
    env.reconnected = [this]() -> std::optional<double> {
      const double gone = reconnect.exchange(-1);
      return gone >= 0 ? std::optional<double>(gone) : std::nullopt;
    };
    env.syncer_present = [this] { return present.value_or(true); };
    env.flush_snapshots = [this] { ++flushes; };
    return LearnerCore(plan, fragments, &window, s, chaos::UnitTimeline(faults, 0), std::move(env));
  }
  size_t numel(int p) const { return windows.numel(p); }

  // The syncer's side.
  void set(Control w, int64_t v) { ASSERT_TRUE(syncer.set_control(0, w, v)); }
  int64_t word(Control w) const { return window.control(w); }
  int64_t header(int p, protocol::Header h) {
    std::vector<protocol::UnitHeaders> hs;
    syncer.poll(hs, true);
    return hs[0].header(p, h);
  }
  void deliver(int p, int64_t version, float value) {
    syncer.deliver(0, p, version, std::vector<float>(numel(p), value));
  }
  // Reads p's outbox as the syncer does; returns the problem found ("" when it is sound).
  std::string read_outbox(int p) {
    std::vector<protocol::UnitHeaders> h;
    syncer.poll(h, true);
    std::vector<float> got(numel(p));
    const auto f = syncer.fetch(0, p, h[0], got);
    if (f.problem.empty()) syncer.ack(0, p, f.seq_after);
    return f.problem;
  }
  // The leader's part of a step after which fragment p goes out.
  void publish(int p, int64_t t, Actions& a) {
    const auto meta = core.claim_outbox(p, t, a);
    ASSERT_TRUE(meta);
    core.publish(p, std::vector<float>(numel(p), 0.5f), *meta);
    core.record_sends(a);
  }
  bool logged(const std::string& event) const {
    for (const auto& e : events)
      if (e["event"] == event) return true;
    return false;
  }
};

// The syncer acting while the core waits: once `ready()` holds, `act()` runs. If it never
// holds within 5 s, kStop ends every wait of the core instead and `in_time()` is false.
class When {
 public:
  When(Rig& r, std::function<bool()> ready, std::function<void()> act)
      : thread_([&r, this, ready = std::move(ready), act = std::move(act)] {
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
          while (!ready()) {
            if (std::chrono::steady_clock::now() > deadline) {
              late_ = true;
              r.set(protocol::kStop, 1);
              return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          act();
        }) {}
  ~When() { in_time(); }
  bool in_time() {
    if (thread_.joinable()) thread_.join();
    return !late_;
  }

 private:
  bool late_ = false;
  std::thread thread_;
};

// The core is waiting: its heartbeat moved on (it beats at every poll of a wait).
std::function<bool()> waiting(Rig& r) {
  return [&r, beats = r.word(protocol::kHeartbeat)] { return r.word(protocol::kHeartbeat) > beats + 2; };
}

TEST(LearnerCore, AMergeAppliesTauStepsAfterOurSnapshotLeftNeverBefore) {
  Rig r(decoupled(2, 4, 1));
  EXPECT_TRUE(r.core.due(2, false).empty()) << "nothing is due before the first H steps";
  const std::vector<int> due = r.core.due(4, false);
  ASSERT_EQ(due.size(), 1u);  // staggered fragments: one due every H/P steps
  const int p = due[0];
  Actions a(2);
  r.publish(p, 4, a);
  EXPECT_EQ(a.sent[p], 1);
  r.deliver(p, 1, 0.25f);  // the syncer merged at once

  Actions same(2);
  r.core.take_merges(4, same);
  EXPECT_TRUE(same.apply.empty()) << "applied before τ = 1 steps had passed";
  EXPECT_EQ(r.core.fragment(p).pending_version, 1) << "taken at once, so that the syncer can deliver again";
  EXPECT_EQ(r.core.fragment(p).pending[0], 0.25f);

  Actions next(2);
  r.core.take_merges(5, next);
  ASSERT_EQ(next.apply.size(), 1u);
  EXPECT_EQ(next.apply[0], std::make_pair(p, int64_t{1}));
  r.core.applied(p, 1);
  EXPECT_EQ(r.core.fragment(p).applied, 1);
  EXPECT_EQ(r.core.fragment(p).sent_step, -1);

  // A merge with no snapshot of ours in flight is taken but waits for our next one.
  r.deliver(1 - p, 1, 0.75f);
  Actions later(2);
  r.core.take_merges(6, later);
  EXPECT_TRUE(later.apply.empty());
  EXPECT_EQ(r.core.fragment(1 - p).pending_version, 1);
}

TEST(LearnerCore, APublishWaitsForTheSyncerToReadThePreviousOne) {
  Rig r(decoupled(1, 2, 1));
  Actions a(1);
  r.publish(0, 2, a);
  Actions b(1);
  EXPECT_FALSE(r.core.claim_outbox(0, 4, b)) << "overwrote an unread snapshot";
  EXPECT_EQ(b.sent[0], 0);
  EXPECT_EQ(r.core.publishes_skipped(), 1);
  EXPECT_EQ(r.word(protocol::kPublishSkipped), 1);
  r.read_outbox(0);
  Actions c(1);
  const auto meta = r.core.claim_outbox(0, 6, c);
  ASSERT_TRUE(meta);
  EXPECT_EQ(meta->step, 6);
}

TEST(LearnerCore, CountersReportStepsAndTokensAndCarryKeepsTheStepsSinceTheSend) {
  for (const bool carry : {false, true}) {
    LearnerCore::Settings s = settings();
    s.carry = carry;
    Rig r(decoupled(1, 2, 1), s);
    for (int i = 0; i < 3; ++i) r.core.count_step(100);
    Actions a(1);
    const auto meta = r.core.claim_outbox(0, 3, a);
    ASSERT_TRUE(meta);
    EXPECT_EQ(meta->c_steps, 3);
    EXPECT_EQ(meta->c_tok, 300);
    r.core.record_sends(a);
    r.core.count_step(50);  // the τ step after the send
    r.core.applied(0, 1);
    EXPECT_EQ(r.core.fragment(0).c_steps, carry ? 1 : 0) << "carry " << carry;
    EXPECT_EQ(r.core.fragment(0).c_tok, carry ? 50 : 0) << "carry " << carry;
  }
}

// A job resumed with a smaller batch restored counters claiming more tokens than their steps
// make at the new batch; the syncer refuses those (c_tok ≤ c_steps × tps). The steps are
// refitted to the tokens, rounded up, and counters that fit are left as they are.
TEST(LearnerCore, CountersRestoredUnderALargerBatchAreRefittedToTheSyncersCheck) {
  FragmentState f;
  f.c_steps = 4;
  f.c_tok = 400;  // 100 tokens per step before
  f.fit_counters(30);
  EXPECT_EQ(f.c_steps, 14) << "400 tokens at 30 per step take 13.3 steps";
  EXPECT_LE(f.c_tok, f.c_steps * 30);
  f.fit_counters(200);  // a larger batch: they fit as they are
  EXPECT_EQ(f.c_steps, 14);
  EXPECT_EQ(f.c_tok, 400);
  FragmentState none;
  none.fit_counters(30);
  EXPECT_EQ(none.c_steps, 0);
}

TEST(LearnerCore, SynchronousModesWaitForTheMergeOfTheirOwnSnapshot) {
  Rig r(diloco(2));
  Actions a(1);
  r.publish(0, 2, a);
  When syncer(r, waiting(r), [&] { r.deliver(0, 1, 0.5f); });
  Actions now(1);
  EXPECT_FALSE(r.core.take_merges(2, now));
  EXPECT_TRUE(syncer.in_time()) << "the unit never waited, beating, for its merge";
  ASSERT_EQ(now.apply.size(), 1u) << "went on without the merge";
  EXPECT_EQ(now.apply[0].second, 1);
}

TEST(LearnerCore, AWaitEndsOnAStopOrOnACrashThatComesDue) {
  {
    Rig r(diloco(2));
    Actions a(1);
    r.publish(0, 2, a);
    When stop(r, waiting(r), [&] { r.set(protocol::kStop, 1); });
    Actions now(1);
    EXPECT_FALSE(r.core.take_merges(2, now));
    EXPECT_TRUE(stop.in_time()) << "the unit did not wait for its merge";
    EXPECT_TRUE(now.apply.empty());
  }
  {
    chaos::Schedule s;
    s.faults.push_back({.unit = 0, .kind = chaos::FaultKind::crash, .start_s = 10, .duration_s = 1});
    Rig r(diloco(2), settings(), s);
    r.tick = 1;  // job time moves on while the unit waits
    Actions a(1);
    r.publish(0, 2, a);
    Actions now(1);
    EXPECT_TRUE(r.core.take_merges(2, now)) << "a crash due while waiting must be taken";
    r.core.decide_crash(now, 2, false, true, 1.0, 1.0);
    EXPECT_TRUE(now.crash);
    EXPECT_EQ(r.core.crash_cause(), CrashCause::chaos);
  }
}

TEST(LearnerCore, TheWarmUpAppliesEveryMergeBeforeTheNextStep) {
  Rig r(decoupled(2, 4, 1, /*warmup=*/2));
  EXPECT_EQ(r.core.due(1, false).size(), 2u) << "every fragment goes out every warm-up step";
  Actions a(2);
  r.publish(0, 1, a);
  r.publish(1, 1, a);
  r.deliver(0, 1, 0.5f);
  r.deliver(1, 1, 0.5f);
  Actions now(2);
  r.core.take_merges(1, now);
  EXPECT_EQ(now.apply.size(), 2u) << "τ is 0 in the warm-up";
  EXPECT_TRUE(r.core.due(3, true).empty()) << "poisoned parameters are never published";
}

TEST(LearnerCore, StopsOnTheSyncersWordTheStepLimitOrDilocosNamedRound) {
  Rig r(diloco(2));
  Actions none(1);
  EXPECT_FALSE(r.core.decide_stop(none, 10, false));
  EXPECT_TRUE(r.core.decide_stop(none, 1000, false)) << "train.steps";
  r.set(protocol::kStopAfterVersion, 2);
  Actions round1(1), round2(1);
  round1.apply.emplace_back(0, 1);
  round2.apply.emplace_back(0, 2);
  EXPECT_FALSE(r.core.decide_stop(round1, 10, false));
  EXPECT_TRUE(r.core.decide_stop(round2, 10, false)) << "every unit ends on the named round";
  Rig s(decoupled(1, 2, 1));
  s.set(protocol::kStop, 1);
  EXPECT_TRUE(s.core.decide_stop(none, 10, false));
}

TEST(LearnerCore, CheckpointsAreWrittenWhenAskedAndAtAStop) {
  LearnerCore::Settings set = settings();
  set.checkpoint_at_stop = true;
  Rig r(decoupled(1, 2, 1), set);
  auto decide = [&r](bool stop) { return r.core.decide_checkpoint(stop, r.core.requested_checkpoint()); };
  EXPECT_EQ(decide(false), 0);
  r.set(protocol::kCheckpointWant, 3);
  EXPECT_EQ(decide(false), 3);
  r.core.checkpoint_written(3, true);
  EXPECT_EQ(r.word(protocol::kCheckpointDone), 3);
  EXPECT_EQ(r.core.requested_checkpoint(), 0) << "written once";
  EXPECT_EQ(decide(false), 0) << "written once";
  r.set(protocol::kCheckpointNext, 7);
  EXPECT_EQ(decide(true), 7) << "at a stop: the next one the syncer completes";
  set.checkpoint_at_stop = false;
  Rig quiet(decoupled(1, 2, 1), set);
  EXPECT_EQ(quiet.core.decide_checkpoint(true, 0), 0) << "a stop writes none unless asked or checkpoint.at_stop";
  quiet.set(protocol::kCheckpointNext, 4);
  EXPECT_EQ(quiet.core.decide_checkpoint(false, 4), 4) << "ddp: the id the leaders agreed on, whatever the window says";
  EXPECT_EQ(quiet.core.decide_checkpoint(true, 4), 4) << "asked for at a stop: the next one";
  r.core.checkpoint_written(7, false);
  EXPECT_EQ(r.word(protocol::kCheckpointFailed), 7);
  EXPECT_EQ(r.core.next_checkpoint_id(), 8) << "a failed id is not tried again";
}

TEST(LearnerCore, AChaosCrashLosesTheUnreadSnapshotsGoesSilentAndRejoinsFromTheta) {
  chaos::Schedule s;
  s.faults.push_back({.unit = 0, .kind = chaos::FaultKind::crash, .start_s = 5, .duration_s = 2});
  Rig r(decoupled(2, 4, 1), settings(), s);
  Actions a(2);
  r.publish(0, 2, a);  // unread when the crash comes
  r.now = 5.5;
  Actions crash(2);
  r.core.decide_crash(crash, 3, false, false, 1.0, 1.0);
  ASSERT_TRUE(crash.crash);
  EXPECT_FALSE(crash.keep_memory);
  EXPECT_EQ(crash.down_ms, 1500);
  EXPECT_EQ(crash.lost, (std::vector<int64_t>{1, 0}));

  // The syncer serves the rejoin: Θ raw into every inbox, then kRejoinServed.
  const int64_t beats = r.word(protocol::kHeartbeat);
  const double down_from = r.now;
  When syncer(r, [&] { return r.word(protocol::kRejoinRequest) >= 1; }, [&] {
    EXPECT_EQ(r.word(protocol::kHeartbeat), beats) << "a unit that is down must not beat";
    EXPECT_GE(r.now, down_from + 1.5) << "asked to rejoin before its down time was over";
    for (int p = 0; p < 2; ++p) r.syncer.deliver(0, p, 4 + p, std::vector<float>(r.numel(p), 0.125f), true);
    r.set(protocol::kRejoinServed, 1);
  });
  ASSERT_TRUE(r.core.go_down(crash, 3, false));
  EXPECT_TRUE(syncer.in_time());
  EXPECT_TRUE(r.logged("crash"));
  EXPECT_NE(r.read_outbox(0), "") << "the crash must turn the unread snapshot to garbage";
  std::vector<int64_t> words(3, 0);
  r.core.fetch_theta(words);
  EXPECT_EQ(words, (std::vector<int64_t>{0, 4, 5}));
  EXPECT_EQ(r.core.fragment(1).pending[0], 0.125f);
  r.core.started_over(words);
  EXPECT_EQ(r.core.fragment(0).applied, 4);
  EXPECT_EQ(r.core.fragment(1).sends, 5);
  EXPECT_EQ(r.core.fragment(0).c_steps, 0);
  EXPECT_EQ(r.core.rejoins(), 1);
}

TEST(LearnerCore, ADivergedStepStartsOverAtOnceLosingNothing) {
  Rig r(decoupled(2, 4, 1));
  Actions a(2);
  r.publish(0, 2, a);
  Actions crash(2);
  r.core.decide_crash(crash, 3, /*non_finite=*/true, false, NAN, NAN);
  EXPECT_TRUE(crash.crash);
  EXPECT_EQ(crash.down_ms, 0);
  EXPECT_EQ(crash.lost, (std::vector<int64_t>{0, 0})) << "snapshots taken before the poison stay";
  EXPECT_FALSE(crash.keep_memory) << "poisoned parameters must not be kept";
  EXPECT_EQ(r.core.crash_cause(), CrashCause::non_finite);
  EXPECT_EQ(r.flushes, 1) << "cuda: the snapshots on their way, taken before the poison, must go out";
  EXPECT_TRUE(r.logged("non_finite"));
}

TEST(LearnerCore, ARestartedSyncerGetsOurThetaAndDecoupledTrainsOn) {
  Rig r(decoupled(2, 4, 1));
  r.deliver(0, 3, 0.5f);
  Actions take(2);
  r.core.take_merges(2, take);
  r.reconnect = 2.5;
  Actions a(2);
  r.core.decide_crash(a, 3, false, false, 1.0, 1.0);
  EXPECT_FALSE(a.crash) << "decoupled with τ ≥ 1 keeps its steps";
  EXPECT_TRUE(r.logged("syncer_back"));
  EXPECT_EQ(r.word(protocol::kOfferFor), 1);
  // The offer: our newest Θ_0 (version 3) in the held inbox, raw.
  std::vector<protocol::UnitHeaders> h;
  r.syncer.poll(h, true);
  EXPECT_EQ(h[0].header(0, protocol::kInVersion), 3);
  std::vector<float> got(r.numel(0));
  EXPECT_EQ(r.syncer.fetch_offer(0, 0, h[0], got), "");
  EXPECT_EQ(got[0], 0.5f);
  EXPECT_EQ(r.header(0, protocol::kInAck), -1) << "inboxes held while the offer stands";
  // Taken: our inboxes are ours again, and the next merge comes in as usual.
  r.set(protocol::kOfferTaken, 1);
  Actions settle(2);
  r.core.take_merges(3, settle);
  EXPECT_EQ(r.header(0, protocol::kInAck), 3) << "the inbox must say what we took last";
  r.deliver(0, 4, 0.75f);
  EXPECT_EQ(r.core.take(0), 4);
}

TEST(LearnerCore, ARestartedSyncerMakesAWaitingModeStartOverKeepingItsMemory) {
  Rig r(diloco(2));
  r.reconnect = 1.0;
  Actions a(1);
  r.core.decide_crash(a, 3, false, false, 1.0, 1.0);
  EXPECT_TRUE(a.crash);
  EXPECT_TRUE(a.keep_memory);
  EXPECT_EQ(r.core.crash_cause(), CrashCause::syncer_restart);

  Rig d(decoupled(1, 2, 1));
  d.reconnect = 1.0;
  Actions b(1);
  d.core.decide_crash(b, 3, false, false, 1.0, 1.0);
  EXPECT_FALSE(b.crash);
  d.set(protocol::kStartOver, 1);  // the syncer refused our copy
  Actions c(1);
  d.core.decide_crash(c, 4, false, false, 1.0, 1.0);
  EXPECT_TRUE(c.crash);
  EXPECT_TRUE(c.keep_memory);
  EXPECT_TRUE(d.logged("syncer_start_over"));
}

TEST(LearnerCore, AUnitAloneStopsAtTheBudgetItEstimatesUntilASyncerSaysStop) {
  LearnerCore::Settings s = settings();
  s.token_budget = 1000;
  Rig r(decoupled(1, 2, 1), s);
  r.present = false;  // the isolated deployment, no syncer
  r.set(protocol::kJobTokens, 800);
  r.core.wait_if_budget_spent_alone(10);  // estimate 800
  r.core.wait_if_budget_spent_alone(11);  // 900
  EXPECT_FALSE(r.logged("budget_spent_alone"));
  When stop(r, waiting(r), [&] { r.set(protocol::kStop, 1); });
  r.core.wait_if_budget_spent_alone(12);  // 1000: waits, beating
  EXPECT_TRUE(stop.in_time()) << "the unit did not wait at the budget";
  EXPECT_TRUE(r.logged("budget_spent_alone"));

  Rig with(decoupled(1, 2, 1), s);  // a syncer is there: it counts the tokens
  with.set(protocol::kJobTokens, 5000);
  with.core.wait_if_budget_spent_alone(10);
  EXPECT_FALSE(with.logged("budget_spent_alone"));
}

TEST(LearnerCore, ProgressAndTheLrScheduleOnTheJobClock) {
  Rig r(decoupled(1, 2, 1));
  r.core.report_progress(7, 700, 0.25);
  EXPECT_EQ(r.word(protocol::kStepsDone), 7);
  EXPECT_EQ(r.word(protocol::kTokensDone), 700);
  EXPECT_EQ(r.word(protocol::kStepTimeNs), 250'000'000);
  r.set(protocol::kJobTokens, 1234);
  EXPECT_EQ(r.core.schedule_step(), 12);
}

TEST(LearnerCore, DecoupledWithTauZeroWaitsForAnyMergeNewerThanItsOwn) {
  Rig r(decoupled(1, 2, 0));
  Actions a(1);
  r.publish(0, 2, a);
  When syncer(r, waiting(r), [&] { r.deliver(0, 1, 0.5f); });
  Actions now(1);
  r.core.take_merges(2, now);
  EXPECT_TRUE(syncer.in_time()) << "τ = 0: the merge is needed before the next step";
  ASSERT_EQ(now.apply.size(), 1u);
}

TEST(LearnerCore, AWaitEndsWhenARestartedSyncerAdmitsUs) {
  Rig r(diloco(2));
  Actions a(1);
  r.publish(0, 2, a);
  When syncer(r, waiting(r), [&] { r.reconnect = 2.0; });  // it will never send our merge
  Actions now(1);
  r.core.take_merges(2, now);
  EXPECT_TRUE(syncer.in_time());
  EXPECT_TRUE(now.apply.empty());
  r.core.decide_crash(now, 2, false, false, 1.0, 1.0);  // the restart is remembered until here
  EXPECT_TRUE(now.crash) << "diloco starts over from the restarted syncer's Θ";
  EXPECT_TRUE(r.logged("syncer_back"));
}

TEST(LearnerCore, ADivergedStepComesBeforeACrashAndAStopBeforeBoth) {
  chaos::Schedule s;
  s.faults.push_back({.unit = 0, .kind = chaos::FaultKind::crash, .start_s = 0, .duration_s = 1});
  Rig r(decoupled(1, 2, 1), settings(), s);
  Actions stop(1);
  stop.stop = true;
  r.core.decide_crash(stop, 3, true, true, NAN, NAN);
  EXPECT_FALSE(stop.crash) << "a unit told to stop does not start over";
  Actions both(1);
  r.core.decide_crash(both, 3, true, false, NAN, NAN);
  EXPECT_TRUE(both.crash);
  EXPECT_EQ(r.core.crash_cause(), CrashCause::non_finite);
  EXPECT_EQ(both.down_ms, 0);
  Actions later(1);
  r.core.decide_crash(later, 4, false, false, 1.0, 1.0);
  EXPECT_EQ(r.core.crash_cause(), CrashCause::chaos) << "the chaos crash is still due";
}

TEST(LearnerCore, AUnitToldToStopWhileDownDoesNotRejoin) {
  Rig r(decoupled(1, 2, 1));
  r.set(protocol::kStop, 1);
  Actions crash(1);
  crash.crash = true;
  crash.down_ms = 500;
  EXPECT_FALSE(r.core.go_down(crash, 3, false));
  EXPECT_EQ(r.word(protocol::kRejoinRequest), 0);
  EXPECT_EQ(r.core.rejoins(), 0);
}

TEST(LearnerCore, AMergedFragmentThatFailsItsChecksumIsRefused) {
  Rig r(decoupled(1, 2, 1));
  r.deliver(0, 1, 0.5f);
  reinterpret_cast<float*>(r.memory.base() + r.windows.inbox_offset(0))[3] += 1.0f;  // torn on the way
  EXPECT_THROW(r.core.take(0), Error);
}

TEST(LearnerCore, DdpHasNoOuterLoopButComesBackFromACrash) {
  Rig r(plan_of("ddp"));
  EXPECT_TRUE(r.core.due(4, false).empty());
  Actions none(1);
  EXPECT_FALSE(r.core.decide_stop(none, 10, false));
  EXPECT_TRUE(r.core.decide_stop(none, 10, true)) << "ddp stops on the units' agreed vote";
  Actions crash(1);
  crash.crash = true;
  EXPECT_TRUE(r.core.go_down(crash, 3, false)) << "the others wait in the all-reduce: it comes back";
  EXPECT_EQ(r.word(protocol::kRejoinRequest), 0) << "there is no syncer's Θ to rejoin from";
}

TEST(LearnerCore, ActionsCrossTheUnitAsWords) {
  Actions a(3);
  a.stop = true;
  a.crash = a.keep_memory = true;
  a.down_ms = 250;
  a.lost = {1, 0, 1};
  a.sent = {0, 1, 0};
  a.apply = {{0, 4}, {2, 9}};
  a.schedule_step = 17;
  a.checkpoint = 3;
  const Actions b = Actions::decode(a.encode(3), 3);
  EXPECT_EQ(b.stop, a.stop);
  EXPECT_EQ(b.crash, a.crash);
  EXPECT_EQ(b.keep_memory, a.keep_memory);
  EXPECT_EQ(b.down_ms, a.down_ms);
  EXPECT_EQ(b.lost, a.lost);
  EXPECT_EQ(b.sent, a.sent);
  EXPECT_EQ(b.apply, a.apply);
  EXPECT_EQ(b.schedule_step, a.schedule_step);
  EXPECT_EQ(b.checkpoint, a.checkpoint);
}

}  // namespace
}  // namespace ddiloco::learner
