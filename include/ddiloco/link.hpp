// The link between unit jobs and the syncer of the isolated deployment, in one of three modes
// (wan.security; the threat model and what each mode protects is docs/security.md):
//
//   trusted        UCX one-sided gets, puts and atomics (ucx_link.hpp): the fastest. Any peer
//                  that reaches the syncer's port can read and write the memory of the syncer
//                  and of the units it connected to (over TCP, UCX executes a peer's gets and
//                  puts in software without checking a key). For one job on a cluster fabric
//                  that only the job's own processes reach. A trusted syncer that listens
//                  beyond loopback warns at start.
//   authenticated  TCP; a mutual challenge–response (link_auth.hpp) before anything else; the
//                  syncer's reads and writes then travel as requests that the unit checks
//                  against its own window and carries out itself (stream_link.hpp). No process
//                  exposes memory to any peer. Bytes are in clear and unauthenticated after
//                  the handshake: a network that others can see or alter must use encrypted.
//   encrypted      as authenticated, inside TLS 1.3 keyed from the run's secret with
//                  per-connection (EC)DHE keys: every byte between the sites is encrypted and
//                  authenticated. The default whenever the syncer listens beyond loopback
//                  (on loopback the default is authenticated).
//
// The syncer's side is a SyncerEnd (RemoteMemory + UnitListener: remote_memory.hpp), a unit
// leader's a UnitEnd (ExposedMemory that connects). The protocol above (sync_window.hpp) sees
// only those interfaces and is the same in every mode.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "ddiloco/error.hpp"
#include "ddiloco/remote_memory.hpp"

namespace ddiloco::comm {

/// Thrown by UnitEnd::connect when the syncer refused the unit; what() is
/// "... the syncer at <addr> refused the connection: <reason>", reason() the syncer's text.
class LinkRefused : public Error {
 public:
  LinkRefused(const std::string& message, std::string reason)
      : Error(message), reason_(std::move(reason)) {}
  const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
};

enum class LinkMode { trusted, authenticated, encrypted };

/// "trusted" | "authenticated" | "encrypted".
const char* link_mode_name(LinkMode mode);
/// The mode that wan.security names: "auto" resolves to encrypted when `listen` (the syncer's
/// "ip:port") is not a loopback address, else authenticated (other users of the host reach
/// loopback too). Throws Error naming wan.security for any other value.
LinkMode resolve_link_mode(const std::string& security, const std::string& listen);

/// The syncer's side of the link.
class SyncerEnd : public RemoteMemory, public UnitListener {
 public:
  /// An operation that has not completed after `seconds` + its bytes at the minimum rate
  /// declares its unit lost. Throws Error if seconds ≤ 0.
  virtual void set_op_timeout(double seconds) = 0;
  /// The slowest link the waits allow for, bytes per second. Throws Error if not positive.
  virtual void set_min_rate(double bytes_per_s) = 0;
};

/// A unit leader's side: `bytes()` of zeroed, 64-byte aligned memory, the window the syncer
/// reads and writes once connect() admitted the unit.
class UnitEnd : public ExposedMemory {
 public:
  /// Connects to the syncer at "ip:port", proves the run's `secret` and checks the syncer's
  /// proof (not in trusted mode), sends `payload` (the hello) and waits for the verdict, at
  /// most timeout_s seconds in all. Throws LinkRefused with the syncer's reason; Error on
  /// anything else (nothing listens, no answer, not authenticated, already connected, closed).
  virtual void connect(const std::string& syncer_addr, const std::string& secret,
                       const std::string& payload, double timeout_s) = 0;
  /// True from a successful connect() until the connection ends.
  virtual bool connected() const = 0;
  /// Why the last connection ended ("" while connected or before the first connect()).
  virtual std::string lost_reason() const = 0;
};

/// The syncer's side in `mode`, listening on bind_ip:port (0: any free port) for units
/// 0..units−1; `secret` is the run's (unused in trusted mode). Throws Error when it cannot
/// listen.
std::unique_ptr<SyncerEnd> listen_for_units(LinkMode mode, const std::string& secret,
                                            const std::string& bind_ip, int port, int units);
/// A unit leader's side in `mode`, exposing `bytes` > 0 bytes.
std::unique_ptr<UnitEnd> expose_to_syncer(LinkMode mode, size_t bytes);

}  // namespace ddiloco::comm
