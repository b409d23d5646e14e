// The learner ↔ syncer window protocol over the in-memory transport: what crosses, flow
// control, and a unit that is lost and replaced by a new process (isolated deployment).
#include <gtest/gtest.h>

#include <cmath>

#include "ddiloco/error.hpp"
#include "ddiloco/fragments.hpp"
#include "ddiloco/model.hpp"
#include "ddiloco/rng.hpp"
#include "ddiloco/sync_window.hpp"
#include "local_link.hpp"

namespace ddiloco {
namespace {

std::vector<float> pattern(size_t n, float base) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + 0.001f * static_cast<float>(i);
  return v;
}

struct Fixture {
  ParameterLayout layout = ParameterLayout::gpt2(GptConfig{16, 4, 1, 2, 8});
  protocol::FragmentPlan plan{layout, 2, 4};
  protocol::WindowLayout windows;
  test::LocalRemote remote{2};
  std::vector<std::unique_ptr<test::LocalExposed>> memory;
  explicit Fixture(const wire::Codec& codec = {.format = wire::Format::bf16, .block = 64}, double ef_decay = 1.0,
                   size_t down_topk = 0)
      : windows(plan, codec, ef_decay, down_topk) {
    for (int u = 0; u < 2; ++u) {
      memory.push_back(std::make_unique<test::LocalExposed>(windows.bytes()));
      remote.attach(u, memory.back().get());
    }
  }
};

TEST(WindowProtocol, SnapshotAndMergeCrossInBothDirections) {
  Fixture f;
  protocol::SyncerWindow syncer(f.remote, f.windows);
  protocol::LearnerWindow learner(*f.memory[1], f.windows);
  const size_t n = f.windows.numel(1);
  const auto theta0 = pattern(n, 0.5f);
  learner.set_reference(1, 0, theta0);
  syncer.set_reference(1, 1, 0, theta0);
  const auto mine = pattern(n, 0.52f);
  ASSERT_TRUE(learner.outbox_free(1));
  EXPECT_EQ(learner.publish(1, mine, {3, 300, 3, 0}), 1);
  EXPECT_FALSE(learner.outbox_free(1));  // unread: the next publish must wait

  std::vector<protocol::UnitHeaders> h;
  syncer.poll(h);
  ASSERT_TRUE(h[1].reachable);
  EXPECT_EQ(h[1].header(1, protocol::kOutSeq), 1);
  EXPECT_EQ(h[1].header(1, protocol::kOutTokens), 300);
  std::vector<float> got(n);
  const auto fetched = syncer.fetch(1, 1, h[1], got);
  EXPECT_EQ(fetched.problem, "");
  EXPECT_EQ(fetched.seq_after, 1);
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(got[i], mine[i], 1e-3f) << i;  // bf16 difference
  syncer.ack(1, 1, 1);
  EXPECT_TRUE(learner.outbox_free(1));

  const auto merged = pattern(n, 0.51f);
  syncer.deliver(1, 1, 1, merged);
  EXPECT_EQ(learner.inbox_version(1), 1);
  std::vector<float> taken(n);
  ASSERT_TRUE(learner.take_inbox(1, taken));
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(taken[i], merged[i], 1e-3f) << i;
  // Both sides now hold the same reference R (sync_window.hpp): the next delivery is exact up
  // to one rounding, never an accumulated one.
  EXPECT_EQ(learner.reference_version(1), 1);
}

std::vector<float> plus_noise(const std::vector<float>& base, uint64_t seed, float scale) {
  Rng rng(seed);
  std::vector<float> v = base;
  for (float& x : v) x += scale * static_cast<float>(rng.normal());
  return v;
}

// Sparse snapshots with error feedback (SparseLoCo, arXiv 2508.15706): each snapshot encodes
// θ_t − R + β·E_{t−1} (its bytes are exactly that encoding), what the syncer decodes is that
// minus the new residual E_t, and with β = 1 the sum of what the syncer decodes over several
// publishes is the sum of what was meant, θ_t − R, minus the final residual only.
TEST(WindowProtocol, SparseSnapshotsWithErrorFeedbackLoseOnlyTheFinalResidual) {
  const wire::Codec codec{.format = wire::Format::sparse, .chunk = 32, .topk = 3, .value_bits = 2};
  for (double beta : {1.0, 0.5, 0.0}) {
    Fixture f(codec, beta);
    protocol::SyncerWindow syncer(f.remote, f.windows);
    protocol::LearnerWindow learner(*f.memory[0], f.windows);
    const size_t n = f.windows.numel(0);
    ASSERT_GT(n, 4 * codec.chunk);
    const auto r = pattern(n, 0.1f);
    learner.set_reference(0, 0, r);
    syncer.set_reference(0, 0, 0, r);
    std::vector<double> meant(n, 0.0), decoded(n, 0.0);
    std::vector<float> e_before(n, 0.0f), got(n);
    std::vector<protocol::UnitHeaders> h;
    for (int t = 1; t <= 8; ++t) {
      const auto theta = plus_noise(r, 100 + static_cast<uint64_t>(t), 0.01f);
      std::vector<float> want(n);
      for (size_t i = 0; i < n; ++i) want[i] = theta[i] - r[i] + static_cast<float>(beta) * e_before[i];
      learner.publish(0, theta, {1, 10, t, 0});
      const std::byte* outbox = f.memory[0]->base() + f.windows.outbox_offset(0);
      ASSERT_EQ(std::vector<std::byte>(outbox, outbox + f.windows.wire_bytes(0)), wire::encode(codec, want))
          << "β " << beta << ", publish " << t;
      syncer.poll(h);
      ASSERT_EQ(syncer.fetch(0, 0, h[0], got).problem, "");
      syncer.ack(0, 0, h[0].header(0, protocol::kOutSeq));
      const auto e = learner.residual(0);
      for (size_t lo = 0; lo < n; lo += codec.chunk) {  // at most topk values of each chunk cross
        size_t nonzero = 0;
        for (size_t i = lo; i < std::min(n, lo + codec.chunk); ++i) nonzero += got[i] != r[i];
        EXPECT_LE(nonzero, codec.topk) << "β " << beta << ", chunk at " << lo;
      }
      for (size_t i = 0; i < n; ++i) {
        const double d = static_cast<double>(got[i]) - r[i];  // what the syncer decoded
        ASSERT_NEAR(d, static_cast<double>(want[i]) - e[i], 1e-7) << "β " << beta << ", publish " << t << ", " << i;
        meant[i] += static_cast<double>(theta[i]) - r[i];
        decoded[i] += d;
      }
      e_before.assign(e.begin(), e.end());
    }
    if (beta != 1.0) continue;
    double residual = 0;
    for (size_t i = 0; i < n; ++i) {
      EXPECT_NEAR(decoded[i], meant[i] - e_before[i], 1e-6) << i;
      residual = std::max(residual, std::fabs(static_cast<double>(e_before[i])));
    }
    EXPECT_GT(residual, 0.01) << "sparse drops most of each snapshot: what is lost is not negligible";
  }
}

// Deliveries (syncer → unit) in int2 and sparse: Θ_p − R in the wire format; what a delivery
// rounds or drops stays in Θ_p − R, so R lags Θ_p and the next deliveries carry the rest. Both
// sides' R stay identical (else the unit's values would drift from Θ_p instead of converging).
TEST(WindowProtocol, Int2AndSparseDeliveriesLagAndCatchUp) {
  using wire::Format;
  for (const wire::Codec& codec : {wire::Codec{.format = Format::int2, .block = 16},
                                   wire::Codec{.format = Format::sparse, .chunk = 32, .topk = 4, .value_bits = 8},
                                   wire::Codec{.format = Format::sparse, .chunk = 32, .topk = 8, .value_bits = 2}}) {
    Fixture f(codec);
    protocol::SyncerWindow syncer(f.remote, f.windows);
    protocol::LearnerWindow learner(*f.memory[1], f.windows);
    const size_t n = f.windows.numel(1);
    const auto r = pattern(n, 0.3f);
    learner.set_reference(1, 0, r);
    syncer.set_reference(1, 1, 0, r);
    const auto theta = plus_noise(r, 7, 0.05f);
    auto error = [&](const std::vector<float>& held) {
      double m = 0;
      for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(held[i]) - theta[i]));
      return m;
    };
    std::vector<float> taken(n);
    std::vector<double> errors;
    for (int v = 1; v <= 40; ++v) {  // the same Θ_p, delivered again and again
      ASSERT_EQ(syncer.deliver(1, 1, v, theta), f.windows.wire_bytes(1)) << wire::format_name(codec.format);
      ASSERT_TRUE(learner.take_inbox(1, taken));
      EXPECT_EQ(learner.reference_version(1), v);
      errors.push_back(error(taken));
    }
    const std::string name = wire::format_name(codec.format) + std::string(" ") + std::to_string(codec.value_bits);
    EXPECT_GT(errors.front(), 0.01) << name << ": one delivery does not carry all of Θ_p − R";
    EXPECT_LT(errors.back(), 1e-3 * errors.front()) << name << ": later deliveries carry the rest";
  }
}

// wan.down_topk: deliveries keep their own number of values per chunk. A delivery is
// down_bytes long, carries at most down_topk nonzeros per chunk, and the unit decodes it with
// the same codec (an up codec would misread its indices); snapshots keep topk.
TEST(WindowProtocol, SparseDeliveriesKeepDownTopk) {
  const wire::Codec up{.format = wire::Format::sparse, .chunk = 32, .topk = 2, .value_bits = 8};
  Fixture f(up, 1.0, 8);
  EXPECT_EQ(f.windows.down_codec().topk, 8u);
  EXPECT_EQ(f.windows.codec().topk, 2u);
  const size_t n = f.windows.numel(1);
  EXPECT_EQ(f.windows.wire_bytes(1), wire::encoded_bytes(up, n));
  EXPECT_EQ(f.windows.down_bytes(1), wire::encoded_bytes(f.windows.down_codec(), n));
  EXPECT_GT(f.windows.down_bytes(1), f.windows.wire_bytes(1));
  EXPECT_GE(f.windows.capacity(1), f.windows.down_bytes(1));

  protocol::SyncerWindow syncer(f.remote, f.windows);
  protocol::LearnerWindow learner(*f.memory[1], f.windows);
  const auto r = pattern(n, 0.3f);
  learner.set_reference(1, 0, r);
  syncer.set_reference(1, 1, 0, r);
  const auto theta = plus_noise(r, 11, 0.05f);
  ASSERT_EQ(syncer.deliver(1, 1, 1, theta), f.windows.down_bytes(1));
  std::vector<float> taken(n);
  ASSERT_TRUE(learner.take_inbox(1, taken));
  for (size_t lo = 0; lo < n; lo += up.chunk) {
    size_t moved = 0;
    for (size_t i = lo; i < std::min(n, lo + up.chunk); ++i) moved += taken[i] != r[i];
    EXPECT_EQ(moved, std::min<size_t>(8, std::min(n, lo + up.chunk) - lo)) << "chunk at " << lo;
  }
  // The largest moves land to within 8-bit rounding of their span.
  double largest = 0, its_error = 0;
  for (size_t i = 0; i < n; ++i)
    if (std::fabs(theta[i] - r[i]) > largest) largest = std::fabs(theta[i] - r[i]), its_error = std::fabs(taken[i] - theta[i]);
  EXPECT_LT(its_error, 0.01 * largest);

  EXPECT_EQ(protocol::WindowLayout(f.plan, up, 1.0, 0).down_codec().topk, up.topk) << "0: deliveries keep topk";
}

TEST(WindowProtocol, ALostUnitIsSkippedAndANewProcessStartsFromRawTheta) {
  Fixture f;
  protocol::SyncerWindow syncer(f.remote, f.windows);
  const size_t n = f.windows.numel(0);
  const auto theta0 = pattern(n, 0.1f);
  {
    protocol::LearnerWindow learner(*f.memory[0], f.windows);
    learner.set_reference(0, 0, theta0);
    syncer.set_reference(0, 0, 0, theta0);
    learner.set_control(protocol::kTokensDone, 1234);
    learner.publish(0, pattern(n, 0.2f), {1, 10, 1, 0});
  }
  std::vector<protocol::UnitHeaders> h;
  syncer.poll(h);
  EXPECT_EQ(h[0].control(protocol::kTokensDone), 1234);

  // The process dies: the transport reports it absent. Its headers keep their last values but
  // are marked unreachable; a read is refused; what is written to it is dropped.
  f.remote.detach(0);
  syncer.poll(h);
  EXPECT_FALSE(h[0].reachable);
  EXPECT_TRUE(h[1].reachable);
  EXPECT_EQ(h[0].control(protocol::kTokensDone), 1234);
  std::vector<float> got(n, -7.0f);
  const auto fetched = syncer.fetch(0, 0, h[0], got);
  EXPECT_NE(fetched.problem, "");
  EXPECT_EQ(fetched.seq_after, -1);
  EXPECT_EQ(got[0], -7.0f);
  const int64_t puts = f.remote.puts;
  syncer.deliver(0, 0, 1, pattern(n, 0.3f));
  EXPECT_EQ(f.remote.puts, puts);

  // A new process: a new, zeroed window and no reference. The syncer forgets the old one's
  // references; the next delivery is raw fp32 and sets both sides' references.
  test::LocalExposed fresh(f.windows.bytes());
  f.remote.attach(0, &fresh);
  syncer.reset_unit(0);
  protocol::LearnerWindow learner(fresh, f.windows);
  syncer.poll(h);
  EXPECT_TRUE(h[0].reachable);
  EXPECT_EQ(h[0].control(protocol::kTokensDone), 0);
  EXPECT_EQ(syncer.delivery_bytes(0, 0), n * sizeof(float));
  const auto theta = pattern(n, 0.4f);
  syncer.deliver(0, 0, 5, theta, /*raw=*/true);
  std::vector<float> taken(n);
  ASSERT_TRUE(learner.take_inbox(0, taken));
  EXPECT_EQ(taken, theta);
  EXPECT_EQ(learner.reference_version(0), 5);
  // From here on the unit's snapshots are differences against that Θ.
  learner.publish(0, pattern(n, 0.41f), {1, 10, 6, 5});
  syncer.poll(h);
  EXPECT_EQ(h[0].header(0, protocol::kOutRef), 5);
  const auto again = syncer.fetch(0, 0, h[0], got);
  EXPECT_EQ(again.problem, "");
}

// A unit whose parameters went non-finite starts over from Θ with its memory intact: the
// snapshots it published before stay for the syncer. Served raw Θ at its rejoin before one of
// them was read, the syncer must still hold the reference that snapshot was taken against.
TEST(WindowProtocol, ASnapshotPublishedBeforeARejoinIsStillDecodedAfterTheServe) {
  Fixture f;
  protocol::SyncerWindow syncer(f.remote, f.windows);
  protocol::LearnerWindow learner(*f.memory[0], f.windows);
  const size_t n = f.windows.numel(0);
  const auto theta0 = pattern(n, 0.1f);
  learner.set_reference(0, 0, theta0);
  syncer.set_reference(0, 0, 0, theta0);
  const auto mine = pattern(n, 0.12f);
  learner.publish(0, mine, {4, 40, 4, 0});  // against version 0, unread
  learner.hold_inboxes();
  syncer.deliver(0, 0, 3, pattern(n, 0.2f), /*raw=*/true);  // the rejoin's Θ at version 3
  std::vector<float> taken(n);
  ASSERT_TRUE(learner.take_inbox(0, taken));
  std::vector<protocol::UnitHeaders> h;
  syncer.poll(h);
  ASSERT_EQ(h[0].header(0, protocol::kOutRef), 0);
  std::vector<float> got(n);
  const auto fetched = syncer.fetch(0, 0, h[0], got);
  EXPECT_EQ(fetched.problem, "");
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], mine[i], 1e-3f) << i;
  // Once read and acknowledged, the old reference goes (the unit names version 3 or later now).
  syncer.ack(0, 0, h[0].header(0, protocol::kOutSeq));
  learner.publish(0, pattern(n, 0.21f), {1, 10, 5, 3});
  syncer.poll(h);
  EXPECT_EQ(syncer.fetch(0, 0, h[0], got).problem, "");
  h[0].words[static_cast<size_t>(protocol::kControlWords) + protocol::kOutRef] = 0;  // naming version 0 now
  EXPECT_NE(syncer.fetch(0, 0, h[0], got).problem, "");
}

// A unit whose syncer was restarted hands back the Θ_p it holds (docs/deployments.md "The syncer dying"):
// raw fp32 in its held inbox, with its version, read by the restarted syncer, which then holds
// the unit's reference: the unit's unread snapshot, against that reference, is decoded.
TEST(WindowProtocol, AnOfferOfThetaIsReadBackRawAndItsReferenceDecodesTheUnreadSnapshot) {
  Fixture f;
  const size_t n = f.windows.numel(1);
  protocol::LearnerWindow learner(*f.memory[1], f.windows);
  const auto theta = pattern(n, 0.3f);
  learner.set_reference(1, 6, theta);  // as if taken at version 6
  learner.publish(1, pattern(n, 0.31f), {4, 40, 30, 6});
  learner.hold_inboxes();
  learner.offer(1, 6, theta, /*seq_base=*/11, /*epoch=*/77);

  protocol::SyncerWindow restarted(f.remote, f.windows);  // a new syncer: no references held
  std::vector<protocol::UnitHeaders> h;
  restarted.poll(h);
  EXPECT_EQ(h[1].header(1, protocol::kInVersion), 6);
  EXPECT_EQ(h[1].header(1, protocol::kOfferSeqBase), 11);
  EXPECT_EQ(h[1].header(1, protocol::kOfferEpoch), 77);
  EXPECT_EQ(h[1].header(1, protocol::kInAck), -1) << "held: nothing is delivered over the offer";
  std::vector<float> got(n);
  ASSERT_EQ(restarted.fetch_offer(1, 1, h[1], got), "");
  EXPECT_EQ(got, theta) << "the copy crosses raw, bit for bit";
  std::vector<float> snap(n);
  EXPECT_NE(restarted.fetch(1, 1, h[1], snap).problem, "") << "no reference yet";
  restarted.set_reference(1, 1, 6, got);
  const auto fetched = restarted.fetch(1, 1, h[1], snap);
  EXPECT_EQ(fetched.problem, "");
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(snap[i], 0.31f + 0.001f * static_cast<float>(i), 1e-3f) << i;

  // A copy torn or lied about is refused, naming why.
  reinterpret_cast<float*>(f.memory[1]->base() + f.windows.inbox_offset(1))[3] += 1.0f;
  EXPECT_NE(restarted.fetch_offer(1, 1, h[1], got).find("checksum"), std::string::npos);
  learner.offer(1, 6, theta, 11, 77);
  auto* words = reinterpret_cast<int64_t*>(f.memory[1]->base() + f.windows.header_offset(1));
  words[protocol::kInBytes] = 12;
  restarted.poll(h);
  EXPECT_NE(restarted.fetch_offer(1, 1, h[1], got).find("announced as 12 bytes"), std::string::npos);
  EXPECT_THROW(learner.offer(1, 6, pattern(n + 1, 0.0f), 0, 77), Error);
}

TEST(WindowProtocol, APollBudgetSpacesEachUnitsReadsAndAllReadsEveryone) {
  Fixture f;
  protocol::SyncerWindow syncer(f.remote, f.windows);
  protocol::LearnerWindow learner(*f.memory[0], f.windows);
  // One header block per hour: after the first poll, polls keep the last values.
  syncer.set_poll_budget(static_cast<double>(f.windows.header_block_bytes()) / 3600);
  std::vector<protocol::UnitHeaders> h;
  learner.set_control(protocol::kHeartbeat, 1);
  syncer.poll(h);
  ASSERT_TRUE(h[0].reachable);
  EXPECT_EQ(h[0].control(protocol::kHeartbeat), 1);
  const uint64_t read = syncer.bytes_read();
  learner.set_control(protocol::kHeartbeat, 2);
  syncer.poll(h);
  EXPECT_EQ(h[0].control(protocol::kHeartbeat), 1) << "read again within its budget";
  EXPECT_TRUE(h[0].reachable) << "a unit not read this poll keeps its reachability";
  EXPECT_EQ(syncer.bytes_read(), read);
  syncer.poll(h, /*all=*/true);
  EXPECT_EQ(h[0].control(protocol::kHeartbeat), 2);
  // Without a budget every poll reads.
  syncer.set_poll_budget(0);
  learner.set_control(protocol::kHeartbeat, 3);
  syncer.poll(h);
  EXPECT_EQ(h[0].control(protocol::kHeartbeat), 3);
}

TEST(WindowProtocol, TimeBookTravelsAsDoubles) {
  Fixture f;
  protocol::SyncerWindow syncer(f.remote, f.windows);
  protocol::LearnerWindow learner(*f.memory[0], f.windows);
  learner.set_control_f64(protocol::kTimeBook, 12.5);
  learner.set_control_f64(protocol::kTimeBook + 5, -0.25);
  EXPECT_THROW(learner.set_control_f64(protocol::kControlWords, 1.0), Error);
  std::vector<protocol::UnitHeaders> h;
  syncer.poll(h);
  EXPECT_EQ(h[0].control_f64(protocol::kTimeBook), 12.5);
  EXPECT_EQ(h[0].control_f64(protocol::kTimeBook + 5), -0.25);
}

TEST(WindowProtocol, MemorySmallerThanTheLayoutIsRefused) {
  Fixture f;
  test::LocalExposed small(f.windows.bytes() - 8);
  EXPECT_THROW(protocol::LearnerWindow(small, f.windows), Error);
}

}  // namespace
}  // namespace ddiloco
