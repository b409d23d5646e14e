// The transport under the learner ↔ syncer protocol (sync_window.hpp): memory a unit leader
// exposes, and the syncer's one-sided access to it. The protocol is written once over these
// two interfaces; two transports implement them:
//   MPI RMA (mpi_memory.hpp)  one job, one MPI world: MPI_Win_allocate + passive-target RMA.
//   UCX     (ucx_link.hpp)    separate jobs: ucp_mem_map'ed memory, ucp_get/put/atomics from
//                             the syncer, endpoints that report a dead peer.
// Nothing here knows what the bytes mean (formats, headers and flow control are the protocol's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace ddiloco::comm {

/// A unit leader's side: `bytes()` bytes of zero-initialised, 64-byte aligned memory that the
/// syncer reads and writes while this process touches it only with local loads and stores.
/// Words the two sides share are int64, 8-byte aligned, accessed here through std::atomic_ref.
class ExposedMemory {
 public:
  virtual ~ExposedMemory() = default;
  virtual std::byte* base() = 0;
  virtual size_t bytes() const = 0;
  /// Memory barrier between this process's loads/stores and the syncer's accesses
  /// (MPI_Win_sync for MPI; a sequentially consistent fence for UCX, whose remote accesses
  /// are CPU stores of this process's progress thread or of the NIC).
  virtual void sync() = 0;
  /// Ends the exposure once every exchange is over (MPI: collective over the sync communicator).
  virtual void close() = 0;
};

/// The syncer's side, the only origin of every operation: one-sided access to the exposed
/// memory of units 0..units()−1. Offsets and sizes are in bytes within a unit's memory.
///
/// A unit may be absent (not connected yet, or lost: its process died, its link failed). An
/// operation on an absent unit does nothing and returns false: a get leaves `dst` as it was,
/// a put is dropped. It never throws for that and never waits for the peer: the syncer learns
/// of the loss from the return value or from connected(), and carries on with the others.
/// Errors of the transport itself (out of memory, a malformed request) throw ddiloco::Error.
class RemoteMemory {
 public:
  virtual ~RemoteMemory() = default;
  virtual int units() const = 0;
  /// Is unit u connected now (its memory can be read)?
  virtual bool connected(int u) const = 0;
  /// One read of a batch.
  struct Read {
    int unit;
    size_t offset;
    std::span<std::byte> dst;
    bool ok = false;  ///< set by get_all: the read completed
  };
  /// Reads every request, issued together and completed before returning.
  virtual void get_all(std::span<Read> reads) = 0;
  /// Reads `dst.size()` bytes at `offset` of unit u's memory (complete on return).
  virtual bool get(int u, size_t offset, std::span<std::byte> dst) = 0;
  /// Writes `src` at `offset` of unit u's memory, complete at the target on return (so that a
  /// word written after it announces complete data).
  virtual bool put(int u, size_t offset, std::span<const std::byte> src) = 0;
  /// Atomically replaces the int64 at `offset` (8-byte aligned), complete at the target on
  /// return.
  virtual bool put_word(int u, size_t offset, int64_t value) = 0;
  /// Atomically reads the int64 at `offset` (8-byte aligned).
  virtual bool fetch_word(int u, size_t offset, int64_t& value) = 0;
  /// Ends access to every unit (MPI: collective over the sync communicator).
  virtual void close() = 0;

  // Transfers the caller does not wait for. Over real links each unit's link carries its own
  // while the syncer goes on with the others: four units' snapshots over four slow links take
  // the time of one, and a merge goes to one unit while another's snapshot is still arriving.
  // Started by start_get / start_put, ended by test() or abandon(). The defaults do the
  // blocking get() / put() at once (transports whose transfers are local: MPI RMA in one job);
  // UCX overrides them.
  using Ticket = int64_t;  ///< > 0, never reused by one object; 0: not started
  /// Starts reading `bytes` bytes at `offset` of unit u's memory (into the transport's own
  /// buffer). 0 when it cannot start now (the unit is absent, or an operation of it stalled).
  /// Throws Error for a malformed request (out of the unit's memory).
  virtual Ticket start_get(int u, size_t offset, size_t bytes);
  /// Starts writing a copy of `src` at `offset` of unit u's memory (the caller's buffer is free
  /// on return); complete at the target once test() says done. 0 when it cannot start now.
  virtual Ticket start_put(int u, size_t offset, std::span<const std::byte> src);
  enum class Status { running, done, failed };
  /// Non-blocking; progresses the transport. done: a get's bytes are copied into `dst` (its
  /// size must be the get's, else Error), and the ticket is forgotten. failed (the unit was
  /// lost, its link timed out, or the ticket is unknown): forgotten, `dst` untouched.
  virtual Status test(Ticket ticket, std::span<std::byte> dst = {});
  /// Forgets a ticket: a running transfer goes on unseen (its buffers are the transport's) and
  /// its outcome is dropped. Unknown tickets are ignored.
  virtual void abandon(Ticket ticket);

 private:
  std::map<Ticket, std::vector<std::byte>> finished_;  // the defaults': done, a get's bytes
  Ticket next_ticket_ = 1;
};

/// The syncer's side of a transport where units come and go (UCX): connections that await a
/// verdict, and the units lost since the last call. Non-blocking.
class UnitListener {
 public:
  virtual ~UnitListener() = default;
  /// The address units connect to ("ip:port").
  virtual std::string address() const = 0;
  struct Pending {
    int64_t id;           ///< the connection, for admit() or refuse()
    std::string payload;  ///< what the unit said (its hello)
    size_t bytes;         ///< bytes of memory it exposes
    std::string peer;     ///< its address, "ip:port"
  };
  /// Connections whose handshake arrived since the last call. (The secure link drops, and
  /// counts as refused, one whose peer hung up while it waited: a unit that gave up retries.)
  virtual std::vector<Pending> accept_pending() = 0;
  /// Binds connection `id` to unit index u (u must be absent) and tells the unit it is in.
  /// Throws Error when it cannot (a malformed remote key, out of threads or descriptors); the
  /// connection is then refused, or still awaits refuse(), and the unit stays absent.
  virtual void admit(int64_t id, int unit) = 0;
  /// Tells the unit why it is refused and closes the connection; nothing of it is kept.
  virtual void refuse(int64_t id, const std::string& reason) = 0;
  struct Lost {
    int unit;
    std::string reason;
  };
  /// Units whose connection failed or closed since the last call (now absent).
  virtual std::vector<Lost> take_lost() = 0;
  /// Closes unit u's connection (no-op when absent); take_lost() then reports it "closed".
  virtual void disconnect(int unit) = 0;
  /// Connections the transport refused itself, before any hello reached the caller (not
  /// authenticated, over the pending-connection cap, no handshake in time), by reason, since
  /// the previous call. Every one is counted, so that the caller can log a rate-limited summary
  /// without losing any from the count. The trusted UCX transport refuses none itself.
  virtual std::vector<std::pair<std::string, int64_t>> take_refusals() { return {}; }
};

}  // namespace ddiloco::comm
