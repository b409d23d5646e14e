// The syncer's decisions (syncer_core.hpp) through the in-memory transport (local_link.hpp) and
// a manual clock: minimum quorum, adaptive grace window, token weights, flow control of
// deliveries, the order of a rejoin in a synchronous mode, liveness, a lost unit and its new
// process, staleness, and a snapshot that counts only from its arrival over a slow link. The
// learners are their windows (sync_window.hpp), driven by hand as a leader would drive them.
#include <gtest/gtest.h>


#include <cmath>
#include <limits>
#include <memory>

#include "ddiloco/error.hpp"
#include "ddiloco/merge.hpp"
#include "ddiloco/runtime.hpp"
#include "ddiloco/syncer_core.hpp"
#include "ddiloco/wan.hpp"
#include "local_link.hpp"

namespace ddiloco::syncer {
namespace {

using nlohmann::json;

Config small_config(Mode mode, int units, int quorum) {
  Config c;
  c.mode = mode;
  c.model = GptConfig{16, 4, 1, 2, 8};
  c.units.count = units;
  c.train.batch_size = 25;  // B·T = 100 tokens per step: the snapshots below claim 400 in 4
  c.outer.fragments = 2;
  c.outer.h = 4;
  c.outer.overlap = 1;
  c.syncer.quorum = quorum;
  c.syncer.grace_gamma = 0;  // no grace unless a test asks for it
  c.syncer.heartbeat_timeout_s = 5;
  c.wan.format = "fp32";     // exact values: the wire formats are test_window_protocol's
  return c;
}

// A syncer core over M in-memory windows, each driven by a fake leader, on a manual clock.
struct Harness {
  Config config;
  OuterPlan plan;
  ParameterLayout parameters;
  protocol::FragmentPlan fragments;
  protocol::WindowLayout layout;
  test::LocalRemote remote;
  std::vector<std::unique_ptr<test::LocalExposed>> memory;
  std::vector<std::unique_ptr<protocol::LearnerWindow>> learners;
  protocol::SyncerWindow window;
  syncer::UnitLinks links;
  double clock = 0;
  std::vector<json> events;
  syncer::SyncerCore core;

  explicit Harness(const Config& c)
      : config(c),
        plan(OuterPlan::from(config)),
        parameters(ParameterLayout::gpt2(config.model)),
        fragments(parameters, plan.fragments, plan.h, plan.warmup),
        layout(fragments, wan::wire_codec(config), config.wan.ef_decay, static_cast<size_t>(config.wan.down_topk)),
        remote(config.units.count),
        window(remote, layout, [this] { return clock; }),
        links(config, config.units.count),
        core(config, plan, window, fragments, links, [this] { return clock; },
             [this](json e) { events.push_back(std::move(e)); }) {
    for (int u = 0; u < config.units.count; ++u) attach(u);
  }

  // A new process of unit u: a fresh, zeroed window (its first leader does the same).
  void attach(int u) {
    if (learners.size() <= static_cast<size_t>(u)) {
      learners.resize(u + 1);
      memory.resize(u + 1);
    }
    learners[u].reset();
    memory[u] = std::make_unique<test::LocalExposed>(layout.bytes());
    remote.attach(u, memory[u].get());
    learners[u] = std::make_unique<protocol::LearnerWindow>(*memory[u], layout);
    learners[u]->set_control(protocol::kState, protocol::kRunning);
  }
  protocol::LearnerWindow& unit(int u) { return *learners[u]; }

  // One poll of the syncer's run loop, in its order.
  void tick() {
    core.poll();
    core.watch_liveness();
    core.observe_step_times();
    core.serve_rejoins();
    core.collect();
    core.merge_ready();
    core.deliver_pending();
  }
  // Unit u publishes fragment p: values `value`, counters (c_steps, c_tok), base version.
  void publish(int u, int p, float value, int64_t c_steps, int64_t c_tok, int64_t base = 0) {
    ASSERT_TRUE(unit(u).outbox_free(p)) << "unit " << u << " fragment " << p;
    const std::vector<float> theta(layout.numel(p), value);
    unit(u).publish(p, theta, {c_steps, c_tok, c_steps, base});
  }
  // Unit u takes the merged Θ_p waiting in its inbox, as a leader does before it trains on from
  // it: a snapshot may name as its base only a version the unit was sent.
  void take(int u, int p) {
    std::vector<float> got(layout.numel(p));
    ASSERT_TRUE(unit(u).take_inbox(p, got)) << "unit " << u << " fragment " << p;
  }
  // Unit u alone moves Θ_p `rounds` times from version 0 (values 1, 2, …), taking each merge.
  void merge_alone(int u, int p, int rounds) {
    for (int k = 0; k < rounds; ++k) {
      publish(u, p, 1.0f + k, 4, 400, k);
      tick();
      take(u, p);
    }
  }
  void beat(int u) { unit(u).set_control(protocol::kHeartbeat, unit(u).control(protocol::kHeartbeat) + 1); }
  void step_time(int u, double seconds) {
    unit(u).set_control(protocol::kStepTimeNs, static_cast<int64_t>(seconds * 1e9));
  }
  std::vector<json> named(const std::string& name) const {
    std::vector<json> out;
    for (const auto& e : events)
      if (e["event"] == name) out.push_back(e);
    return out;
  }
  std::vector<json> merges(int p) const {
    std::vector<json> out;
    for (const auto& e : named("merge"))
      if (e["fragment"] == p) out.push_back(e);
    return out;
  }
};

TEST(SyncerCore, MergesOnceTheQuorumOfKUnitsHasReported) {
  Harness h(small_config(Mode::decoupled, 3, 2));
  h.publish(0, 0, 1.0f, 4, 400);
  h.tick();
  EXPECT_TRUE(h.merges(0).empty()) << "one snapshot of a quorum of two was merged";
  EXPECT_TRUE(h.unit(0).outbox_free(0)) << "the snapshot read is acknowledged";
  h.publish(1, 0, 3.0f, 4, 400);
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 1u);
  const json m = h.merges(0)[0];
  EXPECT_EQ(m["units"], json({0, 1}));
  EXPECT_EQ(m["version"], 1);
  // Both reporters are owed the merge and get it; unit 2 sent nothing and gets nothing.
  EXPECT_EQ(h.unit(0).inbox_version(0), 1);
  EXPECT_EQ(h.unit(1).inbox_version(0), 1);
  EXPECT_EQ(h.unit(2).inbox_version(0), 0);
  EXPECT_EQ(h.core.versions(), (std::vector<int64_t>{1, 0}));
}

TEST(SyncerCore, TokenWeightsAreCTokSquaredOverCSteps) {
  Harness h(small_config(Mode::decoupled, 2, 2));
  h.publish(0, 1, 1.0f, 4, 400);
  h.publish(1, 1, 1.0f, 8, 400);  // as many tokens in twice the steps: half the weight
  h.tick();
  ASSERT_EQ(h.merges(1).size(), 1u);
  const json w = h.merges(1)[0]["weights"];
  EXPECT_DOUBLE_EQ(w[0].get<double>(), token_weight(400, 4));
  EXPECT_DOUBLE_EQ(w[1].get<double>(), token_weight(400, 8));
  EXPECT_DOUBLE_EQ(w[0].get<double>(), 2 * w[1].get<double>());
}

TEST(SyncerCore, GraceWindowWaitsForAStragglerAndMergesWithoutItWhenItCloses) {
  Config c = small_config(Mode::decoupled, 3, 2);
  c.outer.overlap = 2;  // τ = 2 steps of slack for the grace window
  c.syncer.grace_gamma = 1.0;
  c.syncer.grace_cap_steps = 10;
  Harness h(c);
  for (int u = 0; u < 3; ++u) h.step_time(u, 1.0);  // g = γ·(τ·1 s − quorum − merge) = 2 s
  h.tick();
  h.publish(0, 0, 1.0f, 4, 400);
  h.publish(1, 0, 1.0f, 4, 400);
  h.tick();
  EXPECT_TRUE(h.merges(0).empty()) << "merged at the quorum with a grace window open";
  EXPECT_NEAR(h.core.grace().seconds(), 2.0, 1e-9);
  h.clock = 1.0;
  h.tick();
  EXPECT_TRUE(h.merges(0).empty());
  h.publish(2, 0, 1.0f, 4, 400);  // the straggler, within the window: merged at once
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 1u);
  EXPECT_EQ(h.merges(0)[0]["units"], json({0, 1, 2}));
  EXPECT_DOUBLE_EQ(h.merges(0)[0]["grace_wait_s"].get<double>(), 1.0);

  // The next round: the straggler does not come; the window closes and the quorum merges.
  h.clock = 2.0;
  h.publish(0, 0, 1.0f, 4, 400, 1);
  h.publish(1, 0, 1.0f, 4, 400, 1);
  h.tick();
  const double window = h.core.grace().seconds();
  ASSERT_GT(window, 0.5);
  h.clock = 2.0 + window - 0.01;
  h.tick();
  EXPECT_EQ(h.merges(0).size(), 1u) << "merged before the grace window closed";
  h.clock = 2.0 + window + 0.01;
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 2u);
  EXPECT_EQ(h.merges(0)[1]["units"], json({0, 1}));
  EXPECT_NEAR(h.merges(0)[1]["grace_wait_s"].get<double>(), window + 0.01, 1e-9);
}

TEST(SyncerCore, AWarmUpMergeIsAPlainAverageAtTheQuorumWithoutAGraceWindow) {
  // The grace test's settings (a 2 s window) with a warm-up of 10 steps and Nesterov 0.7 / 0.9.
  Config c = small_config(Mode::decoupled, 3, 2);
  c.outer.overlap = 2;
  c.outer.lr = 0.7;
  c.outer.momentum = 0.9;
  c.outer.merge = "mean";
  c.outer.share_steps = false;
  c.outer.warmup_steps = 10;
  c.syncer.grace_gamma = 1.0;
  c.syncer.grace_cap_steps = 10;
  Harness h(c);
  for (int u = 0; u < 3; ++u) h.step_time(u, 1.0);
  h.tick();
  // Snapshots of step 4, in the warm-up: the units wait for this merge, so it is made at the
  // quorum, and it is the plain mean of 1 and 3 (Θ₀ = 0 would go to 2·0.7·1.9 = 2.66 by Nesterov).
  h.publish(0, 0, 1.0f, 4, 400);
  h.publish(1, 0, 3.0f, 4, 400);
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 1u) << "a warm-up merge waited for a grace window";
  EXPECT_EQ(h.merges(0)[0]["warm"], true);
  EXPECT_DOUBLE_EQ(h.merges(0)[0]["grace_wait_s"].get<double>(), 0.0);
  std::vector<float> theta(h.layout.numel(0));
  ASSERT_TRUE(h.unit(0).take_inbox(0, theta));
  for (float x : theta) EXPECT_FLOAT_EQ(x, 2.0f);
  // After the warm-up (step 12) the grace window is open again.
  h.publish(0, 0, 2.0f, 12, 1200, 1);
  h.publish(1, 0, 2.0f, 12, 1200, 1);
  h.tick();
  EXPECT_EQ(h.merges(0).size(), 1u) << "merged at the quorum with a grace window open";
  h.clock = 2.5;  // past the 2 s window
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 2u);
  EXPECT_EQ(h.merges(0)[1]["warm"], false);
  EXPECT_DOUBLE_EQ(h.merges(0)[1]["grace_wait_s"].get<double>(), 2.5);
}

TEST(SyncerCore, AWarmUpRoundShortOfItsQuorumMergesAfterAHeartbeatTimeout) {
  // K = 2 of 3, P = 2, warm-up of 10 steps, heartbeat timeout 5 s: units 0 and 1 merge
  // fragment 0; unit 2's snapshot of the same step comes later and waits for a snapshot of
  // the next step to merge with. (With P = 3, K = 3 of 4, units each left out of a different
  // fragment's merge would wait for one another for good.) Everyone beats, as units waiting
  // for a merge do: after a heartbeat timeout with nobody else, unit 2's snapshot is merged alone.
  Config c = small_config(Mode::decoupled, 3, 2);
  c.outer.warmup_steps = 10;
  Harness h(c);
  for (int u = 0; u < 3; ++u) h.step_time(u, 1.0);
  auto tick_at = [&](double t) {
    h.clock = t;
    for (int u = 0; u < 3; ++u) h.beat(u);
    h.tick();
  };
  tick_at(0);
  h.publish(0, 0, 1.0f, 4, 400);
  h.publish(1, 0, 3.0f, 4, 400);
  tick_at(0);
  ASSERT_EQ(h.merges(0).size(), 1u);
  h.publish(2, 0, 5.0f, 4, 400);
  for (double t = 0; t < 5; t += 1) tick_at(t);
  tick_at(4.9);
  EXPECT_EQ(h.merges(0).size(), 1u) << "merged before a heartbeat timeout";
  tick_at(5.1);
  ASSERT_EQ(h.merges(0).size(), 2u) << "a warm-up round short of its quorum waited for good";
  EXPECT_EQ(h.merges(0)[1]["units"], json({2}));
  EXPECT_EQ(h.merges(0)[1]["staleness"], json({1}));
  EXPECT_EQ(h.unit(2).inbox_version(0), 2);
  // After the warm-up a round short of its quorum waits, however long.
  std::vector<float> theta(h.layout.numel(0));
  ASSERT_TRUE(h.unit(2).take_inbox(0, theta));
  h.publish(2, 0, 1.0f, 12, 1200, 2);
  for (double t = 6; t < 20; t += 1) tick_at(t);
  EXPECT_EQ(h.merges(0).size(), 2u);
  EXPECT_TRUE(h.named("unit_silent").empty()) << "a unit went silent: the test proves nothing";
}

TEST(SyncerCore, ADeliveryWaitsUntilTheUnitTookThePreviousOne) {
  Harness h(small_config(Mode::decoupled, 1, 1));
  h.publish(0, 0, 1.0f, 4, 400);
  h.tick();
  ASSERT_EQ(h.unit(0).inbox_version(0), 1);
  // A second snapshot merges into version 2, but the unit has not taken version 1: the inbox
  // is not overwritten under it.
  h.publish(0, 0, 2.0f, 4, 400);
  h.tick();
  EXPECT_EQ(h.core.versions()[0], 2);
  EXPECT_EQ(h.unit(0).inbox_version(0), 1);
  std::vector<float> got(h.layout.numel(0));
  ASSERT_TRUE(h.unit(0).take_inbox(0, got));
  h.tick();
  EXPECT_EQ(h.unit(0).inbox_version(0), 2) << "taken: the owed merge is delivered";
  ASSERT_TRUE(h.unit(0).take_inbox(0, got));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], h.core.theta(0)[i]);
  // The outbox side: a snapshot is acknowledged once read, never before.
  h.publish(0, 1, 1.0f, 4, 400);
  EXPECT_FALSE(h.unit(0).outbox_free(1));
  h.tick();
  EXPECT_TRUE(h.unit(0).outbox_free(1));
}

// Two units each one step of +1 from the Θ they hold; unit 1 never takes merge 1, so its next
// snapshot is still measured against version 0. Returns Θ_0 after merge 2, less Θ₀ (int8:
// constant differences cross exactly).
double progress_after_a_lagging_unit(const std::string& anchor) {
  Config c = small_config(Mode::decoupled, 2, 2);
  c.wan.format = "int8";
  c.outer.anchor = anchor;
  c.outer.lr = 1.0;
  c.outer.momentum = 0.0;
  c.outer.merge = "mean";
  Harness h(c);
  const std::vector<float> theta0(h.core.theta(0).begin(), h.core.theta(0).end());
  for (int u = 0; u < 2; ++u) {
    h.unit(u).set_reference(0, 0, theta0);
    h.window.set_reference(u, 0, 0, theta0);
  }
  auto publish = [&](int u, std::span<const float> from, int64_t base) {
    std::vector<float> theta(from.begin(), from.end());
    for (float& x : theta) x += 1.0f;
    h.unit(u).publish(0, theta, {4, 400, 4, base});
  };
  publish(0, theta0, 0);
  publish(1, theta0, 0);
  h.tick();
  EXPECT_EQ(h.core.versions()[0], 1);
  std::vector<float> r1(theta0.size());
  EXPECT_TRUE(h.unit(0).take_inbox(0, r1));  // unit 0 moves on from Θ version 1; unit 1 does not
  publish(0, r1, 1);
  publish(1, theta0, 0);
  h.tick();
  EXPECT_EQ(h.core.versions()[0], 2);
  double sum = 0;
  for (size_t i = 0; i < theta0.size(); ++i) sum += h.core.theta(0)[i] - theta0[i];
  return sum / static_cast<double>(theta0.size());
}

TEST(SyncerCore, AnchorReferenceMeasuresEachUnitFromTheThetaItHolds) {
  // Each merge averages two steps of +1: Θ moves by 1 per merge when each unit's progress is
  // measured from the Θ it trained from (its reference), 2 in all.
  EXPECT_NEAR(progress_after_a_lagging_unit("reference"), 2.0, 1e-5);
  EXPECT_NEAR(progress_after_a_lagging_unit("base"), 2.0, 1e-5);
  // Measured from Θ now, unit 1's second snapshot (Θ₀ + 1 = Θ version 1) looks like no
  // progress, and the lag it has not received pulls Θ back: half a step is lost.
  EXPECT_NEAR(progress_after_a_lagging_unit("current"), 1.5, 1e-5);
}

TEST(SyncerCore, ASilentUnitLeavesTheQuorumAndComesBackWhenItBeats) {
  Harness h(small_config(Mode::decoupled, 2, 2));
  h.beat(0);
  h.beat(1);
  h.tick();
  h.clock = 6.0;  // past heartbeat_timeout_s = 5 for unit 1
  h.beat(0);
  h.tick();
  ASSERT_EQ(h.named("unit_silent").size(), 1u);
  EXPECT_EQ(h.named("unit_silent")[0]["unit"], 1);
  EXPECT_FALSE(h.core.unit_live(1));
  // Its snapshot waits; the quorum is what is alive.
  h.publish(1, 0, 5.0f, 4, 400);
  h.publish(0, 0, 1.0f, 4, 400);
  h.beat(0);
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 1u);
  EXPECT_EQ(h.merges(0)[0]["units"], json({0}));
  h.clock = 7.0;
  h.beat(0);
  h.beat(1);
  h.tick();
  ASSERT_EQ(h.named("unit_back").size(), 1u);
  EXPECT_TRUE(h.core.unit_live(1));
  // Back: its waiting snapshot joins the next merge.
  h.publish(0, 0, 1.0f, 4, 400, 1);
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 2u);
  EXPECT_EQ(h.merges(0)[1]["units"], json({0, 1}));
  EXPECT_EQ(h.merges(0)[1]["staleness"], json({0, 1})) << "unit 1's snapshot was against version 0";
}

TEST(SyncerCore, ASlowStepIsNotSilence) {
  Harness h(small_config(Mode::decoupled, 1, 1));
  h.step_time(0, 4.0);  // three steps of 4 s: silent only after 12 s
  h.beat(0);
  h.tick();
  h.clock = 11.0;
  h.tick();
  EXPECT_TRUE(h.named("unit_silent").empty());
  h.clock = 12.5;
  h.tick();
  EXPECT_EQ(h.named("unit_silent").size(), 1u);
}

TEST(SyncerCore, IsolatedASilentUnitIsLostForTheHeartbeat) {
  Harness h(small_config(Mode::decoupled, 2, 1));
  h.core.set_isolated(true);
  h.beat(0);
  h.beat(1);
  h.tick();
  h.clock = 6.0;
  h.beat(0);
  h.tick();
  ASSERT_EQ(h.named("unit_lost").size(), 1u);
  EXPECT_EQ(h.named("unit_lost")[0]["unit"], 1);
  EXPECT_EQ(h.named("unit_lost")[0]["reason"].get<std::string>().rfind("heartbeat", 0), 0u);
}

TEST(SyncerCore, SynchronousRejoinCompletesThePendingRoundBeforeServingTheta) {
  Config c = small_config(Mode::diloco, 2, 2);
  c.outer.overlap = 0;
  Harness h(c);
  // Unit 1 sent its round-1 snapshot, then crashed and asks for Θ.
  h.publish(1, 0, 3.0f, 4, 400);
  h.tick();
  h.unit(1).lose_outboxes();
  h.unit(1).set_control(protocol::kRejoinRequest, 1);
  h.tick();
  EXPECT_EQ(h.unit(1).control(protocol::kRejoinServed), 0) << "served before its pending round merged";
  // Unit 0's snapshot completes the round; the rejoin is then served that round's Θ.
  h.publish(0, 0, 1.0f, 4, 400);
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 1u);
  EXPECT_EQ(h.merges(0)[0]["units"], json({0, 1}));
  h.tick();
  EXPECT_EQ(h.unit(1).control(protocol::kRejoinServed), 1);
  ASSERT_EQ(h.named("rejoin").size(), 1u);
  EXPECT_EQ(h.named("rejoin")[0]["versions"], json({1}));
  EXPECT_EQ(h.unit(1).inbox_version(0), 1);
}

TEST(SyncerCore, DecoupledRejoinIsServedAtOnce) {
  Harness h(small_config(Mode::decoupled, 2, 2));
  h.publish(1, 0, 3.0f, 4, 400);
  h.tick();
  h.unit(1).lose_outboxes();
  h.unit(1).set_control(protocol::kRejoinRequest, 1);
  h.tick();
  EXPECT_EQ(h.unit(1).control(protocol::kRejoinServed), 1);
  EXPECT_EQ(h.named("rejoin")[0]["versions"], json({0, 0}));
  // Θ raw in every inbox: the unit takes it whatever it held.
  std::vector<float> got(h.layout.numel(1));
  ASSERT_TRUE(h.unit(1).take_inbox(1, got));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], h.core.theta(1)[i]);
}

TEST(SyncerCore, ALostUnitWeighsNothingAndItsNewProcessIsServedThetaAndMergedAgain) {
  Harness h(small_config(Mode::decoupled, 2, 2));
  h.core.set_isolated(true);
  h.unit(0).set_control(protocol::kTokensDone, 1000);
  h.publish(0, 0, 9.0f, 4, 400);  // read, then the unit dies: dropped with it
  h.tick();
  h.remote.detach(0);
  h.core.unit_lost(0);
  EXPECT_FALSE(h.core.unit_live(0));
  EXPECT_EQ(h.core.tokens_total(), 1000) << "a lost unit's tokens stay counted";
  h.publish(1, 0, 1.0f, 4, 400);
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 1u);
  EXPECT_EQ(h.merges(0)[0]["units"], json({1})) << "the quorum is what is alive";

  h.attach(0);  // a new process: zeroed window, restart 1
  h.core.unit_connected(0);
  EXPECT_TRUE(h.core.unit_live(0));
  h.unit(0).set_control(protocol::kRejoinRequest, 1);
  h.tick();
  EXPECT_EQ(h.unit(0).control(protocol::kRejoinServed), 1);
  EXPECT_EQ(h.unit(0).inbox_version(0), 1);
  std::vector<float> got(h.layout.numel(0));
  ASSERT_TRUE(h.unit(0).take_inbox(0, got));
  EXPECT_EQ(got[0], h.core.theta(0)[0]);
  // Its first snapshot, against the version served, merges with unit 1's.
  h.publish(0, 0, 2.0f, 4, 400, 1);
  h.publish(1, 0, 2.0f, 4, 400, 1);
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 2u);
  EXPECT_EQ(h.merges(0)[1]["units"], json({0, 1}));
  EXPECT_EQ(h.core.tokens_total(), 1000);
}

TEST(SyncerCore, AStaleSnapshotIsMergedWithItsStalenessAndBaseVersion) {
  Harness h(small_config(Mode::decoupled, 2, 1));
  // Unit 1 is slow: it reports once, against version 0, after unit 0 moved Θ_0 three times.
  h.merge_alone(0, 0, 3);
  ASSERT_EQ(h.core.versions()[0], 3);
  h.publish(1, 0, 5.0f, 12, 1200, 0);
  h.tick();
  const json m = h.merges(0).back();
  EXPECT_EQ(m["units"], json({1}));
  EXPECT_EQ(m["staleness"], json({3}));
  EXPECT_EQ(m["base_versions"], json({0}));
}

// Found by tests/e2e/lying_unit.sh run longer: a base version "from the future" was refused only
// while Θ_p had not reached it; afterwards the liar's stale values, measured from a version it
// never held, pulled Θ back (+1.3 nats). A base must be a version the unit was sent.
TEST(SyncerCore, ABaseVersionTheUnitWasNeverSentIsRefusedEvenOnceThetaHasIt) {
  Harness h(small_config(Mode::decoupled, 2, 1));
  h.merge_alone(0, 0, 3);
  ASSERT_EQ(h.core.versions()[0], 3);
  const std::vector<float> before(h.core.theta(0).begin(), h.core.theta(0).end());
  h.publish(1, 0, 9.0f, 4, 400, 2);  // unit 1 was sent nothing: it holds version 0
  h.tick();
  ASSERT_EQ(h.named("snapshot_rejected").size(), 1u);
  EXPECT_EQ(h.named("snapshot_rejected")[0]["reason"],
            "base version 2 outside 0..0 (the newest version of fragment 0 unit 1 may hold)");
  EXPECT_EQ(h.merges(0).size(), 3u);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), h.core.theta(0).begin())) << "Θ_0 moved";
  // Sent the current fragment, it may name that version.
  ASSERT_EQ(h.unit(1).inbox_version(0), 3);
  h.take(1, 0);
  h.publish(1, 0, 4.0f, 4, 400, 3);
  h.tick();
  EXPECT_EQ(h.merges(0).back()["units"], json({1}));
  EXPECT_EQ(h.merges(0).back()["base_versions"], json({3}));
}

// Review of the rule above: a live unit whose link broke trains on, and publishes against what
// it took before; when it is admitted again, that snapshot may be read before anything is sent
// to it anew. What it was sent is not forgotten with the connection.
TEST(SyncerCore, AUnitThatReconnectsMayNameWhatItWasSentBefore) {
  Harness h(small_config(Mode::decoupled, 2, 1));
  h.publish(1, 0, 2.0f, 4, 400, 0);
  h.tick();
  h.take(1, 0);
  ASSERT_EQ(h.core.versions()[0], 1);
  for (int k = 1; k < 3; ++k) {
    h.publish(0, 0, 1.0f, 4, 400, h.unit(0).inbox_version(0));
    h.tick();
    h.take(0, 0);
  }
  ASSERT_EQ(h.core.versions()[0], 3);
  h.publish(1, 0, 3.0f, 4, 400, 1);  // written while its link was down
  h.core.unit_connected(1);
  h.tick();
  EXPECT_TRUE(h.named("snapshot_rejected").empty()) << h.named("snapshot_rejected")[0];
  EXPECT_EQ(h.merges(0).back()["units"], json({1}));
  EXPECT_EQ(h.merges(0).back()["base_versions"], json({1}));
}

TEST(SyncerCore, MaxStalenessRefusesASnapshotTooFarBehindOnArrivalOrAfterWaiting) {
  Config c = small_config(Mode::decoupled, 2, 1);
  c.syncer.max_staleness = 2;
  Harness h(c);
  // On arrival: unit 1 reports against version 0 after unit 0 moved Θ_0 three times.
  h.merge_alone(0, 0, 3);
  ASSERT_EQ(h.core.versions()[0], 3);
  h.publish(1, 0, 5.0f, 12, 1200, 0);
  h.tick();
  ASSERT_EQ(h.named("snapshot_rejected").size(), 1u);
  EXPECT_EQ(h.named("snapshot_rejected")[0]["reason"], "staleness 3 exceeds syncer.max_staleness = 2");
  EXPECT_EQ(h.merges(0).size(), 3u) << "the refused snapshot was merged";
  EXPECT_EQ(h.unit(1).inbox_version(0), 3) << "the refused unit gets the current fragment";
  EXPECT_TRUE(h.unit(1).outbox_free(0)) << "the refused snapshot was not consumed";
  // Within the bound: merged with its staleness.
  std::vector<float> got(h.layout.numel(0));
  ASSERT_TRUE(h.unit(1).take_inbox(0, got));
  h.publish(0, 0, 1.0f, 4, 400, 3);
  h.tick();
  h.publish(1, 0, 1.0f, 4, 400, 3);
  h.tick();
  EXPECT_EQ(h.merges(0).back()["units"], json({1}));
  EXPECT_EQ(h.merges(0).back()["staleness"], json({1}));
}

TEST(SyncerCore, MaxStalenessDropsASilentUnitsWaitingSnapshotThatAgedPastIt) {
  Config c = small_config(Mode::decoupled, 2, 1);
  c.syncer.max_staleness = 2;
  Harness h(c);
  h.beat(0);
  h.beat(1);
  h.tick();
  h.clock = 6.0;  // unit 1 goes silent (a partition) with a snapshot waiting
  h.publish(1, 0, 5.0f, 4, 400, 0);
  h.beat(0);
  h.tick();
  ASSERT_EQ(h.named("unit_silent").size(), 1u);
  for (int k = 0; k < 3; ++k) {
    h.publish(0, 0, 1.0f, 4, 400, k);
    h.beat(0);
    h.tick();
    h.take(0, 0);
  }
  EXPECT_EQ(h.core.versions()[0], 3);
  // Back: the waiting snapshot is now 3 behind, and is dropped instead of merged.
  h.clock = 7.0;
  h.beat(0);
  h.beat(1);
  h.tick();
  ASSERT_EQ(h.named("unit_back").size(), 1u);
  ASSERT_EQ(h.named("snapshot_rejected").size(), 1u);
  EXPECT_EQ(h.named("snapshot_rejected")[0]["unit"], 1);
  for (const json& m : h.merges(0)) EXPECT_EQ(m["units"], json({0})) << m;
  EXPECT_EQ(h.unit(1).inbox_version(0), 3);
}

TEST(SyncerCore, AStalledLinkLosesNoDeliveryAndLogsNoTornReads) {
  // Unit 1's link stalls (a partition shorter than the link timeout) after the syncer saw its
  // new snapshot: the failed read is no rejection, the merged fragment it is owed meanwhile is
  // not counted as delivered, and both go through once the link is back.
  Harness h(small_config(Mode::decoupled, 2, 1));
  h.publish(0, 0, 1.0f, 4, 400, 0);
  h.publish(1, 0, 2.0f, 4, 400, 0);
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 1u);
  std::vector<float> got(h.layout.numel(0));
  ASSERT_TRUE(h.unit(0).take_inbox(0, got));
  ASSERT_TRUE(h.unit(1).take_inbox(0, got));
  h.tick();  // the syncer sees both took version 1
  h.publish(1, 0, 2.5f, 4, 400, 1);
  h.core.poll();  // ... and unit 1's new snapshot, just before its link stalls
  h.remote.stall(1, true);
  h.core.collect();
  EXPECT_TRUE(h.named("snapshot_rejected").empty()) << "a failed read was logged as a rejection";
  h.publish(0, 0, 1.5f, 4, 400, 1);
  for (int i = 0; i < 3; ++i) h.tick();  // unit 0's snapshot merges; unit 1 is owed it
  ASSERT_EQ(h.merges(0).size(), 2u);
  EXPECT_EQ(h.unit(1).inbox_version(0), 1) << "delivered over a stalled link";
  EXPECT_TRUE(h.named("snapshot_rejected").empty());
  h.remote.stall(1, false);
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 3u);
  EXPECT_EQ(h.merges(0)[2]["units"], json({1})) << "its snapshot from before the stall is merged";
  EXPECT_EQ(h.unit(1).inbox_version(0), 3) << "the deliveries owed since the stall were lost";
}

TEST(SyncerCore, ATransferOnItsWayHoldsNobodyUp) {
  // Unit 2's link is slow: the read of its snapshot is still on its way while units 0 and 1
  // merge and receive Θ; its delivery then takes as long while the others go on. Nothing is
  // read twice or lost, and a unit with a transfer on its way is not silent.
  Harness h(small_config(Mode::decoupled, 3, 2));
  h.remote.hold(2, true);
  h.publish(2, 0, 3.0f, 4, 400);
  h.tick();
  EXPECT_EQ(h.core.snapshots_unmerged(), 0) << "read before its bytes arrived";
  EXPECT_TRUE(h.core.transfers_in_flight());
  h.publish(0, 0, 1.0f, 4, 400);
  h.publish(1, 0, 2.0f, 4, 400);
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 1u) << "units 0 and 1 waited for unit 2's read";
  EXPECT_EQ(h.merges(0)[0]["units"], json({0, 1}));
  EXPECT_EQ(h.unit(0).inbox_version(0), 1);
  EXPECT_EQ(h.unit(1).inbox_version(0), 1);
  EXPECT_TRUE(h.named("unit_silent").empty());
  std::vector<float> got(h.layout.numel(0));
  ASSERT_TRUE(h.unit(0).take_inbox(0, got));
  h.remote.hold(2, false);
  h.tick();
  EXPECT_FALSE(h.core.transfers_in_flight());
  EXPECT_EQ(h.core.snapshots_unmerged(), 1) << "unit 2's snapshot, once arrived, waits for a quorum";
  EXPECT_TRUE(h.unit(2).outbox_free(0)) << "acknowledged once read";
  // Unit 2's merge goes down its slow link while unit 0 is served at once.
  h.publish(0, 0, 1.5f, 4, 400, 1);
  h.remote.hold(2, true);
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 2u);
  EXPECT_EQ(h.merges(0)[1]["units"], json({0, 2}));
  EXPECT_EQ(h.unit(0).inbox_version(0), 2);
  EXPECT_EQ(h.unit(2).inbox_version(0), 0) << "announced before its bytes arrived";
  EXPECT_TRUE(h.core.transfers_in_flight());
  h.remote.hold(2, false);
  h.tick();
  EXPECT_EQ(h.unit(2).inbox_version(0), 2);
  EXPECT_FALSE(h.core.transfers_in_flight());
  ASSERT_TRUE(h.unit(2).take_inbox(0, got)) << "its bytes and checksum match";
  EXPECT_TRUE(h.named("snapshot_rejected").empty());
}

TEST(SyncerCore, ATransferPastItsPatienceIsLoggedOnceAsASlowLink) {
  // The lane's patience: 0.25 s + its bytes at the slowest rate allowed for (1e7 B/s here).
  Harness h(small_config(Mode::decoupled, 2, 1));
  h.remote.hold(1, true);
  h.publish(1, 0, 1.0f, 4, 400);
  h.tick();
  EXPECT_TRUE(h.named("link_slow").empty()) << "a transfer on time is no slow link";
  h.clock += 0.4;
  h.tick();
  h.tick();
  ASSERT_EQ(h.named("link_slow").size(), 1u) << "once per transfer";
  const json e = h.named("link_slow")[0];
  EXPECT_EQ(e["unit"], 1);
  EXPECT_EQ(e["transfer"], "read");
  EXPECT_EQ(e["bytes"], h.layout.numel(0) * sizeof(float));
  EXPECT_GE(e["after_s"].get<double>(), 0.25);
  EXPECT_NE(e["reason"].get<std::string>().find("syncer.link_min_mbit_s"), std::string::npos);
  h.remote.hold(1, false);
  h.tick();
  EXPECT_EQ(h.merges(0).size(), 1u) << "a slow transfer still ends";
}

TEST(SyncerCore, AUnitWithATransferOnTimeIsHeardAndSilentOncePastIt) {
  // Its headers are not polled while its read is on its way: within the read's patience
  // (0.25 s + its bytes at the slowest rate allowed for, here 10 s) it is not silent, though
  // it has not beaten for longer than heartbeat_timeout_s = 5.
  Harness h(small_config(Mode::decoupled, 2, 1));
  h.window.set_link_min_rate(static_cast<double>(h.layout.numel(0) * sizeof(float)) / 10);
  h.remote.hold(1, true);
  h.publish(1, 0, 1.0f, 4, 400);
  h.tick();
  h.clock = 6.0;  // past heartbeat_timeout_s = 5, unit 1 never beat
  h.beat(0);
  h.tick();
  EXPECT_TRUE(h.named("unit_silent").empty()) << "a unit with a transfer on time was declared silent";
  h.clock = 12.0;  // past its patience
  h.beat(0);
  h.tick();
  ASSERT_EQ(h.named("unit_silent").size(), 1u) << "a transfer past its patience still made the unit heard";
  EXPECT_EQ(h.named("unit_silent")[0]["unit"], 1);
  EXPECT_EQ(h.named("link_slow").size(), 1u);
}

TEST(SyncerCore, WordsForAUnitWithATransferOnItsWayWaitInOrderUntilWritten) {
  // Control words issued while unit 1's read is on its way wait (issued now they would queue
  // behind it); then they are written in the order issued, and kept while its link is stalled.
  Harness h(small_config(Mode::decoupled, 2, 1));
  h.remote.hold(1, true);
  h.publish(1, 0, 1.0f, 4, 400);
  h.tick();
  ASSERT_TRUE(h.core.transfers_in_flight());
  h.remote.words_written.clear();
  ASSERT_TRUE(h.window.set_control(1, protocol::kCheckpointWant, 7));
  h.core.set_stopping(true);  // kStop to every unit
  EXPECT_EQ(h.unit(1).control(protocol::kCheckpointWant), 0) << "written behind a transfer on its way";
  EXPECT_EQ(h.unit(1).control(protocol::kStop), 0);
  EXPECT_EQ(h.unit(0).control(protocol::kStop), 1) << "a unit with no transfer waits for nothing";
  h.remote.hold(1, false);
  h.remote.stall(1, true);  // the lane ends unreachable, the words cannot be written yet
  h.tick();
  EXPECT_EQ(h.unit(1).control(protocol::kStop), 0);
  h.remote.stall(1, false);
  h.tick();
  EXPECT_EQ(h.unit(1).control(protocol::kCheckpointWant), 7) << "a word that could not be written was dropped";
  EXPECT_EQ(h.unit(1).control(protocol::kStop), 1);
  std::vector<size_t> order;
  for (const auto& [u, offset] : h.remote.words_written)
    if (u == 1 && (offset == protocol::kCheckpointWant * 8u || offset == protocol::kStop * 8u)) order.push_back(offset);
  ASSERT_GE(order.size(), 2u);
  EXPECT_EQ(order[0], protocol::kCheckpointWant * 8u) << "written out of the order issued";
}

TEST(SyncerCore, ATornReadWaitsForAFreshPollBeforeReadingAgain) {
  // The unit's sequence number moved during the read (as if it published over it): refused as
  // torn once, then, after a poll has read its headers again, the newer snapshot is read.
  Harness h(small_config(Mode::decoupled, 1, 1));
  h.remote.hold(0, true);
  h.publish(0, 0, 1.0f, 4, 400);
  h.tick();
  auto& seq = *reinterpret_cast<int64_t*>(h.memory[0]->base() + h.layout.header_offset(0) + protocol::kOutSeq * 8);
  seq += 1;
  h.remote.hold(0, false);
  h.tick();
  ASSERT_EQ(h.named("snapshot_rejected").size(), 1u) << "the stale announcement was read again at once";
  EXPECT_NE(h.named("snapshot_rejected")[0]["reason"].get<std::string>().find("torn"), std::string::npos);
  h.tick();
  h.tick();
  EXPECT_EQ(h.named("snapshot_rejected").size(), 1u);
  EXPECT_EQ(h.merges(0).size(), 1u) << "the newer snapshot was not read after the fresh poll";
}

TEST(SyncerCore, ARejoinIsServedOverASlowLinkFragmentByFragment) {
  Harness h(small_config(Mode::decoupled, 2, 1));
  const int P = h.layout.fragments();
  ASSERT_GT(P, 1);
  h.remote.hold(1, true);
  h.unit(1).set_control(protocol::kRejoinRequest, 1);
  h.tick();
  EXPECT_EQ(h.unit(1).control(protocol::kRejoinServed), 0);
  EXPECT_TRUE(h.named("rejoin").empty());
  h.remote.hold(1, false);
  for (int i = 0; i < P + 1 && h.named("rejoin").empty(); ++i) h.tick();
  ASSERT_EQ(h.named("rejoin").size(), 1u);
  EXPECT_EQ(h.unit(1).control(protocol::kRejoinServed), 1);
  uint64_t raw_bytes = 0;
  for (int p = 0; p < P; ++p) raw_bytes += h.layout.numel(p) * sizeof(float);
  EXPECT_EQ(h.named("rejoin")[0]["bytes_out"], raw_bytes) << "every fragment served raw, once";
  for (int p = 0; p < P; ++p) {
    std::vector<float> got(h.layout.numel(p));
    ASSERT_TRUE(h.unit(1).take_inbox(p, got)) << "fragment " << p << " not served intact";
    EXPECT_EQ(got, std::vector<float>(h.core.theta(p).begin(), h.core.theta(p).end())) << "fragment " << p;
  }
}

TEST(SyncerCore, ARejoinOverAnEmulatedLinkIsServedOnceThetaLanded) {
  // The unit waits for Θ: over an emulated link of 1 s per Θ, it is told so 1 s later, as over
  // a real link of that rate (where the bytes themselves take that long).
  Config c = small_config(Mode::decoupled, 1, 1);
  Harness probe(c);
  double raw = 0;
  for (int p = 0; p < probe.layout.fragments(); ++p) raw += probe.layout.numel(p) * sizeof(float);
  c.wan.bandwidth_mbit_s = 8.0 * raw / 1e6;
  c.wan.burst_kb = 0.001;
  Harness h(c);
  h.unit(0).set_control(protocol::kRejoinRequest, 1);
  h.tick();
  EXPECT_EQ(h.unit(0).control(protocol::kRejoinServed), 0) << "served before Θ landed";
  h.clock = 0.9;
  h.tick();
  EXPECT_EQ(h.unit(0).control(protocol::kRejoinServed), 0);
  h.clock = 1.01;
  h.tick();
  EXPECT_EQ(h.unit(0).control(protocol::kRejoinServed), 1);
  ASSERT_EQ(h.named("rejoin").size(), 1u);
  EXPECT_NEAR(h.named("rejoin")[0]["serve_s"].get<double>(), 1.01, 1e-9);
}

TEST(SyncerCore, ANonFiniteSnapshotIsRefusedAndNeverMerged) {
  Harness h(small_config(Mode::decoupled, 1, 1));
  std::vector<float> bad(h.layout.numel(0), 1.0f);
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  h.unit(0).publish(0, bad, {4, 400, 4, 0});
  h.tick();
  ASSERT_EQ(h.named("snapshot_rejected").size(), 1u);
  EXPECT_EQ(h.named("snapshot_rejected")[0]["reason"], "non-finite values");
  EXPECT_TRUE(h.merges(0).empty());
  EXPECT_TRUE(h.unit(0).outbox_free(0)) << "a refused snapshot frees the outbox";
  for (float x : h.core.theta(0)) ASSERT_TRUE(std::isfinite(x));
}

// In the synchronous modes every merge waits for every unit, and each unit waits for the merge
// of its own snapshot: a refused snapshot left both waiting for good. It now stands in the
// round with weight 0, so the merge is made of the others and goes to every unit.
TEST(SyncerCore, ARefusedSnapshotInASynchronousRoundStandsInWithNoWeight) {
  Harness h(small_config(Mode::diloco, 2, 2));
  std::vector<float> bad(h.layout.numel(0), 1.0f);
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  h.publish(0, 0, 1.0f, 4, 400);
  h.unit(1).publish(0, bad, {4, 400, 4, 0});
  h.tick();
  ASSERT_EQ(h.named("snapshot_rejected").size(), 1u);
  ASSERT_EQ(h.merges(0).size(), 1u) << "the round went on without the refused snapshot";
  EXPECT_EQ(h.merges(0)[0]["units"], json({0, 1}));
  EXPECT_EQ(h.merges(0)[0]["weights"][1], 0.0);
  h.tick();
  EXPECT_EQ(h.unit(0).inbox_version(0), 1);
  EXPECT_EQ(h.unit(1).inbox_version(0), 1) << "the refused unit gets the round's merge too";
  // Every unit refused: the round still ends, as a new version of the same Θ.
  const std::vector<float> before(h.core.theta(0).begin(), h.core.theta(0).end());
  std::vector<float> got(h.layout.numel(0));
  for (int u = 0; u < 2; ++u) {
    ASSERT_TRUE(h.unit(u).take_inbox(0, got));
    h.unit(u).publish(0, bad, {4, 400, 4, 1});
  }
  h.tick();
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 2u);
  EXPECT_EQ(std::vector<float>(h.core.theta(0).begin(), h.core.theta(0).end()), before);
  EXPECT_EQ(h.unit(0).inbox_version(0), 2);
  EXPECT_EQ(h.unit(1).inbox_version(0), 2);
}

// Issue 34, a unit that lies about its counters: a snapshot claiming more tokens than its steps
// could make at its batch (here 100 tokens per step), negative counts, or 2^62 tokens against
// one step (a weight c_tok²/c_steps that would outweigh everyone) is refused with one line, and
// the honest unit's snapshots merge on with their own weight. (Claiming 2^62 steps as well is
// consistent at its batch: the weight cap below bounds that one.)
TEST(SyncerCore, ASnapshotWhoseTokenCountersLieIsRefusedAndTheOthersMergeOn) {
  Harness h(small_config(Mode::decoupled, 2, 1));
  const std::vector<std::pair<int64_t, int64_t>> lies = {
      {4, 401}, {-1, 0}, {4, -400}, {1, int64_t{1} << 62}};
  for (size_t i = 0; i < lies.size(); ++i) {
    const std::vector<float> theta(h.layout.numel(0), 100.0f);
    h.unit(1).publish(0, theta, {lies[i].first, lies[i].second, 4, 0});
    h.publish(0, 0, 1.0f, 4, 400, static_cast<int64_t>(i));
    h.tick();
    const auto refused = h.named("snapshot_rejected");
    ASSERT_EQ(refused.size(), i + 1) << "lie " << i;
    EXPECT_EQ(refused.back()["unit"], 1);
    EXPECT_NE(refused.back()["reason"].get<std::string>().find("token counters"), std::string::npos);
    ASSERT_EQ(h.merges(0).size(), i + 1);
    EXPECT_EQ(h.merges(0).back()["units"], json({0}));
    EXPECT_TRUE(h.unit(1).outbox_free(0)) << "the refused snapshot frees the liar's outbox";
    // Θ moved only toward the honest unit's 1.0 (the outer momentum may overshoot it a
    // little), never toward the liar's 100.
    for (float x : h.core.theta(0)) ASSERT_LE(std::abs(x), 10.0f);
    std::vector<float> got(h.layout.numel(0));
    ASSERT_TRUE(h.unit(0).take_inbox(0, got));
  }
}

// The bound on one unit's influence (merge.hpp, cap_weights): a unit claiming 2^40 steps at
// its batch (a weight 2^40 times an honest step's) weighs as if it had made κ = 4 times the
// others' lower median of steps; an honest straggler with twice the steps is not capped.
TEST(SyncerCore, AUnitsClaimedStepsAreCappedAtKappaTimesTheOthersMedian) {
  Harness h(small_config(Mode::decoupled, 3, 3));
  h.publish(0, 0, 1.0f, 4, 400);
  h.publish(1, 0, 1.0f, 8, 800);  // an honest straggler: twice the steps, twice the weight
  const int64_t huge = int64_t{1} << 40;
  h.unit(2).publish(0, std::vector<float>(h.layout.numel(0), 100.0f), {huge, huge * 100, 4, 0});
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 1u);
  const json m = h.merges(0)[0];
  EXPECT_EQ(m["weights_capped"], json({2}));
  const double w0 = token_weight(400, 4), w1 = token_weight(800, 8);
  EXPECT_DOUBLE_EQ(m["weights"][0].get<double>(), w0);
  EXPECT_DOUBLE_EQ(m["weights"][1].get<double>(), w1);
  EXPECT_DOUBLE_EQ(m["weights"][2].get<double>(), 4 * w0) << "4 × 4 steps at 100 tokens each";
}

// Units of three times the ranks weigh nine times as much per step (c_steps·tps²): honest, and
// never capped.
TEST(SyncerCore, AUnitOfMoreRanksIsNotCappedForItsLargerBatch) {
  Config c = small_config(Mode::decoupled, 2, 2);
  c.units.ranks = {1, 3};
  Harness h(c);
  h.publish(0, 0, 1.0f, 4, 400);
  h.publish(1, 0, 1.0f, 4, 1200);
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 1u);
  EXPECT_EQ(h.merges(0)[0]["weights_capped"], json::array());
  EXPECT_DOUBLE_EQ(h.merges(0)[0]["weights"][1].get<double>(), 9 * token_weight(400, 4));
}

// Issue 34: finite values far outside any step (3e38, below float's 3.4e38) pass the finite
// check, and the merge's outer step then overflowed Θ. A merge whose Θ would not be finite is
// undone (Θ and the outer momentum as they were), logged once, and the next merges go on.
TEST(SyncerCore, AMergeThatWouldOverflowThetaIsUndoneAndTheNextGoesOn) {
  Harness h(small_config(Mode::decoupled, 2, 2));
  const std::vector<float> before(h.core.theta(0).begin(), h.core.theta(0).end());
  const std::vector<float> huge(h.layout.numel(0), 3e38f);
  h.unit(0).publish(0, huge, {4, 400, 4, 0});
  h.unit(1).publish(0, huge, {4, 400, 4, 0});
  h.tick();
  ASSERT_EQ(h.named("merge_undone").size(), 1u);
  EXPECT_EQ(h.named("merge_undone")[0]["units"], json({0, 1}));
  // It still goes out, as a new version of the same Θ: units that wait for a merge go on.
  ASSERT_EQ(h.merges(0).size(), 1u);
  EXPECT_EQ(h.merges(0)[0]["undone"], true);
  EXPECT_EQ(std::vector<float>(h.core.theta(0).begin(), h.core.theta(0).end()), before);
  EXPECT_EQ(h.core.versions()[0], 1);
  EXPECT_EQ(h.unit(0).inbox_version(0), 1);
  h.publish(0, 0, 1.0f, 4, 400, 1);
  h.publish(1, 0, 1.0f, 4, 400, 1);
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 2u);
  EXPECT_EQ(h.merges(0)[1]["undone"], false);
  for (float x : h.core.theta(0)) ASSERT_TRUE(std::isfinite(x));
}

// Issue 34: finite values far outside any step (1e30) passed every check and pulled Θ as far as
// the liar's weight allowed. Its outer gradient is scaled to κ = 8 times the honest units' per
// step (merge.hpp, OuterGradientBound), in a merge with them and, from the record, alone.
TEST(SyncerCore, AnOuterGradientFarOutsideAnyStepIsScaledDownWithTheOthersAndAlone) {
  Harness h(small_config(Mode::decoupled, 3, 1));
  const std::vector<float> huge(h.layout.numel(0), 1e30f);
  h.publish(0, 0, 1.0f, 4, 400);
  h.publish(1, 0, 1.0f, 4, 400);
  h.unit(2).publish(0, huge, {4, 400, 4, 0});
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 1u);
  EXPECT_EQ(h.merges(0)[0]["units"], json({0, 1, 2}));
  EXPECT_EQ(h.merges(0)[0]["outer_grads_clipped"], json({2}));
  EXPECT_EQ(h.merges(0)[0]["undone"], false);
  // Honest Δ ≈ 1 per element; the liar's is cut to ≤ 8 × theirs: Θ moves by a few units, not 1e30.
  for (float x : h.core.theta(0)) ASSERT_LE(std::abs(x), 20.0f);
  for (int round = 1; round <= 5; ++round) {  // alone: bounded by the record of the honest units
    std::vector<float> got(h.layout.numel(0));
    if (h.unit(2).inbox_version(0) > 0) {
      ASSERT_TRUE(h.unit(2).take_inbox(0, got));
    }
    h.unit(2).publish(0, huge, {int64_t{1} << 40, 400, 4, h.core.versions()[0]});
    h.tick();
    ASSERT_EQ(h.merges(0).size(), 1u + round);
    EXPECT_EQ(h.merges(0).back()["outer_grads_clipped"], json({2})) << "round " << round;
  }
  for (float x : h.core.theta(0)) ASSERT_LE(std::abs(x), 200.0f);
}

// Issue 34: a sequence number below the last consumed (or billions past it) is refused unread,
// with one line however often the syncer polls it, and the honest unit merges on.
TEST(SyncerCore, ASequenceNumberThatGoesBackOrJumpsIsRefusedUnreadWithOneLine) {
  Harness h(small_config(Mode::decoupled, 2, 1));
  auto seq_word = [&](int u, int p) -> int64_t& {
    return reinterpret_cast<int64_t*>(h.memory[u]->base() + h.layout.header_offset(p))[protocol::kOutSeq];
  };
  h.publish(1, 0, 1.0f, 4, 400);
  h.tick();
  h.publish(1, 0, 1.0f, 4, 400, 1);
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 2u);
  ASSERT_EQ(seq_word(1, 0), 2);
  seq_word(1, 0) = 1;  // backwards
  for (int i = 0; i < 5; ++i) {
    h.publish(0, 0, 1.0f, 4, 400, h.unit(0).inbox_version(0));
    h.tick();
    h.take(0, 0);
  }
  ASSERT_EQ(h.named("snapshot_rejected").size(), 1u);
  EXPECT_EQ(h.named("snapshot_rejected")[0]["unit"], 1);
  EXPECT_NE(h.named("snapshot_rejected")[0]["reason"].get<std::string>().find("is below the last consumed"),
            std::string::npos);
  EXPECT_EQ(h.merges(0).size(), 7u) << "unit 0 merged at every round";
  seq_word(1, 0) = 2 + (int64_t{1} << 40);  // a jump: refused too, no second line before a read
  for (int i = 0; i < 3; ++i) h.tick();
  ASSERT_EQ(h.named("snapshot_rejected").size(), 1u);
  EXPECT_EQ(h.merges(0).size(), 7u) << "nothing of unit 1 was read";
  // Once a snapshot of the slot is read again, a new implausible number gets its line.
  seq_word(1, 0) = 3;
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 8u);
  seq_word(1, 0) = 3 + (int64_t{1} << 40);
  for (int i = 0; i < 3; ++i) h.tick();
  ASSERT_EQ(h.named("snapshot_rejected").size(), 2u);
  EXPECT_NE(h.named("snapshot_rejected")[1]["reason"].get<std::string>().find("jumps too far"), std::string::npos);
}

// Review of issue 34: a unit whose snapshot barely moves (one ulp of one value, counters that
// fit) set ν for every honest unit of a three-unit merge, which then barely moved Θ.
TEST(SyncerCore, ATinyOuterGradientDoesNotScaleTheHonestUnitsDown) {
  Harness h(small_config(Mode::diloco, 3, 3));
  const std::vector<float> before(h.core.theta(0).begin(), h.core.theta(0).end());
  std::vector<float> still = before;
  still[0] = std::nextafter(still[0], 1e9f);
  h.publish(0, 0, 1.0f, 4, 400);
  h.publish(1, 0, 1.0f, 4, 400);
  h.unit(2).publish(0, still, {4, 400, 4, 0});
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 1u);
  EXPECT_EQ(h.merges(0)[0]["outer_grads_clipped"], json::array());
  double moved = 0;
  for (size_t i = 0; i < before.size(); ++i)
    moved = std::max(moved, std::abs(static_cast<double>(h.core.theta(0)[i]) - before[i]));
  EXPECT_GT(moved, 0.1) << "the honest units' outer gradients were scaled to the liar's";
}

// Review of issue 34: the record once aged by merges of the fragment, which a liar merging
// alone (quorum 1) makes itself: after 64 of them it was unbounded.
TEST(SyncerCore, ALiarMergingAloneCannotAgeTheHonestRecordOut) {
  Harness h(small_config(Mode::decoupled, 3, 1));
  const std::vector<float> huge(h.layout.numel(0), 1e30f);
  h.publish(0, 0, 1.0f, 4, 400);
  h.publish(1, 0, 1.0f, 4, 400);
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 1u);
  for (int round = 1; round <= 70; ++round) {
    std::vector<float> got(h.layout.numel(0));
    if (h.unit(2).inbox_version(0) > 0) {
      ASSERT_TRUE(h.unit(2).take_inbox(0, got));
    }
    h.unit(2).publish(0, huge, {4, 400, 4, h.unit(2).inbox_version(0)});
    h.tick();
    ASSERT_EQ(h.merges(0).size(), 1u + round);
    ASSERT_EQ(h.merges(0).back()["outer_grads_clipped"], json({2})) << "round " << round;
  }
  for (float x : h.core.theta(0)) ASSERT_LE(std::abs(x), 1e4f);
}

// Review of issue 34: "one line" held only while the refused number stayed the same; a unit
// writing a new implausible number at every poll got a line per poll.
TEST(SyncerCore, AJumpingSequenceNumberIsLoggedOnceNotPerPoll) {
  Harness h(small_config(Mode::decoupled, 2, 1));
  auto& seq = reinterpret_cast<int64_t*>(h.memory[1]->base() + h.layout.header_offset(0))[protocol::kOutSeq];
  for (int i = 0; i < 100; ++i) {
    seq = (int64_t{1} << 40) + i;
    h.tick();
  }
  EXPECT_EQ(h.named("snapshot_rejected").size(), 1u);
}

// Issue 34: a unit that keeps naming reference version 0 in its snapshots (it acknowledges each
// delivery without taking it as its reference) made the syncer keep one copy of the fragment
// per delivery. At most kMaxReferences are held; a snapshot naming a dropped one is refused.
TEST(SyncerCore, AUnitPinningItsReferenceAtZeroCannotMakeTheSyncerHoldMoreThanTheCap) {
  Config c = small_config(Mode::decoupled, 1, 1);
  c.wan.format = "int8";
  Harness h(c);
  const std::vector<float> theta0(h.core.theta(0).begin(), h.core.theta(0).end());
  h.unit(0).set_reference(0, 0, theta0);
  h.window.set_reference(0, 0, 0, theta0);
  const size_t rounds = 3 * protocol::SyncerWindow::kMaxReferences;
  for (size_t i = 0; i < rounds; ++i) {
    if (h.unit(0).outbox_free(0)) {
      std::vector<float> theta = theta0;
      for (float& x : theta) x += 0.01f;
      h.unit(0).publish(0, theta, {4, 400, 4, h.core.versions()[0]});  // against reference 0
    }
    h.tick();
    h.unit(0).set_inbox_taken(0, h.unit(0).inbox_version(0));  // acknowledged, never taken
    EXPECT_LE(h.window.references_held(0, 0), protocol::SyncerWindow::kMaxReferences) << "round " << i;
  }
  EXPECT_GE(h.core.versions()[0], static_cast<int64_t>(protocol::SyncerWindow::kMaxReferences));
  bool not_held = false;
  for (const json& e : h.named("snapshot_rejected"))
    not_held = not_held || e["reason"].get<std::string>().find("reference version 0 is not held") != std::string::npos;
  EXPECT_TRUE(not_held) << "once version 0 is dropped, a snapshot against it is refused";
}

// Issue 34: kTokensDone = INT64_MAX once wrapped the syncer's signed sum of every unit's tokens
// (negative: the budget never reached, or reached at once). The sum saturates instead.
TEST(SyncerCore, AHugeTokensDoneWordSaturatesTheTotalInsteadOfWrapping) {
  Harness h(small_config(Mode::decoupled, 2, 1));
  h.unit(0).set_control(protocol::kTokensDone, 1000);
  h.unit(1).set_control(protocol::kTokensDone, std::numeric_limits<int64_t>::max());
  h.tick();
  EXPECT_EQ(h.core.tokens_total(), std::numeric_limits<int64_t>::max());
  h.unit(1).set_control(protocol::kTokensDone, std::numeric_limits<int64_t>::min());
  h.tick();
  EXPECT_EQ(h.core.tokens_total(), 1000) << "a negative count counts as none";
}

TEST(SyncerCore, ASnapshotCountsFromItsArrivalOverASlowLink) {
  Config c = small_config(Mode::decoupled, 1, 1);
  const double bytes = static_cast<double>(Harness(c).layout.wire_bytes(0));
  c.wan.bandwidth_mbit_s = 8.0 * bytes / 1e6;  // a fragment takes one second to cross
  c.wan.burst_kb = 0.001;
  Harness h(c);
  h.publish(0, 0, 1.0f, 4, 400);
  h.tick();
  EXPECT_TRUE(h.merges(0).empty()) << "merged before it arrived";
  EXPECT_FALSE(h.unit(0).outbox_free(0)) << "acknowledged before its last byte left the unit";
  h.clock = 0.5;
  h.tick();
  EXPECT_TRUE(h.merges(0).empty());
  h.clock = 1.01;
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 1u);
  EXPECT_TRUE(h.unit(0).outbox_free(0));
}

TEST(SyncerCore, StoppingFlushesWhateverWasPublishedAndTellsEveryUnit) {
  Harness h(small_config(Mode::decoupled, 3, 3));
  h.publish(2, 1, 1.0f, 4, 400);
  h.tick();
  EXPECT_TRUE(h.merges(1).empty());
  h.core.set_stopping(true);
  h.tick();
  ASSERT_EQ(h.merges(1).size(), 1u);
  EXPECT_EQ(h.merges(1)[0]["units"], json({2}));
  for (int u = 0; u < 3; ++u) EXPECT_EQ(h.unit(u).control(protocol::kStop), 1) << u;
}

// A signal's stop, which a resumed job goes on from: a snapshot short of the quorum stays
// unmerged (its unit sends it again when resumed), even once every unit is done; a fragment
// with its quorum still merges without waiting out the grace window.
TEST(SyncerCore, ASignalsStopMergesOnlyWithAQuorum) {
  Harness h(small_config(Mode::decoupled, 3, 2));
  h.publish(0, 0, 1.0f, 4, 400);
  h.publish(1, 1, 1.0f, 4, 400);
  h.publish(2, 1, 1.0f, 4, 400);
  h.tick();
  h.core.set_stopping(false);
  for (int u = 0; u < 3; ++u) h.unit(u).set_control(protocol::kState, protocol::kDone);
  h.tick();
  h.tick();
  EXPECT_TRUE(h.merges(0).empty()) << "one snapshot of 2 was merged at a signal's stop";
  ASSERT_EQ(h.merges(1).size(), 1u);
  EXPECT_EQ(h.merges(1)[0]["units"], json({1, 2}));
  for (int u = 0; u < 3; ++u) EXPECT_EQ(h.unit(u).control(protocol::kStop), 1) << u;
}

// Decoupled with K = M and τ = 0: a unit that waits for the merge of another fragment
// (kWaitingFor) cannot send this one, so this one merges without it; a unit that is training,
// or that waits for this fragment, still counts.
TEST(SyncerCore, AUnitWaitingForAnotherFragmentIsLeftOutOfThisOnesQuorum) {
  Config c = small_config(Mode::decoupled, 2, 2);
  c.outer.overlap = 0;
  Harness h(c);
  h.publish(1, 0, 1.0f, 4, 400);
  h.tick();
  EXPECT_TRUE(h.merges(0).empty()) << "1 of K = 2 merged while unit 0 trains";
  h.unit(0).set_control(protocol::kWaitingFor, 1);  // unit 0 waits for fragment 0 itself
  h.tick();
  EXPECT_TRUE(h.merges(0).empty()) << "unit 0 waits for this fragment: its snapshot may still come";
  h.publish(0, 1, 1.0f, 4, 400);
  h.unit(0).set_control(protocol::kWaitingFor, 2);  // sent fragment 1, waits for its merge
  h.tick();
  ASSERT_EQ(h.merges(0).size(), 1u) << "fragment 0 waited for a unit that waits for fragment 1";
  EXPECT_EQ(h.merges(0)[0]["units"], json({1}));
  EXPECT_TRUE(h.merges(1).empty()) << "fragment 1 merged without unit 1, which waits for nothing";
}

// ... but a unit whose awaited merge exists (Θ_q is newer than the version its snapshot of q
// started from: it only has not taken it yet) is about to go on and send p: it still counts.
// And a kWaitingFor naming no fragment is ignored.
TEST(SyncerCore, AUnitAboutToTakeItsMergeStillCountsInTheQuorum) {
  Config c = small_config(Mode::decoupled, 2, 2);
  c.outer.overlap = 0;
  Harness h(c);
  h.publish(0, 1, 1.0f, 4, 400);
  h.publish(1, 1, 1.0f, 4, 400);
  h.tick();
  ASSERT_EQ(h.merges(1).size(), 1u);  // Θ_1 at version 1
  h.publish(0, 1, 1.0f, 4, 400, /*base=*/0);  // from version 0: version 1 is on its way to it
  h.unit(0).set_control(protocol::kWaitingFor, 2);
  h.publish(1, 0, 1.0f, 4, 400);
  h.tick();
  EXPECT_TRUE(h.merges(0).empty()) << "fragment 0 merged without unit 0, whose awaited merge exists";
  h.unit(0).set_control(protocol::kWaitingFor, 99);
  h.tick();
  EXPECT_TRUE(h.merges(0).empty()) << "a kWaitingFor out of range counted";
}

// Streaming's quorum is every unit, at a signal's stop too: a unit that stopped before sending
// its snapshot is not counted as finished with nothing left to merge.
TEST(SyncerCore, ASignalsStopInStreamingMergesOnlyWithEveryUnit) {
  Harness h(small_config(Mode::streaming, 2, 2));
  h.publish(0, 0, 1.0f, 4, 400);
  h.tick();
  h.core.set_stopping(false);
  for (int u = 0; u < 2; ++u) h.unit(u).set_control(protocol::kState, protocol::kDone);
  h.tick();
  h.tick();
  EXPECT_TRUE(h.merges(0).empty()) << "unit 0's snapshot was merged alone at a signal's stop";
}


// A syncer restarted mid-run (docs/deployments.md "The syncer dying"): a new core over the same units'
// windows. It reads the books of the units' earlier processes back from the live windows (the
// job's token count goes on), serves no rejoin the previous one served, adopts the newest Θ_p
// a unit offers, and delivers it to a unit that offered an older version once that unit has
// taken its inboxes back.
TEST(SyncerCore, ARestartedCoreReadsItsBooksBackAndAdoptsTheNewestThetaOffered) {
  Config c = small_config(Mode::decoupled, 2, 1);
  Harness h(c);
  h.core.set_isolated(true);
  for (int u = 0; u < 2; ++u) h.core.unit_connected(u);
  // Unit 1's first process trained 500 tokens and died; its new process joined.
  h.unit(1).set_control(protocol::kTokensDone, 500);
  h.tick();
  h.core.unit_lost(1);
  h.attach(1);
  h.core.unit_connected(1);
  h.unit(1).set_control(protocol::kRejoinRequest, 1);
  h.tick();  // its rejoin is served
  EXPECT_EQ(h.unit(1).control(protocol::kRejoinServed), 1);
  EXPECT_EQ(h.unit(1).control(protocol::kTokensBefore), 500);
  h.unit(0).set_control(protocol::kTokensDone, 300);
  h.unit(1).set_control(protocol::kTokensDone, 40);
  h.publish(0, 0, 2.0f, 4, 400);
  h.tick();
  ASSERT_EQ(h.core.versions(), (std::vector<int64_t>{1, 0}));
  std::vector<float> held(h.layout.numel(0));
  ASSERT_TRUE(h.unit(0).take_inbox(0, held));
  h.tick();
  EXPECT_EQ(h.core.tokens_total(), 840);

  // The syncer dies; a new one starts over the same windows.
  protocol::SyncerWindow window(h.remote, h.layout, [&] { return h.clock; });
  syncer::UnitLinks links(c, 2);
  std::vector<json> events;
  syncer::SyncerCore restarted(c, h.plan, window, h.fragments, links, [&] { return h.clock; },
                             [&](json e) { events.push_back(std::move(e)); });
  restarted.set_isolated(true);
  restarted.set_restarted();
  for (int u = 0; u < 2; ++u) restarted.unit_connected(u);
  EXPECT_EQ(restarted.tokens_total(), 840) << "the books came back from the windows";
  EXPECT_EQ(restarted.versions(), (std::vector<int64_t>{0, 0}));

  // Unit 0 offers Θ_0 at version 1; unit 1 holds nothing newer than Θ₀.
  for (int u = 0; u < 2; ++u) h.unit(u).hold_inboxes();
  h.unit(0).offer(0, 1, held, 0, h.core.epoch());
  restarted.poll();
  std::vector<float> got(h.layout.numel(0));
  ASSERT_EQ(window.fetch_offer(0, 0, restarted.headers(0), got), "");
  restarted.adopt(0, 1, got);
  EXPECT_EQ(restarted.versions(), (std::vector<int64_t>{1, 0}));
  EXPECT_THROW(restarted.adopt(0, 1, got), Error) << "not newer";
  // The dead syncer's copies are of this history up to the version taken over, not beyond.
  EXPECT_TRUE(restarted.in_history(0, 1, h.core.epoch()));
  EXPECT_FALSE(restarted.in_history(0, 2, h.core.epoch()));
  EXPECT_TRUE(restarted.in_history(1, 0, h.core.epoch()));
  EXPECT_FALSE(restarted.in_history(1, 1, h.core.epoch()));
  EXPECT_TRUE(restarted.in_history(0, 1, restarted.epoch()));
  restarted.offer_taken(0, {1, 0});
  restarted.offer_taken(1, {0, 0});
  auto tick = [&] {
    restarted.poll();
    restarted.serve_rejoins();
    restarted.collect();
    restarted.merge_ready();
    restarted.deliver_pending();
  };
  tick();
  EXPECT_TRUE(events.empty() || events.back()["event"] != "rejoin") << "a rejoin served before is not served again";
  EXPECT_EQ(h.unit(1).inbox_version(0), 0) << "nothing lands in a held inbox";
  for (int p = 0; p < 2; ++p) h.unit(1).set_inbox_taken(p, 0);  // unit 1 takes its inboxes back
  tick();
  EXPECT_EQ(h.unit(1).inbox_version(0), 1) << "owed the newer Θ_0";
  std::vector<float> taken(h.layout.numel(0));
  ASSERT_TRUE(h.unit(1).take_inbox(0, taken));
  EXPECT_EQ(taken, held);
  EXPECT_EQ(h.unit(0).inbox_version(1), 0) << "unit 0 holds Θ_1 at the syncer's version: nothing owed";

  // A fresh run's syncer over the same windows (--resume never) takes none of those books.
  protocol::SyncerWindow window2(h.remote, h.layout, [&] { return h.clock; });
  syncer::SyncerCore fresh(c, h.plan, window2, h.fragments, links, [&] { return h.clock; }, [](json) {});
  fresh.set_isolated(true);
  for (int u = 0; u < 2; ++u) fresh.unit_connected(u);
  EXPECT_EQ(fresh.tokens_total(), 340) << "only the live processes' own tokens";
}

}  // namespace
}  // namespace ddiloco::syncer
