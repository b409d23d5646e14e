// The secure link modes' transport (link.hpp: authenticated, encrypted): one stream per unit
// (secure_stream.hpp), authenticated by link_auth.hpp before anything else, over which the
// syncer's reads and writes of a unit's window travel as requests. The unit checks each one
// against its own window and carries it out itself, so no process ever exposes memory to a
// peer: the worst an authenticated syncer can do is read or write inside the unit's window.
// Private to src/comm; the rest of ddiloco gets these through link.hpp's factories.
//
// Requests, syncer → unit (24 bytes, little-endian): op (u32), 0 (u32), offset (u64),
// size or value (u64); a put's `size` bytes follow. Replies, unit → syncer (16 bytes): status
// (u32: 0 done), 0 (u32), value (u64: a swap's or fetch's old word); a get's `size` bytes
// follow. A request out of the window (offset + size > bytes, overflow included), a word that
// is not 8-byte aligned or an unknown op ends the connection: the unit says why in
// lost_reason() and the syncer sees the unit lost.
//
// Limits on the syncer's side (what an unauthenticated peer can cost it):
//   kMaxPending     connections in their handshake or awaiting a verdict; one more is
//                   closed at once and counted ("over the pending-connection cap")
//   kMaxPendingPerSource  the same, from one source address: one stranger alone cannot
//                   hold every place
//   kMaxHello       bytes of a unit's hello
//   kHandshakeS     seconds from accept to an authenticated answer
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ddiloco/link.hpp"

namespace ddiloco::comm {

constexpr int kMaxPending = 64;
constexpr int kMaxPendingPerSource = 8;
constexpr size_t kMaxHello = size_t{256} << 10;
constexpr double kHandshakeS = 5;

/// The syncer's side (link.hpp SyncerEnd), as UcxSyncerLink's contract (ucx_link.hpp) with
/// requests for one-sided operations. Threads: an acceptor, one per handshake in progress (at
/// most kMaxPending), one per admitted unit; the public methods belong to one caller thread.
/// Waits sleep on a condition variable.
std::unique_ptr<SyncerEnd> make_stream_syncer_link(bool tls, const std::string& secret,
                                                   const std::string& bind_ip, int port, int units);
/// A unit leader's side (link.hpp UnitEnd): the window, and a thread that serves the syncer's
/// requests once connected (it sleeps in poll() between them).
std::unique_ptr<UnitEnd> make_stream_unit_link(bool tls, size_t bytes);

namespace wire {
enum Op : uint32_t { kGet = 1, kPut = 2, kSwap = 3, kFetch = 4 };
constexpr size_t kRequestBytes = 24;
constexpr size_t kReplyBytes = 16;
}  // namespace wire

}  // namespace ddiloco::comm
