// The secure link modes' transport (src/comm/stream_link.hpp) on 127.0.0.1, both ends in this
// process: admission, the operations, refusals, a wrong secret, losses, a unit that stalls,
// the pending-connection cap, and the unit's own check of every request against its window
// (a fake syncer that holds the secret sends requests outside it).
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/stream_link.hpp"
#include "ddiloco/link.hpp"
#include "ddiloco/link_auth.hpp"
#include "ddiloco/run_dir.hpp"
#include "ddiloco/secure_stream.hpp"

namespace {

using namespace ddiloco;
using namespace ddiloco::comm;
using Clock = std::chrono::steady_clock;

const std::string kSecret = "0123456789abcdef0123456789abcdef";

Deadline in(double s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// Calls accept_pending until one connection is pending (the syncer's loop, by hand).
std::optional<UnitListener::Pending> next_pending(SyncerEnd& s, double timeout_s = 5) {
  const Deadline end = in(timeout_s);
  while (Clock::now() < end) {
    auto p = s.accept_pending();
    if (!p.empty()) return p.front();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return std::nullopt;
}

// A unit connects in a thread while the test admits (or refuses) it; the unit's outcome.
struct Joining {
  std::thread thread;
  std::string error;
  bool refused = false;
  std::string reason;
  void start(UnitEnd& unit, const std::string& addr, const std::string& secret, const std::string& hello,
             double timeout_s = 5) {
    thread = std::thread([&, addr, secret, hello, timeout_s] {
      try {
        unit.connect(addr, secret, hello, timeout_s);
      } catch (const LinkRefused& e) {
        refused = true;
        reason = e.reason();
        error = e.what();
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
  }
  void join() { thread.join(); }
};

class StreamLink : public ::testing::TestWithParam<LinkMode> {
 protected:
  std::unique_ptr<SyncerEnd> syncer(int units = 2) {
    return listen_for_units(GetParam(), kSecret, "127.0.0.1", 0, units);
  }
  std::unique_ptr<UnitEnd> unit(size_t bytes) { return expose_to_syncer(GetParam(), bytes); }
  // A unit admitted as index u.
  void admit(SyncerEnd& s, UnitEnd& u, int index, const std::string& hello = "hi") {
    Joining j;
    j.start(u, s.address(), kSecret, hello);
    const auto p = next_pending(s);
    ASSERT_TRUE(p.has_value()) << "no pending connection";
    EXPECT_EQ(p->payload, hello);
    EXPECT_EQ(p->bytes, u.bytes());
    s.admit(p->id, index);
    j.join();
    ASSERT_EQ(j.error, "");
    ASSERT_TRUE(u.connected());
  }
};

TEST_P(StreamLink, AdmittedUnitIsReadAndWrittenOnlyThroughItsOwnChecks) {
  auto s = syncer();
  auto u = unit(4096);
  admit(*s, *u, 1);
  EXPECT_TRUE(s->connected(1));
  EXPECT_FALSE(s->connected(0));
  std::vector<std::byte> src(1000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::byte(i * 7);
  ASSERT_TRUE(s->put(1, 64, src));
  EXPECT_EQ(std::memcmp(u->base() + 64, src.data(), src.size()), 0);
  std::vector<std::byte> back(1000);
  ASSERT_TRUE(s->get(1, 64, back));
  EXPECT_EQ(back, src);
  ASSERT_TRUE(s->put_word(1, 8, 42));
  int64_t w = 0;
  ASSERT_TRUE(s->fetch_word(1, 8, w));
  EXPECT_EQ(w, 42);
  // Transfers the caller does not wait for.
  const auto t = s->start_get(1, 64, 1000);
  ASSERT_GT(t, 0);
  std::vector<std::byte> dst(1000);
  RemoteMemory::Status st;
  while ((st = s->test(t, dst)) == RemoteMemory::Status::running) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(st, RemoteMemory::Status::done);
  EXPECT_EQ(dst, src);
  // Out of the unit's memory: the caller's error, nothing sent.
  EXPECT_THROW(s->get(1, 4000, back), Error);
  EXPECT_THROW(s->put_word(1, 4092, 1), Error);
  // An absent unit: false, no wait.
  EXPECT_FALSE(s->get(0, 0, back));
}

TEST_P(StreamLink, RefusedUnitGetsTheReasonWrongSecretGetsNothing) {
  auto s = syncer();
  auto u = unit(64);
  Joining j;
  j.start(*u, s->address(), kSecret, "hello");
  const auto p = next_pending(*s);
  ASSERT_TRUE(p.has_value());
  s->refuse(p->id, "unit 3 is outside 0..1");
  j.join();
  EXPECT_TRUE(j.refused) << j.error;
  EXPECT_EQ(j.reason, "unit 3 is outside 0..1");
  EXPECT_FALSE(u->connected());

  Joining wrong;
  wrong.start(*u, s->address(), "not the secret", "hello");
  wrong.join();
  EXPECT_FALSE(wrong.refused);
  EXPECT_NE(wrong.error, "") << "a wrong secret was admitted";
  EXPECT_FALSE(next_pending(*s, 0.5).has_value()) << "a hello without the secret reached the caller";
  int64_t counted = 0;
  for (const auto& [reason, n] : s->take_refusals()) counted += n;
  EXPECT_EQ(counted, 1);
}

TEST_P(StreamLink, UnitThatGoesAwayIsLostAndTakesItsPlaceAgain) {
  auto s = syncer();
  auto u = unit(256);
  admit(*s, *u, 0);
  u->close();
  std::vector<UnitListener::Lost> lost;
  const Deadline end = in(5);
  while (lost.empty() && Clock::now() < end) {
    lost = s->take_lost();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].unit, 0);
  EXPECT_FALSE(s->connected(0));
  auto again = unit(256);
  admit(*s, *again, 0);
  EXPECT_TRUE(s->put_word(0, 0, 7));
}

TEST_P(StreamLink, SyncerThatDisconnectsIsSeenByTheUnit) {
  auto s = syncer();
  auto u = unit(256);
  admit(*s, *u, 0);
  s->disconnect(0);
  const auto lost = s->take_lost();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].reason, "closed");
  const Deadline end = in(5);
  while (u->connected() && Clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(u->connected());
  EXPECT_NE(u->lost_reason(), "");
}

INSTANTIATE_TEST_SUITE_P(Modes, StreamLink, ::testing::Values(LinkMode::authenticated, LinkMode::encrypted),
                         [](const auto& p) { return std::string(link_mode_name(p.param)); });

// ---------------------------------------------------------------- peers that misbehave

// A fake unit: authenticates with the secret, then never answers a request.
TEST(StreamLinkPeers, UnitThatNeverAnswersStallsThenTimesOutAndIsLost) {
  auto s = make_stream_syncer_link(false, kSecret, "127.0.0.1", 0, 1);
  s->set_op_timeout(0.5);
  std::unique_ptr<Stream> fake;
  std::thread t([&] {
    fake = tcp_connect(s->address(), in(5));
    std::string answer(8, '\0');
    const uint64_t bytes = 4096;
    std::memcpy(answer.data(), &bytes, 8);
    auth::answer(*fake, auth::link_key(kSecret), 1, answer + "hi", in(5));
  });
  const auto p = next_pending(*s);
  ASSERT_TRUE(p.has_value());
  s->admit(p->id, 0);
  t.join();
  std::vector<std::byte> dst(16);
  const auto t0 = Clock::now();
  EXPECT_FALSE(s->get(0, 0, dst));  // its patience passes: stalled
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 0.45);
  EXPECT_FALSE(s->get(0, 0, dst)) << "a unit with a stalled operation must fail new ones at once";
  std::vector<UnitListener::Lost> lost;
  const Deadline end = in(5);
  while (lost.empty() && Clock::now() < end) {
    lost = s->take_lost();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_NE(lost[0].reason.find("timed out"), std::string::npos) << lost[0].reason;
}

// A fake syncer that holds the secret asks for bytes outside the unit's window: the unit
// refuses, ends the connection and says why; its memory beyond the window is never read.
TEST(StreamLinkPeers, UnitRefusesARequestOutsideItsWindow) {
  TcpListener listener("127.0.0.1", 0);
  auto u = make_stream_unit_link(false, 128);
  std::thread t([&] {
    try {
      u->connect(listener.address(), kSecret, "hi", 5);
    } catch (...) {
    }
  });
  std::unique_ptr<Stream> peer;
  const Deadline end = in(5);
  while (!peer && Clock::now() < end) {
    peer = listener.accept();
    if (!peer) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(peer);
  const auth::Key key = auth::link_key(kSecret);
  const auth::Answer a = auth::challenge(*peer, key, 1, 1 << 16, in(5));
  auth::verdict(*peer, key, a, true, "", in(5));
  t.join();
  ASSERT_TRUE(u->connected());
  std::byte req[wire::kRequestBytes] = {};
  const uint32_t op = wire::kGet;
  const uint64_t offset = 64, size = 1 << 20;
  std::memcpy(req, &op, 4);
  std::memcpy(req + 8, &offset, 8);
  std::memcpy(req + 16, &size, 8);
  peer->write_all(req, in(5));
  std::byte b[1];
  EXPECT_THROW(peer->read_exact(b, in(5)), Error) << "the unit answered a request outside its window";
  const Deadline gone = in(5);
  while (u->connected() && Clock::now() < gone) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(u->connected());
  EXPECT_NE(u->lost_reason().find("outside the window"), std::string::npos) << u->lost_reason();
}

// Connections that send nothing hold at most kMaxPending places; the rest are closed at once
// and counted, and an honest unit still gets in once the deadline frees the places.
// After whatever a test did to the syncer's door: an honest unit still joins and is admitted.
void expect_an_honest_unit_joins(SyncerEnd& s) {
  auto u = make_stream_unit_link(false, 64);
  Joining j;
  j.start(*u, s.address(), kSecret, "hi");
  const auto p = next_pending(s);
  ASSERT_TRUE(p.has_value());
  s.admit(p->id, 0);
  j.join();
  EXPECT_EQ(j.error, "");
}

// The IPv4 socket address of "ip:port".
sockaddr_in ipv4(const std::string& address) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  const size_t colon = address.rfind(':');
  ::inet_pton(AF_INET, address.substr(0, colon).c_str(), &a.sin_addr);
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  return a;
}

// A silent TCP connection to `address` from the loopback address `source` (127.0.0.x): a
// stranger that connects and never speaks. Blocking connect; the listener's backlog takes it.
UniqueFd silent_from(const std::string& source, const std::string& address) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in from = ipv4(source + ":0"), to = ipv4(address);
  if (!fd || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&from), sizeof from) != 0 ||
      ::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) != 0)
    throw std::runtime_error("silent connection from " + source + ": " + std::strerror(errno));
  return fd;
}

// Ten strangers, ten connections each, in order: the first eight of each source wait, the
// last two of each of the first seven are over the per-source cap, and from the eighth
// source's ninth connection on the global cap (checked first) is full. Every silent one is dropped at the deadline, and an honest unit then joins.
TEST(StreamLinkPeers, SilentConnectionsAreCappedCountedAndDropped) {
  static_assert(kMaxPending == 8 * kMaxPendingPerSource, "the counts below assume it");
  auto s = make_stream_syncer_link(false, kSecret, "127.0.0.1", 0, 1);
  constexpr int kSources = 10, kEach = 10, kAll = kSources * kEach;
  std::vector<UniqueFd> silent;
  for (int src = 0; src < kSources; ++src)
    for (int i = 0; i < kEach; ++i) {
      silent.push_back(silent_from(fmt::format("127.0.0.{}", 10 + src), s->address()));
      // One at a time into the acceptor, so the order of arrival is the order above.
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  std::map<std::string, int64_t> counts;
  const Deadline end = in(kHandshakeS + 5);
  int64_t total = 0;
  while (total < kAll && Clock::now() < end) {
    for (const auto& [reason, n] : s->take_refusals()) {
      counts[reason] += n;
      total += n;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(total, kAll);
  EXPECT_EQ(counts[fmt::format("over the pending-connection cap of one address ({})", kMaxPendingPerSource)],
            7 * (kEach - kMaxPendingPerSource));
  EXPECT_EQ(counts[fmt::format("over the pending-connection cap ({})", kMaxPending)],
            kAll - kMaxPending - 7 * (kEach - kMaxPendingPerSource));
  expect_an_honest_unit_joins(*s);
}

// Out of descriptors, accept() fails while the connection stays queued: the acceptor counts
// it, waits instead of spinning, and once descriptors are free takes the queued connection and
// admits an honest unit. (It once threw out of the acceptor thread and ended the process.)
TEST(StreamLinkPeers, OutOfDescriptorsIsCountedAndTheAcceptorLivesOn) {
  auto s = make_stream_syncer_link(false, kSecret, "127.0.0.1", 0, 1);
  UniqueFd client(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));  // made while we can
  ASSERT_TRUE(client);
  sockaddr_in to = ipv4(s->address());
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  const int lowest_free = ::dup(0);  // the number the next descriptor would get
  ASSERT_GE(lowest_free, 0);
  ::close(lowest_free);
  rlimit low = old;
  low.rlim_cur = static_cast<rlim_t>(lowest_free);  // every number below it is taken
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  const int connected = ::connect(client.get(), reinterpret_cast<sockaddr*>(&to), sizeof to);
  const int connect_errno = errno;
  std::map<std::string, int64_t> counts;
  for (int i = 0; i < 20 && counts.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (const auto& [reason, n] : s->take_refusals()) counts[reason] += n;
  }
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  ASSERT_EQ(connected, 0) << std::strerror(connect_errno);
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts.begin()->first.rfind("cannot accept (", 0), 0u) << counts.begin()->first;
  client = UniqueFd();  // the queued connection is accepted now, and ends at once
  expect_an_honest_unit_joins(*s);
}

// A unit that gives up waiting for its verdict hangs up and retries on a new connection. The
// old one is dropped and counted, not admitted, so the retry is not taken for a second process.
TEST(StreamLinkPeers, ConnectionWhoseUnitGaveUpIsDroppedNotAdmitted) {
  auto s = make_stream_syncer_link(false, kSecret, "127.0.0.1", 0, 1);
  auto u = make_stream_unit_link(false, 64);
  Joining first;
  first.start(*u, s->address(), kSecret, "hi", 0.5);  // nobody judges it in time
  first.join();
  EXPECT_NE(first.error, "");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // its FIN arrives
  EXPECT_TRUE(s->accept_pending().empty());
  const auto refusals = s->take_refusals();
  ASSERT_EQ(refusals.size(), 1u);
  EXPECT_EQ(refusals[0].first, "gone before its verdict");
  expect_an_honest_unit_joins(*s);
}

// Out of descriptors at admission: admit() throws and leaves nothing half-admitted. The
// connection can still be refused, the unit hears why, and the unit is absent.
TEST(StreamLinkPeers, AdmissionThatFailsLeavesTheConnectionToRefuse) {
  auto s = make_stream_syncer_link(false, kSecret, "127.0.0.1", 0, 1);
  auto u = make_stream_unit_link(false, 64);
  Joining j;
  j.start(*u, s->address(), kSecret, "hi");
  const auto p = next_pending(*s);
  ASSERT_TRUE(p.has_value());
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  const int lowest_free = ::dup(0);
  ASSERT_GE(lowest_free, 0);
  ::close(lowest_free);
  rlimit low = old;
  low.rlim_cur = static_cast<rlim_t>(lowest_free);  // admit's eventfd cannot be made
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::string error;
  try {
    s->admit(p->id, 0);
  } catch (const Error& e) {
    error = e.what();
  }
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  EXPECT_NE(error.find("eventfd"), std::string::npos) << error;
  EXPECT_FALSE(s->connected(0));
  s->refuse(p->id, "the syncer could not take it");
  j.join();
  EXPECT_TRUE(j.refused) << j.error;
  EXPECT_EQ(j.reason, "the syncer could not take it");
  EXPECT_FALSE(u->connected());
}

}  // namespace
