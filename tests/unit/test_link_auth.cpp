// The challenge–response of the secure link (ddiloco/link_auth.hpp): known answers for the
// primitives, then the exchange between two threads on 127.0.0.1 with honest peers, and with
// peers that replay, guess, lie about lengths or speak another mode, written byte by byte.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include "ddiloco/error.hpp"
#include "ddiloco/link.hpp"
#include "ddiloco/link_auth.hpp"
#include "ddiloco/secure_stream.hpp"
#include "stream_pair.hpp"

namespace {

using ddiloco::Error;
using ddiloco::comm::LinkRefused;
using ddiloco::comm::Stream;
using ddiloco::comm::TcpListener;
using namespace ddiloco::comm::auth;
using namespace stream_test;
using Bytes = std::vector<std::byte>;

constexpr uint8_t kMode = 1;
const std::string kSecret = "correct horse battery staple";

std::string hex(std::span<const std::byte> b) {
  std::string s;
  for (std::byte x : b) s += fmt::format("{:02x}", std::to_integer<unsigned>(x));
  return s;
}
Bytes bytes(std::string_view s) {
  const auto b = std::as_bytes(std::span(s.data(), s.size()));
  return Bytes(b.begin(), b.end());
}
void put_le32(Bytes& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(std::byte(v >> (8 * i)));
}

// Forwards to another stream, keeping a copy of what is written; can claim another channel
// binding than the stream's.
class Tap final : public Stream {
 public:
  explicit Tap(Stream& inner) : inner_(inner) {}
  void write_all(std::span<const std::byte> data, Deadline d) override {
    written.insert(written.end(), data.begin(), data.end());
    inner_.write_all(data, d);
  }
  void read_exact(std::span<std::byte> data, Deadline d) override { inner_.read_exact(data, d); }
  bool wait_readable(int ms, int wake_fd) override { return inner_.wait_readable(ms, wake_fd); }
  void shutdown() override { inner_.shutdown(); }
  const std::string& peer() const override { return inner_.peer(); }
  int fd() const override { return inner_.fd(); }
  Bytes channel_binding() override { return binding ? *binding : inner_.channel_binding(); }

  Bytes written;
  std::optional<Bytes> binding;

 private:
  Stream& inner_;
};

// The syncer's side in a thread: challenge, then the verdict. The future holds the payload.
std::future<std::string> syncer(Stream& s, const Key& key, bool admit = true,
                                std::string reason = "", uint8_t mode = kMode,
                                size_t max_payload = 1 << 20) {
  return std::async(std::launch::async, [&s, key, admit, reason, mode, max_payload] {
    const Answer a = challenge(s, key, mode, max_payload, in(5));
    verdict(s, key, a, admit, reason, in(5));
    return a.payload;
  });
}

// What the wire format says a challenge is: "ddLa", version 1, mode, N_s.
Bytes raw_challenge(uint8_t mode) {
  Bytes c = bytes("ddLa");
  put_le32(c, 1);
  c.push_back(std::byte{mode});
  c.resize(c.size() + 32, std::byte{0x5a});
  return c;
}
// Reads an answer off the wire: "ddLa", version, N_u, payload length, payload, MAC_u.
void skip_answer(Stream& s) {
  std::array<std::byte, 44> head;
  s.read_exact(head, in(5));
  uint32_t len = 0;
  for (int i = 0; i < 4; ++i) len |= std::to_integer<uint32_t>(head[40 + i]) << (8 * i);
  Bytes rest(len + 32);
  s.read_exact(rest, in(5));
}
uint8_t read_status(Stream& s) {
  std::array<std::byte, 5> head;
  s.read_exact(head, in(5));
  return std::to_integer<uint8_t>(head[0]);
}

template <typename F>
void expect_not_authenticated(F&& f, const std::string& text) {
  try {
    f();
    ADD_FAILURE() << "no NotAuthenticated thrown";
  } catch (const NotAuthenticated& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- primitives
TEST(LinkAuth, HmacSha256MatchesRfc4231TestCase2) {
  // Key "Jefe": HMAC pads a short key with zeros to the block size, so "Jefe" and "Jefe"
  // followed by 28 zero bytes are the same key.
  Key key{};
  std::copy_n(bytes("Jefe").begin(), 4, key.begin());
  EXPECT_EQ(hex(hmac(key, bytes("what do ya want for nothing?"))),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(LinkAuth, HkdfSha256MatchesRfc5869TestCase3) {
  // IKM = 22 bytes 0x0b, no salt, no info; the RFC's OKM has 42 bytes, we take 32.
  EXPECT_EQ(hex(derive_key(std::string(22, '\x0b'), "")),
            "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d");
  // The two keys of a run, pinned (computed apart with Python's hmac module): a change of
  // label or of derivation would split units and syncers of one release.
  EXPECT_EQ(hex(link_key("correct horse")),
            "616a17ce3f812efb5d29350c3bc31a77edfd66cfdba2e3f9f91fd29d42464d3d");
  EXPECT_EQ(hex(tls_psk("correct horse")),
            "d86afc343c7b776b9343e4890729d9634d664ce888940761e6cdc7d780c88acb");
  EXPECT_ERROR_WITH(derive_key("", "x"), "secret is empty");
}

TEST(LinkAuth, SameTellsMacsApart) {
  const Mac a = hmac(link_key(kSecret), bytes("m"));
  Mac b = a;
  EXPECT_TRUE(same(a, b));
  b[31] ^= std::byte{1};
  EXPECT_FALSE(same(a, b));
}

// ---------------------------------------------------------------- honest peers
TEST(LinkAuth, UnitWithTheSecretIsAdmittedAndItsHelloArrives) {
  TcpListener listener("127.0.0.1", 0);
  Pair p = tcp_pair(listener);
  ASSERT_TRUE(p.server);
  auto s = syncer(*p.server, link_key(kSecret));
  answer(*p.client, link_key(kSecret), kMode, "unit 3, step 120", in(5));
  EXPECT_EQ(s.get(), "unit 3, step 120");
}

TEST(LinkAuth, UnitIsAdmittedOverTls) {
  TcpListener listener("127.0.0.1", 0);
  Pair p = tcp_pair(listener);
  ASSERT_TRUE(p.server);
  const Key psk = tls_psk(kSecret);
  auto server =
      std::async(std::launch::async, [&] { return tls_server(std::move(p.server), psk, in(5)); });
  auto client = tls_client(std::move(p.client), psk, in(5));
  auto tls = server.get();
  auto s = syncer(*tls, link_key(kSecret));
  answer(*client, link_key(kSecret), kMode, std::string(100000, 'h'), in(5));
  EXPECT_EQ(s.get(), std::string(100000, 'h'));
}

TEST(LinkAuth, RefusedUnitGetsTheSyncersReason) {
  TcpListener listener("127.0.0.1", 0);
  Pair p = tcp_pair(listener);
  ASSERT_TRUE(p.server);
  auto s = syncer(*p.server, link_key(kSecret), false, "unit 3 is connected already");
  try {
    answer(*p.client, link_key(kSecret), kMode, "hello", in(5));
    ADD_FAILURE() << "no LinkRefused";
  } catch (const LinkRefused& e) {
    EXPECT_EQ(e.reason(), "unit 3 is connected already");
    EXPECT_EQ(std::string(e.what()), "auth link: the syncer at " + listener.address() +
                                         " refused the connection: unit 3 is connected already");
  }
  EXPECT_EQ(s.get(), "hello");
}

// ---------------------------------------------------------------- peers without the secret
TEST(LinkAuth, WrongSecretIsNotAuthenticatedAndTheUnitIsTold) {
  TcpListener listener("127.0.0.1", 0);
  Pair p = tcp_pair(listener);
  ASSERT_TRUE(p.server);
  auto s = syncer(*p.server, link_key(kSecret));
  EXPECT_ERROR_WITH(answer(*p.client, link_key("a guess"), kMode, "hello", in(5)), "wrong secret?");
  expect_not_authenticated([&] { s.get(); }, "did not prove it holds the run's secret");
}

// An eavesdropper on a plain TCP link records a unit's answer and plays it to the syncer
// on a connection of its own: the syncer's fresh nonce makes it worthless.
TEST(LinkAuth, ReplayedAnswerIsNotAuthenticated) {
  TcpListener listener("127.0.0.1", 0);
  Bytes recorded;
  {
    Pair p = tcp_pair(listener);
    ASSERT_TRUE(p.server);
    Tap tap(*p.client);
    auto s = syncer(*p.server, link_key(kSecret));
    answer(tap, link_key(kSecret), kMode, "hello", in(5));
    EXPECT_EQ(s.get(), "hello");
    recorded = tap.written;
  }
  Pair p = tcp_pair(listener);
  ASSERT_TRUE(p.server);
  auto s = syncer(*p.server, link_key(kSecret));
  Bytes challenge_bytes(41);
  p.client->read_exact(challenge_bytes, in(5));
  p.client->write_all(recorded, in(5));
  expect_not_authenticated([&] { s.get(); }, "wrong secret, or a replayed answer");
  EXPECT_EQ(read_status(*p.client), 2);  // "not authenticated"
}

// The MACs cover the channel binding: an answer made for one TLS session (here: a stream that
// claims another binding) does not verify on another, while equal bindings do.
TEST(LinkAuth, AnswerMadeForAnotherChannelIsNotAuthenticated) {
  TcpListener listener("127.0.0.1", 0);
  for (const bool equal : {true, false}) {
    Pair p = tcp_pair(listener);
    ASSERT_TRUE(p.server);
    Tap unit(*p.client), at_syncer(*p.server);
    unit.binding = Bytes(32, std::byte{0xaa});
    at_syncer.binding = Bytes(32, std::byte{equal ? uint8_t{0xaa} : uint8_t{0xbb}});
    auto s = syncer(at_syncer, link_key(kSecret));
    if (equal) {
      answer(unit, link_key(kSecret), kMode, "hello", in(5));
      EXPECT_EQ(s.get(), "hello");
    } else {
      EXPECT_ERROR_WITH(answer(unit, link_key(kSecret), kMode, "hello", in(5)), "wrong secret?");
      expect_not_authenticated([&] { s.get(); }, "did not prove");
    }
  }
}

// A syncer impostor that does not know the secret answers "admitted" (or "refused") with a MAC
// it had to guess: the unit believes neither.
TEST(LinkAuth, SyncerWithoutTheSecretCannotAdmitOrRefuse) {
  TcpListener listener("127.0.0.1", 0);
  for (const uint8_t status : {uint8_t{0}, uint8_t{1}}) {
    Pair p = tcp_pair(listener);
    ASSERT_TRUE(p.server);
    auto impostor = std::async(std::launch::async, [&] {
      p.server->write_all(raw_challenge(kMode), in(5));
      skip_answer(*p.server);
      Bytes v{std::byte{status}};
      put_le32(v, 2);
      for (std::byte b : bytes("no")) v.push_back(b);
      const Mac guess = hmac(link_key("a guess"), v);
      v.insert(v.end(), guess.begin(), guess.end());
      p.server->write_all(v, in(5));
    });
    EXPECT_ERROR_WITH(answer(*p.client, link_key(kSecret), kMode, "hello", in(5)),
                      "did not prove it holds the run's secret");
    impostor.get();
  }
}

// ---------------------------------------------------------------- malformed messages
TEST(LinkAuth, HugePayloadLengthIsRefusedBeforeItIsRead) {
  TcpListener listener("127.0.0.1", 0);
  Pair p = tcp_pair(listener);
  ASSERT_TRUE(p.server);
  auto s = syncer(*p.server, link_key(kSecret));
  Bytes ch(41);
  p.client->read_exact(ch, in(5));
  Bytes head = bytes("ddLa");
  put_le32(head, 1);
  head.resize(head.size() + 32, std::byte{1});
  put_le32(head, 1u << 31);  // and nothing follows
  const auto t0 = Clock::now();
  p.client->write_all(head, in(5));
  expect_not_authenticated([&] { s.get(); },
                           "hello of 2147483648 bytes, more than the 1048576 allowed");
  EXPECT_LT(since(t0), 2.0);  // at once, not at the deadline
  EXPECT_EQ(read_status(*p.client), 2);
}

TEST(LinkAuth, GarbageInsteadOfAnAnswerIsNotAuthenticated) {
  TcpListener listener("127.0.0.1", 0);
  Pair p = tcp_pair(listener);
  ASSERT_TRUE(p.server);
  auto s = syncer(*p.server, link_key(kSecret));
  Bytes ch(41);
  p.client->read_exact(ch, in(5));
  p.client->write_all(bytes("GET / HTTP/1.1\r\nHost: syncer.example\r\nAccept: */*\r\n\r\n"),
                      in(5));
  expect_not_authenticated([&] { s.get(); }, "sent no ddiloco link answer");
}

TEST(LinkAuth, UnitRefusesAChallengeOfAnotherMode) {
  TcpListener listener("127.0.0.1", 0);
  Pair p = tcp_pair(listener);
  ASSERT_TRUE(p.server);
  auto s = syncer(*p.server, link_key(kSecret), true, "", kMode + 1);
  EXPECT_ERROR_WITH(answer(*p.client, link_key(kSecret), kMode, "hello", in(5)),
                    "runs the link in mode 2, this unit in mode 1");
  p.client.reset();  // the unit hangs up; the syncer's read ends
  EXPECT_ERROR_WITH(s.get(), "closed by the peer");
}

TEST(LinkAuth, UnitRefusesAVerdictWithAHugeReasonBeforeReadingIt) {
  TcpListener listener("127.0.0.1", 0);
  Pair p = tcp_pair(listener);
  ASSERT_TRUE(p.server);
  auto impostor = std::async(std::launch::async, [&] {
    p.server->write_all(raw_challenge(kMode), in(5));
    skip_answer(*p.server);
    Bytes v{std::byte{1}};
    put_le32(v, 1u << 30);
    p.server->write_all(v, in(5));
  });
  const auto t0 = Clock::now();
  EXPECT_ERROR_WITH(answer(*p.client, link_key(kSecret), kMode, "hello", in(5)),
                    "malformed verdict");
  EXPECT_LT(since(t0), 2.0);
  impostor.get();
}

TEST(LinkAuth, UnitRefusesAPeerThatSendsNoChallenge) {
  TcpListener listener("127.0.0.1", 0);
  Pair p = tcp_pair(listener);
  ASSERT_TRUE(p.server);
  p.server->write_all(Bytes(41, std::byte{'x'}), in(1));
  EXPECT_ERROR_WITH(answer(*p.client, link_key(kSecret), kMode, "hello", in(5)),
                    "no ddiloco syncer");
}

}  // namespace
