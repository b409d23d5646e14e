// The learner ↔ syncer transport between separate jobs, over UCX (UCP 1.13): each unit leader
// registers its exposed memory (UcxUnitLink) and connects to the syncer's listener; the syncer
// (UcxSyncerLink) reads and writes that memory with one-sided gets, puts and 64-bit atomics.
// The protocol on top (sync_window.hpp) sees only the RemoteMemory / ExposedMemory interfaces
// of remote_memory.hpp; nothing here knows what the bytes mean.
//
// Why UCX and not MPI between units: an endpoint created with peer error handling reports a
// dead peer (error callback, failed requests) instead of taking the process down, so the
// syncer lives on when a unit's job is killed, and a restarted unit connects again.
//
// Handshake (one message each way, UCP active messages): the unit sends its caller's opaque
// payload, the packed rkey, base address and size of its memory; the syncer's caller decides
// (admit or refuse) and the unit's connect() returns or throws LinkRefused with the reason.
//
// Transports: whatever UCX selects, honouring UCX_TLS, UCX_NET_DEVICES, ... from the
// environment as UCX does. Tested here only with UCX_TLS=tcp on 127.0.0.1 (UCX 1.13.1,
// Debian 12; UCX_TLS=all also passes, and still picks tcp lanes for these client-server
// endpoints). Over TCP, gets/puts/atomics are carried as active messages that the TARGET's
// worker must progress, hence the unit's progress thread. One exception to "as UCX picks":
// a syncer bound to a loopback address restricts itself to the device "lo" unless
// UCX_NET_DEVICES is set (UCX would add lanes over the host's other interfaces, seen:
// tcp/eth0), so its units' lanes are lo only. A unit cannot do that (its context exists
// before it knows the address): a single-host run sets UCX_NET_DEVICES=lo for the units.
//
// Dead-peer detection: unless the environment sets them, the context is configured with
// UCX_KEEPALIVE_INTERVAL=1s, UCX_TCP_KEEPIDLE=2s, UCX_TCP_KEEPINTVL=1s, UCX_TCP_KEEPCNT=3, so
// a silent idle peer (link down) is detected within ~5 s. A killed process is seen as soon as
// its kernel closes the socket: measured here ≤ 0.02 s on both sides, busy or idle
// (tests/unit/test_ucx_link.cpp prints the figures). A peer that is alive for TCP but never
// progresses (SIGSTOPped), or whose link is cut (a partition: TCP retransmits for minutes),
// is caught by the syncer's operation timeout (set_op_timeout).
//
// One silent unit never holds up the syncer's work with the others: an operation waits at
// most its patience (0.25 s + its bytes at 10 MB/s, set_min_rate); one still in flight then is left in
// flight ("stalled": it keeps its own buffers, the caller's are never touched afterwards) and
// reported failed. While a unit has a stalled operation every new one to it fails at once;
// when the stalled ones complete (the link came back) the unit is usable again, and when one
// passes the operation timeout its connection is closed and take_lost() reports it.
// The syncer learns of anything only inside its calls into the link: it must call
// take_lost() / accept_pending() regularly.
//
// Neither class is copyable; both release everything in their destructor (close()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ddiloco/error.hpp"
#include "ddiloco/link.hpp"
#include "ddiloco/remote_memory.hpp"

namespace ddiloco::comm {

/// The syncer's side: a UCP listener that units connect to, and one-sided access to the
/// memory of the admitted ones (RemoteMemory).
///
/// Threading: UCS_THREAD_MODE_SINGLE. Every method must be called from one thread (the
/// syncer's); the worker is progressed only inside these calls (nothing runs in between, so
/// call accept_pending() / take_lost() regularly, even when idle).
///
/// Waiting never spins: a wait progresses the worker until it has nothing to do, then arms it
/// (ucp_worker_arm) and sleeps in poll() on its event fd, with a short timeout.
class UcxSyncerLink final : public SyncerEnd {
 public:
  /// A connection that sent its handshake and waits for admit() or refuse(); `id` is never
  /// reused within this object, `payload` is the unit's hello byte for byte.
  using Pending = UnitListener::Pending;
  /// A unit whose connection ended since the previous take_lost(); `reason` is "closed" after
  /// disconnect(), otherwise UCX's or ours.
  using Lost = UnitListener::Lost;

  /// Listens on bind_ip:port (port 0: any free port; see address()) for units 0..units−1.
  /// bind_ip is a numeric IPv4/IPv6 address or a host name. Throws Error if UCX cannot be
  /// initialised or the address cannot be bound (a fixed port can stay "in use" for a while
  /// after a previous syncer exited: TCP TIME_WAIT; port 0 avoids that).
  UcxSyncerLink(const std::string& bind_ip, int port, int units);
  ~UcxSyncerLink() override;
  UcxSyncerLink(const UcxSyncerLink&) = delete;
  UcxSyncerLink& operator=(const UcxSyncerLink&) = delete;

  /// "ip:port" actually bound (for port 0, the port the system chose): what units connect to.
  std::string address() const override;

  /// Connections whose handshake arrived since the previous call (each is returned once).
  /// Non-blocking: progresses the worker without sleeping. Connections that send no
  /// handshake within 10 s of connecting are closed unseen.
  std::vector<Pending> accept_pending() override;
  /// Binds connection `id` to unit `unit` (0 ≤ unit < units()) and replies "ok"; from then on
  /// connected(unit) is true and operations reach that memory. A previous, lost connection of
  /// the unit is replaced, and losses of the unit that take_lost() has not returned yet are
  /// dropped (the admission supersedes them). Throws Error if the id is not pending
  /// (unknown, admitted or refused already), the unit is out of range, or the unit is
  /// connected now (disconnect it first). If the connection failed after accept_pending()
  /// returned it, the unit is admitted and lost at once: take_lost() reports it and
  /// connected(unit) stays false.
  void admit(int64_t id, int unit) override;
  /// Replies `reason` to connection `id`, then closes it. Its rkey is never unpacked: a
  /// refused peer gets no access. Throws Error if the id is not pending.
  void refuse(int64_t id, const std::string& reason) override;

  /// Units lost since the previous call: their endpoint failed (peer died, link broke,
  /// operation timeout) or disconnect() closed it. Non-blocking (progresses the worker).
  std::vector<Lost> take_lost() override;
  /// Closes unit u's connection gracefully (no-op when u is not connected); take_lost()
  /// reports it with reason "closed".
  void disconnect(int unit) override;

  /// An operation that has not completed after `seconds` + its bytes at the minimum rate
  /// (set_min_rate, default 10 MB/s) declares its
  /// unit lost (reason "operation timed out ..."), seen by the next call into the link after
  /// that time: the safety net for a peer that is alive for TCP but does not progress, or
  /// whose link is down. Default 10 s. Throws Error if seconds ≤ 0.
  void set_op_timeout(double seconds) override;
  /// The slowest link the waits allow for, bytes per second (default 1e7): an operation's
  /// patience is 0.25 s + its bytes at this rate, its timeout set_op_timeout's + the same.
  /// Throws Error if not positive.
  void set_min_rate(double bytes_per_s) override;
  /// Size in bytes of unit u's exposed memory (0 when u is not connected).
  size_t bytes(int u) const;

  // RemoteMemory. Bounds: offset + size must lie within the unit's memory, and word offsets
  // must be 8-byte aligned, or Error is thrown (a malformed request); an absent or lost unit,
  // or one with a stalled operation, makes the operation return false (Read::ok = false)
  // without waiting; one that outlives its patience returns false after it.
  int units() const override;
  bool connected(int u) const override;
  void get_all(std::span<Read> reads) override;
  bool get(int u, size_t offset, std::span<std::byte> dst) override;
  /// ucp_put_nbx + ucp_ep_flush_nbx: complete at the target on return.
  bool put(int u, size_t offset, std::span<const std::byte> src) override;
  /// 64-bit atomic swap; its reply means it was performed at the target.
  bool put_word(int u, size_t offset, int64_t value) override;
  /// 64-bit atomic fetch-and-add of 0.
  bool fetch_word(int u, size_t offset, int64_t& value) override;
  /// Transfers the syncer does not wait for (remote_memory.hpp): issued at once into (or from)
  /// buffers of the link's own; while one runs, the caller should issue nothing else to that
  /// unit (it would queue behind it on the unit's connection and outlive its patience). One
  /// still running `set_op_timeout` + its bytes at the minimum rate after it started fails
  /// its connection (take_lost() reports the unit). 0 when the unit is absent, lost or has an
  /// operation stalled.
  Ticket start_get(int u, size_t offset, size_t bytes) override;
  /// ucp_put_nbx + ucp_ep_flush_nbx: done means complete at the target.
  Ticket start_put(int u, size_t offset, std::span<const std::byte> src) override;
  Status test(Ticket ticket, std::span<std::byte> dst = {}) override;
  void abandon(Ticket ticket) override;
  /// Closes every connection and the listener; the object is unusable afterwards (every
  /// operation returns false, accept_pending() returns nothing). Idempotent.
  void close() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A unit leader's side: `bytes` of zeroed, 64-byte aligned memory registered with UCX
/// (ucp_mem_map), which the syncer reads and writes after connect(), and a progress thread.
///
/// Threading: one progress thread owns the UCX context and worker (created, used and
/// destroyed there; UCS_THREAD_MODE_SINGLE). It sleeps in poll() on the worker's event fd
/// (after ucp_worker_arm) and on an eventfd of ours, with a 100 ms timeout, and progresses
/// the worker when woken: over TCP the syncer's gets/puts/atomics need this process to
/// progress. connect() and close() hand their work to that thread and wait for it; the other
/// methods touch no UCX state and may be called from any thread.
///
/// The memory and its rkey stay the same across reconnects; only the endpoint is new.
/// Coexists with Open MPI (pml ob1, no UCX in MPI) in the same process: tested.
class UcxUnitLink final : public UnitEnd {
 public:
  /// Allocates and registers the memory (bytes > 0) and starts the progress thread. Throws
  /// Error if bytes is 0, the allocation fails or UCX cannot be initialised.
  explicit UcxUnitLink(size_t bytes);
  ~UcxUnitLink() override;
  UcxUnitLink(const UcxUnitLink&) = delete;
  UcxUnitLink& operator=(const UcxUnitLink&) = delete;

  std::byte* base() override;
  size_t bytes() const override;
  /// std::atomic_thread_fence(seq_cst): the syncer's accesses are CPU stores of the progress
  /// thread (TCP, shared memory) or of the NIC.
  void sync() override;
  /// Stops the progress thread, closes the endpoint (gracefully, bounded), unregisters the
  /// memory. base() stays valid (the memory is freed by the destructor). Idempotent.
  void close() override;

  /// Connects to the syncer at `syncer_addr` ("ip:port", "host:port" or "[ipv6]:port"),
  /// sends `payload` (opaque, up to 1 MiB) with the memory's rkey, and waits for the reply,
  /// at most timeout_s seconds in all. Returns when admitted (connected() is true).
  /// Throws LinkRefused (an Error) with the syncer's reason when refused; Error when no reply
  /// came within timeout_s ("no listener" and "no answer" both end so), when the connection
  /// failed (e.g. refused by the kernel: nothing listens), when already connected or closed,
  /// or for a malformed address. Retrying (with back-off) is the caller's policy.
  void connect(const std::string& syncer_addr, const std::string& payload, double timeout_s);
  /// UnitEnd: the trusted mode proves nothing on the link (the hello carries the proof
  /// membership.hpp checks), so `secret` is not used here.
  void connect(const std::string& syncer_addr, const std::string& /*secret*/, const std::string& payload,
               double timeout_s) override {
    connect(syncer_addr, payload, timeout_s);
  }
  /// True from a successful connect() until the endpoint to the syncer fails (the syncer
  /// died, closed or disconnected this unit, or the link broke).
  bool connected() const override;
  /// Why the last connection ended: UCX's status text (e.g. "Endpoint timeout" after the
  /// syncer was killed, "Connection reset by remote peer" after it closed), "closed" after
  /// close(); "" while connected or before the first connect().
  std::string lost_reason() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddiloco::comm
