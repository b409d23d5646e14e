// Byte streams between a unit and the syncer for the secure link modes (link.hpp): TCP, and
// TLS 1.3 over TCP keyed by a pre-shared key derived from the run's secret (OpenSSL). Every
// blocking call is bounded by a deadline, and nothing here reads or writes memory a peer names:
// a stream carries bytes; what they mean is the caller's to check.
//
// Threading: one thread at a time per stream, except shutdown(), which any thread may call to
// end the stream's blocking calls at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ddiloco::comm {

using Deadline = std::chrono::steady_clock::time_point;

/// One connection to a peer.
class Stream {
 public:
  virtual ~Stream() = default;
  /// Writes every byte of `data` before `deadline`. Throws Error naming the peer when the peer
  /// is gone, the stream was shut down, or the deadline passed ("... timed out").
  virtual void write_all(std::span<const std::byte> data, Deadline deadline) = 0;
  /// Reads exactly data.size() bytes before `deadline`. Throws Error naming the peer at end of
  /// stream ("closed by the peer"), on a socket or TLS error, or when the deadline passed.
  virtual void read_exact(std::span<std::byte> data, Deadline deadline) = 0;
  /// Waits up to `ms` milliseconds (< 0: no limit) until a read would make progress (bytes
  /// buffered, end of stream or an error count) or `wake_fd` (≥ 0) is readable. True when the
  /// stream is (false when only `wake_fd` is, or the time is up). Never spins: it sleeps in
  /// poll(); for TLS, bytes OpenSSL already holds count without it.
  virtual bool wait_readable(int ms, int wake_fd = -1) = 0;
  /// shutdown(SHUT_RDWR) of the socket: every blocking call of this stream ends with Error
  /// ("... the stream was shut down"). Safe from any thread; idempotent.
  virtual void shutdown() = 0;
  /// The peer's "ip:port" ("[ipv6]:port").
  virtual const std::string& peer() const = 0;
  /// The socket (for the TLS layer and poll()); owned by the stream.
  virtual int fd() const = 0;
  /// 32 bytes that the two ends of this stream and no one else hold: for TLS, keying material
  /// exported from the session (RFC 8446 §7.5, label "EXPORTER-ddiloco-link-auth"); empty for
  /// plain TCP. The handshake (link_auth.hpp) binds its proofs to it.
  virtual std::vector<std::byte> channel_binding() = 0;
};

/// A listening TCP socket (SO_REUSEADDR, close-on-exec, non-blocking).
class TcpListener {
 public:
  /// Binds ip:port (port 0: any free port). Throws Error naming the address when it cannot.
  TcpListener(const std::string& ip, int port, int backlog = 128);
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;
  /// "ip:port" actually bound.
  const std::string& address() const { return address_; }
  /// For poll(): readable when a connection waits.
  int fd() const { return fd_; }
  /// One waiting connection as a plain TCP stream (TCP keepalive: 2 s idle, 1 s interval,
  /// 3 probes; TCP_NODELAY; non-blocking, close-on-exec), or nullptr when none waits (or the
  /// one that waited died meanwhile). Never blocks. Throws Error naming the listener when it
  /// cannot accept (e.g. out of file descriptors).
  std::unique_ptr<Stream> accept();

 private:
  int fd_ = -1;
  std::string address_;
};

/// Connects to "ip:port" / "host:port" / "[ipv6]:port" before `deadline` (same socket options
/// as TcpListener::accept). Throws Error naming the address when it cannot (nothing listens,
/// timed out, malformed address).
std::unique_ptr<Stream> tcp_connect(const std::string& address, Deadline deadline);

/// TLS 1.3 only, over a connected TCP stream, authenticated by an external pre-shared key
/// (RFC 8446 §2.2; `psk` is 32 bytes) with an ephemeral (EC)DHE exchange (psk_dhe_ke), so the
/// keys are fresh for each connection and past traffic stays secret if the PSK later leaks.
/// Cipher TLS_AES_128_GCM_SHA256 or TLS_CHACHA20_POLY1305_SHA256: a PSK can only be used with
/// suites of its own hash (SHA-256 here), and a suite of another hash would make the server
/// ignore it. No certificates, none trusted (a server that shows one is refused), no session
/// tickets (every connection starts from the PSK). A peer without the PSK fails the handshake
/// at once (the PSK binder does not verify): Error naming the peer. Both throw Error when the
/// handshake does not complete before `deadline`, and when `psk` is not 32 bytes. The TLS
/// stream owns `tcp`; it sends with MSG_NOSIGNAL (no SIGPIPE when the peer is gone).
std::unique_ptr<Stream> tls_client(std::unique_ptr<Stream> tcp, std::span<const std::byte> psk,
                                   Deadline deadline);
std::unique_ptr<Stream> tls_server(std::unique_ptr<Stream> tcp, std::span<const std::byte> psk,
                                   Deadline deadline);

}  // namespace ddiloco::comm
