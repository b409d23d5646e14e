// UCX helpers shared by the syncer's and the unit's side of the link (ucx_link.hpp): the
// handshake's wire format, addresses, the context, worker and waiting. Private to src/comm.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "ddiloco/error.hpp"

namespace ddiloco::comm::ucx {

using Clock = std::chrono::steady_clock;

Clock::time_point after(double seconds);

// Milliseconds to sleep in poll(): up to `cap_ms`, never past the deadline, at least 1.
int poll_ms(Clock::time_point deadline, int cap_ms);

void check(ucs_status_t status, const char* what);

// ---------------------------------------------------------------- handshake wire format
// One active message each way. Both ends run this code on the same kind of machine, so the
// headers travel in host byte order; the magic and version catch anything else.
constexpr uint32_t kMagic = 0x6b4c6464;  // "ddLk"
constexpr uint32_t kVersion = 1;
constexpr unsigned kAmHello = 0x4444;  // unit → syncer
constexpr unsigned kAmReply = 0x4445;  // syncer → unit
constexpr size_t kMaxPayload = size_t{1} << 20;
constexpr size_t kMaxRkey = size_t{1} << 16;
constexpr double kHelloTimeoutS = 10;  // a connection that sends no hello is closed after this

struct HelloHeader {
  uint32_t magic;
  uint32_t version;
  uint64_t nonce;  // echoed in the reply: a late reply to an abandoned attempt is ignored
  uint64_t base;   // remote address of the exposed memory
  uint64_t bytes;
  uint32_t rkey_len;     // data = packed rkey (rkey_len bytes) then the payload
  uint32_t payload_len;
};
struct ReplyHeader {
  uint32_t magic;
  uint32_t status;  // kAdmitted or kRefused; data = the reason (refused only)
  uint64_t nonce;
};
constexpr uint32_t kAdmitted = 0;
constexpr uint32_t kRefused = 1;

// ---------------------------------------------------------------- addresses
sockaddr_storage resolve(const std::string& host, int port, bool passive);

socklen_t sockaddr_len(const sockaddr_storage& a);

std::string format_address(const sockaddr_storage& a);

bool is_loopback(const sockaddr_storage& a);

// "ip:port", "host:port" or "[ipv6]:port".
sockaddr_storage parse_address(const std::string& text);

// ---------------------------------------------------------------- context and waiting
// One context per link object, with the features both sides need: RMA and 64-bit atomics
// (the target needs them too: over TCP it executes them in its worker), active messages for
// the handshake, and wakeup for the event fd we sleep on.
// loopback_only: restrict UCX to the loopback device "lo" (unless UCX_NET_DEVICES is set), for
// a syncer that listens on a loopback address. Otherwise UCX adds lanes over every device it
// finds (seen here: active messages over tcp/lo and tcp/eth0 for a 127.0.0.1 connection),
// i.e. traffic to the host's other addresses that a loopback-only run must not have.
ucp_context_h create_context(const char* name, bool loopback_only);

ucp_worker_h create_worker(ucp_context_h context, int* efd);

void set_am_handler(ucp_worker_h worker, unsigned id, ucp_am_recv_callback_t cb, void* arg);

// A UCP request: complete at once (ptr null) or in flight until check_status says otherwise.
struct Req {
  void* ptr = nullptr;
  ucs_status_t status = UCS_OK;

  static Req of(ucs_status_ptr_t p) {
    Req r;
    if (p == nullptr) return r;
    if (UCS_PTR_IS_ERR(p)) {
      r.status = UCS_PTR_STATUS(p);
      return r;
    }
    r.ptr = p;
    r.status = UCS_INPROGRESS;
    return r;
  }
  /// True once complete (then `status` is final and the request is freed).
  bool test() {
    if (ptr == nullptr) return true;
    const ucs_status_t s = ucp_request_check_status(ptr);
    if (s == UCS_INPROGRESS) return false;
    ucp_request_free(ptr);
    ptr = nullptr;
    status = s;
    return true;
  }
  /// Lets go of a request we no longer wait for: UCX frees it when it completes.
  void release() {
    if (ptr != nullptr) ucp_request_free(ptr);
    ptr = nullptr;
  }
};

// Progresses the worker until it has nothing left to do right now.
void drain(ucp_worker_h worker);

// Sleeps until the worker has events (or an extra fd is readable) or `ms` pass. Never spins:
// ucp_worker_arm says BUSY when events are already pending (then the caller progresses again
// at once); where arming is unsupported, a 1 ms sleep stands in for the event fd.
void sleep_on(ucp_worker_h worker, int efd, int ms, int extra_fd = -1);

// Closes an endpoint without waiting: the request (if any) is progressed later.
Req close_ep(ucp_ep_h ep, bool force);

}  // namespace ddiloco::comm::ucx
