// TCP streams with deadlines and TLS 1.3 with a pre-shared key (ddiloco/secure_stream.hpp),
// between two threads of this process on 127.0.0.1.
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "ddiloco/error.hpp"
#include "ddiloco/secure_stream.hpp"
#include "stream_pair.hpp"

namespace {

using ddiloco::Error;
using ddiloco::comm::Stream;
using ddiloco::comm::tcp_connect;
using ddiloco::comm::TcpListener;
using ddiloco::comm::tls_client;
using ddiloco::comm::tls_server;
using namespace stream_test;

std::vector<std::byte> pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = std::byte(x >> 24);
  }
  return v;
}

std::vector<std::byte> psk_of(uint8_t fill) { return std::vector<std::byte>(32, std::byte{fill}); }

// ---------------------------------------------------------------- TCP
TEST(SecureStream, TcpCarriesBytesBothWaysAndNamesThePeer) {
  TcpListener listener("127.0.0.1", 0);
  ASSERT_EQ(listener.address().rfind("127.0.0.1:", 0), 0u) << listener.address();
  Pair p = tcp_pair(listener);
  ASSERT_TRUE(p.server);
  EXPECT_EQ(p.client->peer(), listener.address());
  EXPECT_EQ(p.server->peer().rfind("127.0.0.1:", 0), 0u);
  EXPECT_TRUE(p.client->channel_binding().empty());
  // More than the socket buffers hold, so that both ends wait in poll() at some point.
  const auto up = pattern(4 << 20, 1), down = pattern(3 << 20, 2);
  auto echo = std::async(std::launch::async, [&] {
    std::vector<std::byte> got(up.size());
    p.server->read_exact(got, in(10));
    p.server->write_all(down, in(10));
    return got;
  });
  p.client->write_all(up, in(10));
  std::vector<std::byte> back(down.size());
  p.client->read_exact(back, in(10));
  EXPECT_TRUE(echo.get() == up);
  EXPECT_TRUE(back == down);
}

TEST(SecureStream, ReadFromAClosedPeerThrows) {
  TcpListener listener("127.0.0.1", 0);
  Pair p = tcp_pair(listener);
  ASSERT_TRUE(p.server);
  p.server->write_all(pattern(3, 0), in(1));
  p.server.reset();
  std::array<std::byte, 8> buf;
  const auto t0 = Clock::now();
  EXPECT_ERROR_WITH(p.client->read_exact(buf, in(5)), "closed by the peer");
  EXPECT_LT(since(t0), 1.0);
}

TEST(SecureStream, ReadThrowsWhenTheDeadlinePasses) {
  TcpListener listener("127.0.0.1", 0);
  Pair p = tcp_pair(listener);
  ASSERT_TRUE(p.server);
  std::array<std::byte, 1> buf;
  const auto t0 = Clock::now();
  EXPECT_ERROR_WITH(p.client->read_exact(buf, in(0.2)), "timed out");
  EXPECT_GE(since(t0), 0.19);
  EXPECT_LT(since(t0), 1.0);
}

TEST(SecureStream, ShutdownFromAnotherThreadEndsABlockedRead) {
  TcpListener listener("127.0.0.1", 0);
  Pair p = tcp_pair(listener);
  ASSERT_TRUE(p.server);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    p.client->shutdown();
  });
  std::array<std::byte, 1> buf;
  const auto t0 = Clock::now();
  EXPECT_ERROR_WITH(p.client->read_exact(buf, in(10)), "shut down");
  stopper.join();
  EXPECT_LT(since(t0), 2.0);
  p.client->shutdown();  // idempotent
  EXPECT_ERROR_WITH(p.client->write_all(pattern(1, 0), in(1)), "shut down");
}

TEST(SecureStream, WaitReadableSleepsUntilDataOrTheWakeFd) {
  TcpListener listener("127.0.0.1", 0);
  Pair p = tcp_pair(listener);
  ASSERT_TRUE(p.server);
  auto t0 = Clock::now();
  EXPECT_FALSE(p.client->wait_readable(100));
  EXPECT_GE(since(t0), 0.09);  // it waited

  // The wake fd ends the wait early; the stream itself is still not readable.
  const int wake = ::eventfd(0, EFD_CLOEXEC);
  ASSERT_GE(wake, 0);
  const uint64_t one = 1;
  ASSERT_EQ(::write(wake, &one, sizeof one), 8);
  t0 = Clock::now();
  EXPECT_FALSE(p.client->wait_readable(5000, wake));
  EXPECT_LT(since(t0), 1.0);
  ::close(wake);

  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    p.server->write_all(pattern(1, 0), in(1));
  });
  t0 = Clock::now();
  EXPECT_TRUE(p.client->wait_readable(5000));
  EXPECT_LT(since(t0), 2.0);
  writer.join();
  p.server.reset();  // end of stream counts as readable too
  std::array<std::byte, 1> buf;
  p.client->read_exact(buf, in(1));
  EXPECT_TRUE(p.client->wait_readable(5000));
}

TEST(SecureStream, ConnectWhereNothingListensThrowsAtOnce) {
  std::string address;
  {
    TcpListener gone("127.0.0.1", 0);
    address = gone.address();
  }
  const auto t0 = Clock::now();
  EXPECT_ERROR_WITH(tcp_connect(address, in(10)), address);
  EXPECT_LT(since(t0), 1.0);
  EXPECT_ERROR_WITH(tcp_connect("127.0.0.1", in(1)), "malformed address");
  EXPECT_ERROR_WITH(tcp_connect("127.0.0.1:99999", in(1)), "malformed port");
  EXPECT_ERROR_WITH(TcpListener("192.0.2.1", 0), "cannot listen");
}

// ---------------------------------------------------------------- TLS
struct TlsPair {
  std::unique_ptr<Stream> client, server;
};

TlsPair tls_pair(TcpListener& listener, uint8_t client_psk = 7, uint8_t server_psk = 7) {
  Pair p = tcp_pair(listener);
  auto server = std::async(std::launch::async, [&] {
    return tls_server(std::move(p.server), psk_of(server_psk), in(5));
  });
  TlsPair t;
  t.client = tls_client(std::move(p.client), psk_of(client_psk), in(5));
  t.server = server.get();
  return t;
}

TEST(SecureStream, TlsCarriesAMebibyteEachWay) {
  TcpListener listener("127.0.0.1", 0);
  TlsPair t = tls_pair(listener);
  EXPECT_EQ(t.client->peer(), listener.address());
  const auto up = pattern(1 << 20, 3), down = pattern(1 << 20, 4);
  // Both write before they read: the stream must not need the other side to read first...
  // up to what the socket buffers and TLS hold, so the server reads in a thread.
  auto echo = std::async(std::launch::async, [&] {
    std::vector<std::byte> got(up.size());
    t.server->read_exact(got, in(10));
    t.server->write_all(down, in(10));
    return got;
  });
  t.client->write_all(up, in(10));
  std::vector<std::byte> back(down.size());
  t.client->read_exact(back, in(10));
  EXPECT_TRUE(echo.get() == up);
  EXPECT_TRUE(back == down);
}

TEST(SecureStream, TlsWaitReadableSeesBytesOpenSslAlreadyHolds) {
  TcpListener listener("127.0.0.1", 0);
  TlsPair t = tls_pair(listener);
  t.server->write_all(pattern(2, 5), in(1));  // one record
  std::array<std::byte, 1> buf;
  t.client->read_exact(buf, in(1));  // the whole record left the socket; one byte is buffered
  pollfd p{t.client->fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 0);  // so poll() alone would not see it
  EXPECT_TRUE(t.client->wait_readable(0));
  t.client->read_exact(buf, in(1));
  EXPECT_EQ(buf[0], pattern(2, 5)[1]);
  EXPECT_FALSE(t.client->wait_readable(50));
}

TEST(SecureStream, TlsChannelBindingIsSharedByTheEndsAndNewPerConnection) {
  TcpListener listener("127.0.0.1", 0);
  TlsPair a = tls_pair(listener);
  TlsPair b = tls_pair(listener);
  const auto a_client = a.client->channel_binding();
  EXPECT_EQ(a_client.size(), 32u);
  EXPECT_TRUE(a_client == a.server->channel_binding());
  EXPECT_TRUE(b.client->channel_binding() == b.server->channel_binding());
  EXPECT_FALSE(a_client == b.client->channel_binding());  // fresh (EC)DHE per connection
}

TEST(SecureStream, TlsWithAWrongPskFailsOnBothSidesAtOnce) {
  TcpListener listener("127.0.0.1", 0);
  Pair p = tcp_pair(listener);
  ASSERT_TRUE(p.server);
  const auto t0 = Clock::now();
  auto server = std::async(std::launch::async,
                           [&] { return tls_server(std::move(p.server), psk_of(1), in(10)); });
  EXPECT_ERROR_WITH(tls_client(std::move(p.client), psk_of(2), in(10)), listener.address());
  EXPECT_ERROR_WITH(server.get(), "TLS link: handshake with 127.0.0.1:");
  EXPECT_LT(since(t0), 2.0);
}

TEST(SecureStream, TlsServerThrowsOnPlainTcpGarbage) {
  TcpListener listener("127.0.0.1", 0);
  Pair p = tcp_pair(listener);
  ASSERT_TRUE(p.server);
  const std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  p.client->write_all(std::as_bytes(std::span(http)), in(1));
  const auto t0 = Clock::now();
  EXPECT_ERROR_WITH(tls_server(std::move(p.server), psk_of(1), in(10)), "handshake with");
  EXPECT_LT(since(t0), 2.0);
  EXPECT_ERROR_WITH(tls_server(tcp_pair(listener).server, pattern(16, 0), in(1)),
                    "must be 32 bytes");
}

// A TLS write to a peer that is gone is an Error, not a SIGPIPE that kills the process.
TEST(SecureStream, TlsWriteToAVanishedPeerThrows) {
  TcpListener listener("127.0.0.1", 0);
  TlsPair t = tls_pair(listener);
  t.server.reset();
  const auto chunk = pattern(1 << 20, 6);
  EXPECT_THROW(for (int i = 0; i < 64; ++i) t.client->write_all(chunk, in(5)), Error);
  std::array<std::byte, 1> buf;
  EXPECT_ERROR_WITH(t.client->read_exact(buf, in(5)), "TLS link: read from");
}

// A server that ignores the PSK and authenticates with a certificate instead (anyone can make
// one) must not get a session: the client trusts no certificate.
TEST(SecureStream, TlsClientRefusesAServerWithACertificate) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* cert = X509_new();
  ASSERT_TRUE(key && cert);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert), 0);
  X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
  X509_set_pubkey(cert, key);
  X509_NAME_add_entry_by_txt(X509_get_subject_name(cert), "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("impostor"), -1, -1, 0);
  X509_set_issuer_name(cert, X509_get_subject_name(cert));
  ASSERT_GT(X509_sign(cert, key, EVP_sha256()), 0);
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  ASSERT_EQ(SSL_CTX_use_certificate(ctx, cert), 1);
  ASSERT_EQ(SSL_CTX_use_PrivateKey(ctx, key), 1);

  TcpListener listener("127.0.0.1", 0);
  Pair p = tcp_pair(listener);
  ASSERT_TRUE(p.server);
  auto impostor = std::async(std::launch::async, [&] {
    // OpenSSL's socket BIO writes with write(2): a client that hung up would raise SIGPIPE
    // here (a synchronous signal, so blocking it in this thread is enough).
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, p.server->fd());  // non-blocking: poll between the steps
    int rc = 0;
    for (const auto until = in(5); Clock::now() < until;) {
      rc = SSL_accept(ssl);
      const int e = SSL_get_error(ssl, rc);
      if (rc == 1 || (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)) break;
      p.server->wait_readable(100);
    }
    SSL_free(ssl);
    return rc;
  });
  EXPECT_ERROR_WITH(tls_client(std::move(p.client), psk_of(1), in(5)), "handshake with");
  EXPECT_NE(impostor.get(), 1);
  SSL_CTX_free(ctx);
  X509_free(cert);
  EVP_PKEY_free(key);
}

}  // namespace
