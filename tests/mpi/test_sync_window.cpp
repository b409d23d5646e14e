// ranks: 3
// The learner ↔ syncer window protocol, directly: rank 0 is the syncer, ranks 1 and 2 are the
// leaders of units 0 and 1.
#include <chrono>
#include <numeric>
#include <thread>

#include "ddiloco/fragments.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/rng.hpp"
#include "ddiloco/mpi_memory.hpp"
#include "ddiloco/sync_window.hpp"
#include "mpi_test_main.hpp"

namespace ddiloco {
namespace {

struct Fixture {
  ParameterLayout layout = ParameterLayout::gpt2(GptConfig{16, 4, 1, 2, 8});
  protocol::FragmentPlan plan{layout, 2, 4};
  protocol::WindowLayout windows{plan};
  int rank = mpi::rank(MPI_COMM_WORLD);
  bool syncer = rank == 0;
  int unit = rank - 1;
};

std::vector<float> pattern(size_t n, float base) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + 0.001f * static_cast<float>(i);
  return v;
}

TEST(SyncWindow, PublishFetchAckDeliverTake) {
  Fixture f;
  const size_t n1 = f.windows.numel(1);
  if (f.syncer) {
    comm::MpiRemoteMemory memory(MPI_COMM_WORLD, 2);
    protocol::SyncerWindow win(memory, f.windows);
    MPI_Barrier(MPI_COMM_WORLD);  // (a) leaders have published fragment 1
    std::vector<protocol::UnitHeaders> h;
    win.poll(h);
    for (int u = 0; u < 2; ++u) {
      EXPECT_EQ(h[u].header(1, protocol::kOutSeq), 1);
      EXPECT_EQ(h[u].header(1, protocol::kOutAck), 0);
      EXPECT_EQ(h[u].header(1, protocol::kOutSteps), 7 + u);
      EXPECT_EQ(h[u].header(1, protocol::kOutTokens), 700 + u);
      EXPECT_EQ(h[u].header(0, protocol::kOutSeq), 0);  // fragment 0 untouched
      std::vector<float> got(n1);
      const auto fetched = win.fetch(u, 1, h[u], got);
      EXPECT_EQ(fetched.seq_after, 1);
      EXPECT_EQ(fetched.problem, "");
      EXPECT_EQ(got, pattern(n1, 10.0f * (u + 1)));
      EXPECT_EQ(static_cast<uint64_t>(h[u].header(1, protocol::kOutChecksum)), checksum(got));
    }
    MPI_Barrier(MPI_COMM_WORLD);  // (b) read, not acknowledged
    MPI_Barrier(MPI_COMM_WORLD);  // (b') leaders checked that the outbox is still busy
    win.ack(0, 1, 1);
    win.ack(1, 1, 1);
    win.deliver(0, 1, 5, pattern(n1, -1.0f));
    win.request_stop(1);
    MPI_Barrier(MPI_COMM_WORLD);  // (c) acks, delivery and stop are visible
    MPI_Barrier(MPI_COMM_WORLD);  // (d) unit 0 took its inbox
    win.poll(h);
    EXPECT_EQ(h[0].header(1, protocol::kInAck), 5);
    EXPECT_EQ(h[1].header(1, protocol::kInAck), 0);
    MPI_Barrier(MPI_COMM_WORLD);
    win.close();
  } else {
    comm::MpiExposedMemory memory(MPI_COMM_WORLD, f.windows.bytes());
    protocol::LearnerWindow win(memory, f.windows);
    EXPECT_TRUE(win.outbox_free(1));
    EXPECT_EQ(win.publish(1, pattern(n1, 10.0f * (f.unit + 1)), {7 + f.unit, 700 + f.unit, 9, 0}), 1);
    MPI_Barrier(MPI_COMM_WORLD);  // (a)
    MPI_Barrier(MPI_COMM_WORLD);  // (b) the syncer has read but not acknowledged
    // Flow control: until the syncer acknowledges, the outbox must not be written, read or
    // not. (Between (b) and (b') the read is known to have happened and the ack not.)
    EXPECT_FALSE(win.outbox_free(1)) << "the outbox is free after the read, before the ack";
    EXPECT_THROW(win.publish(1, pattern(n1, 99.0f), {1, 1, 1, 0}), Error);
    MPI_Barrier(MPI_COMM_WORLD);  // (b')
    MPI_Barrier(MPI_COMM_WORLD);  // (c)
    EXPECT_TRUE(win.outbox_free(1));
    if (f.unit == 0) {
      EXPECT_EQ(win.inbox_version(1), 5);
      std::vector<float> got(n1);
      EXPECT_TRUE(win.take_inbox(1, got));
      EXPECT_EQ(got, pattern(n1, -1.0f));
      EXPECT_EQ(win.control(protocol::kStop), 0);
    } else {
      EXPECT_EQ(win.inbox_version(1), 0);
      EXPECT_EQ(win.control(protocol::kStop), 1);
    }
    MPI_Barrier(MPI_COMM_WORLD);  // (d)
    MPI_Barrier(MPI_COMM_WORLD);
    win.close();
  }
}

TEST(SyncWindow, OutboxRefusesAnUnreadSnapshot) {
  Fixture f;
  const size_t n0 = f.windows.numel(0);
  if (f.syncer) {
    comm::MpiRemoteMemory memory(MPI_COMM_WORLD, 2);
    protocol::SyncerWindow win(memory, f.windows);
    MPI_Barrier(MPI_COMM_WORLD);
    win.close();
  } else {
    comm::MpiExposedMemory memory(MPI_COMM_WORLD, f.windows.bytes());
    protocol::LearnerWindow win(memory, f.windows);
    win.publish(0, pattern(n0, 1.0f), {1, 1, 1, 0});
    EXPECT_FALSE(win.outbox_free(0));
    EXPECT_THROW(win.publish(0, pattern(n0, 2.0f), {1, 1, 1, 0}), Error);
    MPI_Barrier(MPI_COMM_WORLD);
    win.close();
  }
}

// A learner far faster than the syncer: it publishes whenever flow control lets it, the
// syncer reads slowly; every snapshot read must be whole (checksum) and sequence numbers
// consumed must be consecutive (the learner never overwrote an unread snapshot).
TEST(SyncWindow, FastLearnerNeverTearsASnapshot) {
  Fixture f;
  const size_t n0 = f.windows.numel(0);
  constexpr int kRounds = 40;
  if (f.syncer) {
    comm::MpiRemoteMemory memory(MPI_COMM_WORLD, 2);
    protocol::SyncerWindow win(memory, f.windows);
    std::vector<protocol::UnitHeaders> h;
    std::vector<int64_t> consumed(2, 0);
    std::vector<float> got(n0);
    mpi::Backoff backoff(200);
    while (consumed[0] < kRounds || consumed[1] < kRounds) {
      win.poll(h);
      bool any = false;
      for (int u = 0; u < 2; ++u) {
        const int64_t seq = h[u].header(0, protocol::kOutSeq);
        if (seq <= consumed[u]) continue;
        const int64_t after = win.fetch(u, 0, h[u], got).seq_after;
        // Slow reader: give the learner every chance to interfere.
        std::this_thread::sleep_for(std::chrono::microseconds(300));
        ASSERT_EQ(after, seq) << "sequence changed during the read";
        ASSERT_EQ(checksum(got), static_cast<uint64_t>(h[u].header(0, protocol::kOutChecksum)));
        ASSERT_EQ(seq, consumed[u] + 1) << "a snapshot was overwritten before it was read";
        ASSERT_EQ(got[0], static_cast<float>(seq));  // content matches its sequence number
        win.ack(u, 0, seq);
        consumed[u] = seq;
        any = true;
      }
      any ? backoff.reset() : backoff.idle();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    win.close();
  } else {
    comm::MpiExposedMemory memory(MPI_COMM_WORLD, f.windows.bytes());
    protocol::LearnerWindow win(memory, f.windows);
    int64_t published = 0, refused = 0;
    mpi::Backoff backoff(100);
    while (published < kRounds) {
      if (!win.outbox_free(0)) {
        ++refused;
        backoff.idle();
        continue;
      }
      backoff.reset();
      std::vector<float> data(n0, static_cast<float>(published + 1));
      Rng rng(static_cast<uint64_t>(published));
      for (size_t i = 1; i < n0; ++i) data[i] = static_cast<float>(rng.normal());
      win.publish(0, data, {1, 1, published, 0});
      ++published;
    }
    EXPECT_GT(refused, 0) << "the learner was never held back: the test did not stress flow control";
    MPI_Barrier(MPI_COMM_WORLD);
    win.close();
  }
}

}  // namespace
}  // namespace ddiloco
