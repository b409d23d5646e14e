// TCP streams with deadlines, and TLS 1.3 over them keyed by an external PSK (secure_stream.hpp).
#include "ddiloco/secure_stream.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>

#include "comm/ucx_common.hpp"  // addresses (parse_address, resolve, format_address), poll_ms
#include "ddiloco/error.hpp"

namespace ddiloco::comm {

namespace {

using ucx::format_address;

// The address helpers are shared with the UCX link and say so in their messages; this link's
// messages name their own layer instead.
std::string without_ucx_prefix(const char* message) {
  std::string m = message;
  constexpr std::string_view prefix = "UCX link: ";
  if (m.starts_with(prefix)) m.erase(0, prefix.size());
  return m;
}

// Sleeps in poll() until `fd` is ready for `events` or the deadline passes (Error). POLLERR and
// POLLHUP end the wait too: the next read or write reports what happened.
void wait_for(int fd, short events, Deadline deadline, const std::string& peer, const char* what) {
  for (;;) {
    if (std::chrono::steady_clock::now() >= deadline) fail("{} {}: timed out", what, peer);
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, ucx::poll_ms(deadline, INT_MAX));
    if (rc > 0) return;
    if (rc < 0 && errno != EINTR) fail("{} {}: poll: {}", what, peer, std::strerror(errno));
  }
}

// Up to `ms` (< 0: no limit) for `fd` or `wake_fd` to become readable; true when `fd` is.
bool poll_readable(int fd, int ms, int wake_fd) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    pollfd p[2] = {{fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    const int rc = ::poll(p, wake_fd >= 0 ? 2 : 1, ms < 0 ? -1 : ucx::poll_ms(until, INT_MAX));
    if (rc > 0) return p[0].revents != 0;
    if (rc == 0 || errno != EINTR) return false;
    if (ms >= 0 && std::chrono::steady_clock::now() >= until) return false;
  }
}

void set_int(int fd, int level, int name, int value, const char* what) {
  if (::setsockopt(fd, level, name, &value, sizeof value) != 0)
    fail("TCP link: setsockopt {}: {}", what, std::strerror(errno));
}

// A peer that vanishes without a FIN (power loss, cable, a frozen VM) is noticed within
// ~5 s (2 s idle + 3 probes 1 s apart) by any blocking call on the stream, whatever its
// deadline; small messages (the handshake, control words) are not held back by Nagle.
void tune(int fd) {
  set_int(fd, SOL_SOCKET, SO_KEEPALIVE, 1, "SO_KEEPALIVE");
  set_int(fd, IPPROTO_TCP, TCP_KEEPIDLE, 2, "TCP_KEEPIDLE");
  set_int(fd, IPPROTO_TCP, TCP_KEEPINTVL, 1, "TCP_KEEPINTVL");
  set_int(fd, IPPROTO_TCP, TCP_KEEPCNT, 3, "TCP_KEEPCNT");
  set_int(fd, IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY");
}

class TcpStream final : public Stream {
 public:
  TcpStream(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  ~TcpStream() override { ::close(fd_); }

  void write_all(std::span<const std::byte> data, Deadline deadline) override {
    while (!data.empty()) {
      // MSG_NOSIGNAL: a peer that is gone is an Error here, not a SIGPIPE for the process.
      const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n > 0) {
        data = data.subspan(static_cast<size_t>(n));
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        wait_for(fd_, POLLOUT, deadline, peer_, "TCP link: write to");
      } else if (errno != EINTR) {
        fail("TCP link: write to {}: {}", peer_,
             shut_ ? "the stream was shut down" : std::strerror(errno));
      }
    }
  }

  void read_exact(std::span<std::byte> data, Deadline deadline) override {
    while (!data.empty()) {
      const ssize_t n = ::recv(fd_, data.data(), data.size(), 0);
      if (n > 0) {
        data = data.subspan(static_cast<size_t>(n));
      } else if (n == 0 || shut_) {
        fail("TCP link: read from {}: {}", peer_,
             shut_ ? "the stream was shut down" : "closed by the peer");
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        wait_for(fd_, POLLIN, deadline, peer_, "TCP link: read from");
      } else if (errno != EINTR) {
        fail("TCP link: read from {}: {}", peer_, std::strerror(errno));
      }
    }
  }

  bool wait_readable(int ms, int wake_fd) override { return poll_readable(fd_, ms, wake_fd); }
  void shutdown() override {
    shut_ = true;
    ::shutdown(fd_, SHUT_RDWR);
  }
  const std::string& peer() const override { return peer_; }
  int fd() const override { return fd_; }
  std::vector<std::byte> channel_binding() override { return {}; }

 private:
  int fd_;
  std::string peer_;
  std::atomic<bool> shut_{false};
};

// The address in `text` resolved, or Error naming it.
sockaddr_storage parse(const std::string& text) {
  try {
    return ucx::parse_address(text);
  } catch (const Error& e) {
    fail("TCP link: cannot connect to '{}': {}", text, without_ucx_prefix(e.what()));
  }
}

}  // namespace

TcpListener::TcpListener(const std::string& ip, int port, int backlog) {
  sockaddr_storage addr;
  try {
    addr = ucx::resolve(ip, port, true);
  } catch (const Error& e) {
    fail("TCP link: cannot listen on {}:{}: {}", ip, port, without_ucx_prefix(e.what()));
  }
  const std::string where = fmt::format("{}:{}", ip, port);
  fd_ = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) fail("TCP link: cannot listen on {}: socket: {}", where, std::strerror(errno));
  const int one = 1;
  // A restarted syncer binds its port again at once, even while old connections linger.
  if (::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      ::bind(fd_, reinterpret_cast<const sockaddr*>(&addr), ucx::sockaddr_len(addr)) != 0 ||
      ::listen(fd_, backlog) != 0) {
    const int err = errno;
    ::close(fd_);
    fail("TCP link: cannot listen on {}: {}", where, std::strerror(err));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  address_ = format_address(bound);
}

TcpListener::~TcpListener() { ::close(fd_); }

std::unique_ptr<Stream> TcpListener::accept() {
  for (;;) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    const int fd =
        ::accept4(fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      auto stream = std::make_unique<TcpStream>(fd, format_address(addr));
      tune(fd);
      return stream;
    }
    switch (errno) {
      case EINTR:
        continue;
      // Nothing waits, or the connection died in the queue (accept(2): Linux passes the
      // network errors of the new socket on to accept): nothing to hand out now.
      case EAGAIN:
      case ECONNABORTED:
      case EPROTO:
      case ENETDOWN:
      case ENOPROTOOPT:
      case EHOSTDOWN:
      case ENONET:
      case EHOSTUNREACH:
      case EOPNOTSUPP:
      case ENETUNREACH:
        return nullptr;
      default:
        fail("TCP link: accept on {}: {}", address_, std::strerror(errno));
    }
  }
}

std::unique_ptr<Stream> tcp_connect(const std::string& address, Deadline deadline) {
  const sockaddr_storage addr = parse(address);
  const std::string peer = format_address(addr);
  const int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) fail("TCP link: cannot connect to {}: socket: {}", peer, std::strerror(errno));
  auto stream = std::make_unique<TcpStream>(fd, peer);  // closes fd on every path below
  tune(fd);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), ucx::sockaddr_len(addr)) != 0) {
    if (errno != EINPROGRESS && errno != EINTR)
      fail("TCP link: cannot connect to {}: {}", peer, std::strerror(errno));
    wait_for(fd, POLLOUT, deadline, peer, "TCP link: connect to");
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0)
      fail("TCP link: cannot connect to {}: {}{}", peer, std::strerror(err),
           err == ECONNREFUSED ? " (is it listening there?)" : "");
  }
  return stream;
}

// ---------------------------------------------------------------- TLS 1.3 with an external PSK
namespace {

// Both suites hash with SHA-256, the hash of the PSK's session below: a PSK can only be used
// with a suite of its own hash (RFC 8446 §4.2.11), and a server preferring a SHA-384 suite
// would ignore the PSK and then fail for want of a certificate.
constexpr const char* kSuites = "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256";
constexpr unsigned char kPskCipher[2] = {0x13, 0x01};  // TLS_AES_128_GCM_SHA256
constexpr std::string_view kPskIdentity = "ddiloco-link-psk-v1";
constexpr std::string_view kExporterLabel = "EXPORTER-ddiloco-link-auth";
constexpr size_t kPskBytes = 32;

// ---- a socket BIO that never raises SIGPIPE
// OpenSSL's own socket BIO writes with write(2): a peer that is gone would kill the process
// with SIGPIPE. This one sends with MSG_NOSIGNAL and is otherwise the same: the retry flags on
// EAGAIN, and end of stream reported through BIO_eof, which OpenSSL 3 checks to tell an
// unexpected EOF from a socket error.
int fd_of(BIO* b) { return static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(b))); }

int bio_write(BIO* b, const char* in, size_t len, size_t* done) {
  BIO_clear_retry_flags(b);
  const ssize_t n = ::send(fd_of(b), in, len, MSG_NOSIGNAL);
  if (n >= 0) {
    *done = static_cast<size_t>(n);
    return 1;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) BIO_set_retry_write(b);
  return 0;
}

int bio_read(BIO* b, char* out, size_t len, size_t* done) {
  BIO_clear_retry_flags(b);
  const ssize_t n = ::recv(fd_of(b), out, len, 0);
  if (n > 0) {
    *done = static_cast<size_t>(n);
    return 1;
  }
  if (n == 0)
    BIO_set_flags(b, BIO_FLAGS_IN_EOF);
  else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
    BIO_set_retry_read(b);
  return 0;
}

long bio_ctrl(BIO* b, int cmd, long, void*) {
  if (cmd == BIO_CTRL_FLUSH) return 1;  // nothing is buffered here
  if (cmd == BIO_CTRL_EOF) return BIO_test_flags(b, BIO_FLAGS_IN_EOF) != 0;
  return 0;
}

int bio_create(BIO* b) {
  BIO_set_init(b, 1);
  return 1;
}

const BIO_METHOD* socket_method() {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "ddiloco socket");
    if (m == nullptr || !BIO_meth_set_write_ex(m, bio_write) ||
        !BIO_meth_set_read_ex(m, bio_read) || !BIO_meth_set_ctrl(m, bio_ctrl) ||
        !BIO_meth_set_create(m, bio_create))
      fail("TLS link: cannot create the socket BIO method");
    return m;
  }();
  return method;
}

// ---- the PSK as an SSL_SESSION (the external PSK API of OpenSSL ≥ 1.1.1)
struct Psk {
  std::array<unsigned char, kPskBytes> key{};
};

SSL_SESSION* psk_session(SSL* ssl) {
  const auto* psk = static_cast<const Psk*>(SSL_get_app_data(ssl));
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, kPskCipher);
  SSL_SESSION* s = SSL_SESSION_new();
  if (s == nullptr || cipher == nullptr ||
      !SSL_SESSION_set1_master_key(s, psk->key.data(), kPskBytes) ||
      !SSL_SESSION_set_cipher(s, cipher) || !SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION)) {
    SSL_SESSION_free(s);
    return nullptr;
  }
  return s;
}

// Client: offers the PSK. `md` is set on the second call after a HelloRetryRequest; the PSK is
// usable only if its hash is the negotiated one (always so with kSuites, checked anyway).
int use_psk(SSL* ssl, const EVP_MD* md, const unsigned char** id, size_t* id_len,
            SSL_SESSION** sess) {
  *sess = nullptr;
  *id = nullptr;
  *id_len = 0;
  SSL_SESSION* s = psk_session(ssl);
  if (s == nullptr) return 0;
  const EVP_MD* ours = SSL_CIPHER_get_handshake_digest(SSL_SESSION_get0_cipher(s));
  if (md != nullptr && (ours == nullptr || EVP_MD_get_type(md) != EVP_MD_get_type(ours))) {
    SSL_SESSION_free(s);
    return 1;  // no PSK: the handshake then fails, as it must
  }
  *sess = s;  // OpenSSL takes ownership
  *id = reinterpret_cast<const unsigned char*>(kPskIdentity.data());
  *id_len = kPskIdentity.size();
  return 1;
}

// Server: the PSK for our identity. The binder (RFC 8446 §4.2.11.2) then proves the client
// holds the same key; a wrong key fails the handshake with "binder does not verify".
int find_psk(SSL* ssl, const unsigned char* id, size_t id_len, SSL_SESSION** sess) {
  *sess = nullptr;
  if (std::string_view(reinterpret_cast<const char*>(id), id_len) != kPskIdentity) return 1;
  *sess = psk_session(ssl);
  return *sess != nullptr;
}

// The reason of the last OpenSSL or socket error, for one line of a message.
std::string tls_reason(int ssl_error, int saved_errno) {
  const unsigned long e = ERR_peek_last_error();
  if (ERR_GET_REASON(e) == SSL_R_UNEXPECTED_EOF_WHILE_READING ||
      (ssl_error == SSL_ERROR_SYSCALL && e == 0 && saved_errno == 0) ||
      ssl_error == SSL_ERROR_ZERO_RETURN)
    return "closed by the peer";
  if (e != 0) {
    char text[256];
    ERR_error_string_n(e, text, sizeof text);
    return text;
  }
  if (ssl_error == SSL_ERROR_SYSCALL) return std::strerror(saved_errno);
  return fmt::format("SSL error {}", ssl_error);
}

class TlsStream final : public Stream {
 public:
  TlsStream(std::unique_ptr<Stream> tcp, SSL* ssl) : tcp_(std::move(tcp)), ssl_(ssl) {}
  ~TlsStream() override {
    SSL_free(ssl_);  // frees the BIO; tcp_ then closes the socket
    OPENSSL_cleanse(psk_.key.data(), psk_.key.size());
  }

  Psk& psk() { return psk_; }

  void handshake(Deadline deadline) {
    drive([&] { return SSL_do_handshake(ssl_); }, deadline, "TLS link: handshake with");
    // A server that ignored our PSK and sent a certificate is refused by SSL_VERIFY_PEER
    // already (we trust no certificate); this also catches any other way round the PSK.
    if (SSL_session_reused(ssl_) != 1)
      fail("TLS link: handshake with {}: the peer did not use the pre-shared key", peer());
    OPENSSL_cleanse(psk_.key.data(), psk_.key.size());  // needed no more
  }

  void write_all(std::span<const std::byte> data, Deadline deadline) override {
    while (!data.empty()) {
      size_t n = 0;
      drive([&] { return SSL_write_ex(ssl_, data.data(), data.size(), &n); }, deadline,
            "TLS link: write to");
      data = data.subspan(n);
    }
  }

  void read_exact(std::span<std::byte> data, Deadline deadline) override {
    while (!data.empty()) {
      size_t n = 0;
      drive([&] { return SSL_read_ex(ssl_, data.data(), data.size(), &n); }, deadline,
            "TLS link: read from");
      data = data.subspan(n);
    }
  }

  // Bytes OpenSSL already holds are not on the socket any more: poll() would not see them.
  bool wait_readable(int ms, int wake_fd) override {
    if (SSL_pending(ssl_) > 0 || SSL_has_pending(ssl_)) return true;
    return poll_readable(fd(), ms, wake_fd);
  }
  // The socket only: SSL state belongs to the thread using the stream.
  void shutdown() override {
    shut_ = true;
    tcp_->shutdown();
  }
  const std::string& peer() const override { return tcp_->peer(); }
  int fd() const override { return tcp_->fd(); }

  std::vector<std::byte> channel_binding() override {
    std::vector<std::byte> out(32);
    if (SSL_export_keying_material(ssl_, reinterpret_cast<unsigned char*>(out.data()), out.size(),
                                   kExporterLabel.data(), kExporterLabel.size(), nullptr, 0,
                                   0) != 1)
      fail("TLS link: cannot export keying material of the session with {}", peer());
    return out;
  }

 private:
  // Runs `call` (an SSL_* call returning 1 on success) until it succeeds, sleeping in poll()
  // whenever OpenSSL waits for the socket. Error naming the peer on anything else.
  template <typename Call>
  void drive(Call call, Deadline deadline, const char* what) {
    for (;;) {
      ERR_clear_error();  // SSL_get_error reads the thread's error queue
      const int rc = call();
      if (rc == 1) return;
      const int saved = errno;
      const int e = SSL_get_error(ssl_, rc);
      if (e == SSL_ERROR_WANT_READ) {
        wait_for(fd(), POLLIN, deadline, peer(), what);
      } else if (e == SSL_ERROR_WANT_WRITE) {
        wait_for(fd(), POLLOUT, deadline, peer(), what);
      } else {
        const std::string reason = shut_ ? "the stream was shut down" : tls_reason(e, saved);
        ERR_clear_error();
        fail("{} {}: {}", what, peer(), reason);
      }
    }
  }

  std::unique_ptr<Stream> tcp_;
  SSL* ssl_;
  Psk psk_;
  std::atomic<bool> shut_{false};
};

using CtxPtr = std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)>;

// One context per connection: it holds only settings, and nothing is shared between threads.
CtxPtr make_context(bool server, const std::string& peer) {
  CtxPtr ctx(SSL_CTX_new(TLS_method()), &SSL_CTX_free);
  if (!ctx || !SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION) ||
      !SSL_CTX_set_max_proto_version(ctx.get(), TLS1_3_VERSION) ||
      !SSL_CTX_set_ciphersuites(ctx.get(), kSuites) || !SSL_CTX_set_num_tickets(ctx.get(), 0))
    fail("TLS link: cannot set up TLS for {}: {}", peer, tls_reason(SSL_ERROR_SSL, 0));
  // No tickets: every connection starts from the PSK with a fresh (EC)DHE exchange.
  // SSL_OP_ALLOW_NO_DHE_KEX stays off: the PSK is only ever used with (EC)DHE (psk_dhe_ke).
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_TICKET);
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (server) {
    SSL_CTX_set_psk_find_session_callback(ctx.get(), find_psk);
  } else {
    // A server's certificate is verified against no trusted one: any certificate fails. (Not
    // on the server: SSL_VERIFY_PEER there wants a session id context for PSK sessions, and no
    // client ever sends a certificate in a PSK handshake.)
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
    SSL_CTX_set_psk_use_session_callback(ctx.get(), use_psk);
  }
  return ctx;
}

std::unique_ptr<Stream> tls(std::unique_ptr<Stream> tcp, std::span<const std::byte> psk,
                            Deadline deadline, bool server) {
  if (psk.size() != kPskBytes)
    fail("TLS link: the pre-shared key must be {} bytes (got {})", kPskBytes, psk.size());
  const std::string peer = tcp->peer();
  const int fd = tcp->fd();
  const CtxPtr ctx = make_context(server, peer);
  SSL* ssl = SSL_new(ctx.get());  // holds its own reference to ctx
  BIO* bio = BIO_new(socket_method());
  if (ssl == nullptr || bio == nullptr) {
    SSL_free(ssl);
    BIO_free(bio);
    fail("TLS link: cannot set up TLS for {}: out of memory", peer);
  }
  auto stream = std::make_unique<TlsStream>(std::move(tcp), ssl);
  BIO_set_data(bio, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
  SSL_set_bio(ssl, bio, bio);  // one reference, owned by ssl from now on
  std::memcpy(stream->psk().key.data(), psk.data(), kPskBytes);
  SSL_set_app_data(ssl, &stream->psk());
  if (server)
    SSL_set_accept_state(ssl);
  else
    SSL_set_connect_state(ssl);
  stream->handshake(deadline);
  return stream;
}

}  // namespace

std::unique_ptr<Stream> tls_client(std::unique_ptr<Stream> tcp, std::span<const std::byte> psk,
                                   Deadline deadline) {
  return tls(std::move(tcp), psk, deadline, false);
}

std::unique_ptr<Stream> tls_server(std::unique_ptr<Stream> tcp, std::span<const std::byte> psk,
                                   Deadline deadline) {
  return tls(std::move(tcp), psk, deadline, true);
}

}  // namespace ddiloco::comm
