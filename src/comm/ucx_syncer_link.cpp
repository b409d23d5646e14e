// UCX (UCP) implementation of the learner ↔ syncer transport, the syncer's side: see
// ddiloco/ucx_link.hpp; the helpers both sides share are comm/ucx_common.hpp.
#include "ddiloco/ucx_link.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "comm/ucx_common.hpp"

namespace ddiloco::comm {

using namespace ucx;  // NOLINT: this file is one side of the link those helpers serve

// ================================================================= syncer side

struct UcxSyncerLink::Impl {
  // One 64-bit atomic on unit u's word at `offset`: `operand` in, the old value out.
  bool atomic_word(int u, size_t offset, ucp_atomic_op_t opcode, uint64_t operand, uint64_t& old);
  enum class State { hello_wait, pending, reported, admitted };
  struct Op;
  struct Conn {
    Impl* owner = nullptr;
    int64_t id = 0;
    ucp_ep_h ep = nullptr;
    std::string peer;
    State state = State::hello_wait;
    Clock::time_point since = Clock::now();
    bool failed = false;
    std::string reason;
    // The hello.
    std::string payload;
    std::vector<uint8_t> rkey_buf;
    uint64_t base = 0;
    uint64_t bytes = 0;
    uint64_t nonce = 0;
    // Admitted.
    ucp_rkey_h rkey = nullptr;
    int unit = -1;
    // Our reply: its buffers live here until the send completes (the Conn outlives its ep).
    ReplyHeader reply{};
    std::string reply_text;
    Req reply_req;
    // Operations that outlived their patience: still in flight, owned here (with the buffers
    // UCX writes into) until they complete, or the forced close of the endpoint purges them.
    // While any is, every new operation on this unit fails at once (nothing queues behind a
    // silent link); the first one past its timeout closes the connection.
    std::vector<std::unique_ptr<Op>> stalled;
    // Transfers the caller does not wait for (start_get / start_put), by ticket, until test()
    // or abandon() takes them; one past its timeout fails the connection, as a stalled one.
    std::map<Ticket, std::unique_ptr<Op>> transfers;

    void fail_with(std::string why) {
      if (failed) return;
      failed = true;
      reason = std::move(why);
    }
  };
  struct Closing {
    std::unique_ptr<Conn> conn;
    Req req;
  };

  int units = 0;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_listener_h listener = nullptr;
  int efd = -1;
  std::string address;
  double op_timeout_s = 10;
  double patience_s = 0.25;
  double floor_bytes_per_s = 1e7;  // the slowest link the timeouts allow for
  int64_t next_id = 1;
  Ticket next_ticket = 1;
  std::unordered_map<Ticket, int64_t> ticket_conn;  // a transfer's connection id
  bool closed = false;

  std::vector<ucp_conn_request_h> conn_requests;  // from the listener, handled after progress
  std::map<int64_t, std::unique_ptr<Conn>> conns;
  std::unordered_map<ucp_ep_h, Conn*> by_ep;
  std::vector<Conn*> unit_conn;
  std::vector<Lost> lost;
  std::vector<Closing> closing;

  // ---- callbacks (all run inside ucp_worker_progress on the caller's thread)
  static void on_conn_request(ucp_conn_request_h request, void* arg) {
    static_cast<Impl*>(arg)->conn_requests.push_back(request);
  }
  static void on_ep_error(void* arg, ucp_ep_h, ucs_status_t status) {
    static_cast<Conn*>(arg)->fail_with(ucs_status_string(status));
  }
  static ucs_status_t on_hello(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return UCS_OK;
    const auto it = self->by_ep.find(param->reply_ep);
    if (it == self->by_ep.end()) return UCS_OK;
    Conn& c = *it->second;
    if (c.state != State::hello_wait || c.failed) return UCS_OK;
    HelloHeader h{};
    if (header_length != sizeof h) {
      c.fail_with("malformed handshake (header size)");
      return UCS_OK;
    }
    std::memcpy(&h, header, sizeof h);
    if (h.magic != kMagic || h.version != kVersion) {
      c.fail_with(fmt::format("malformed handshake (magic {:#x}, version {})", h.magic, h.version));
      return UCS_OK;
    }
    // The unit sends eagerly (UCP_AM_SEND_FLAG_EAGER): the data is here, whole.
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || h.rkey_len == 0 ||
        h.rkey_len > kMaxRkey || h.payload_len > kMaxPayload ||
        size_t{h.rkey_len} + h.payload_len != length || h.bytes == 0) {
      c.fail_with("malformed handshake (sizes)");
      return UCS_OK;
    }
    const auto* d = static_cast<const uint8_t*>(data);
    c.rkey_buf.assign(d, d + h.rkey_len);
    c.payload.assign(reinterpret_cast<const char*>(d) + h.rkey_len, h.payload_len);
    c.base = h.base;
    c.bytes = h.bytes;
    c.nonce = h.nonce;
    c.state = State::pending;
    return UCS_OK;
  }

  // ---- progress
  void progress() {
    drain(worker);
    while (!conn_requests.empty()) {
      std::vector<ucp_conn_request_h> requests;
      requests.swap(conn_requests);
      for (ucp_conn_request_h r : requests) accept_connection(r);
      drain(worker);
    }
  }

  void accept_connection(ucp_conn_request_h request) {
    auto c = std::make_unique<Conn>();
    c->owner = this;
    c->id = next_id++;
    ucp_conn_request_attr_t attr{};
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    c->peer = ucp_conn_request_query(request, &attr) == UCS_OK
                  ? format_address(attr.client_address)
                  : std::string("?");
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.conn_request = request;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = &Impl::on_ep_error;
    p.err_handler.arg = c.get();
    if (ucp_ep_create(worker, &p, &c->ep) != UCS_OK) {
      // UCX has consumed the request on failure; nothing to reject.
      return;
    }
    by_ep[c->ep] = c.get();
    conns[c->id] = std::move(c);
  }

  // Hands the connection's endpoint to the closing list (and the Conn with it: its error
  // callback and reply buffers must stay valid until the close completes).
  void start_close(int64_t id, bool force, bool ops_in_flight = false) {
    auto it = conns.find(id);
    if (it == conns.end()) return;
    std::unique_ptr<Conn> c = std::move(it->second);
    conns.erase(it);
    if (c->unit >= 0 && unit_conn[c->unit] == c.get()) unit_conn[c->unit] = nullptr;
    by_ep.erase(c->ep);
    // UCX wants the rkey destroyed after its operations are flushed and before its endpoint.
    // Operations here are synchronous, so none is in flight, except after an operation
    // timeout: then the forced close purges them first and the rkey goes after.
    ops_in_flight = ops_in_flight || !c->stalled.empty() || !c->transfers.empty();
    if (!ops_in_flight && c->rkey != nullptr) {
      ucp_rkey_destroy(c->rkey);
      c->rkey = nullptr;
    }
    Req r = close_ep(c->ep, force || c->failed || ops_in_flight);
    closing.push_back(Closing{std::move(c), r});
  }

  void progress_closing() {
    for (size_t i = 0; i < closing.size();) {
      if (!closing[i].req.test()) {
        ++i;
        continue;
      }
      Conn& c = *closing[i].conn;
      for (auto& op : c.stalled)  // purged by the forced close: complete now
        for (Req& r : op->req) r.release();
      c.stalled.clear();
      for (auto& [ticket, op] : c.transfers)
        for (Req& r : op->req) r.release();
      c.transfers.clear();
      if (c.rkey != nullptr) ucp_rkey_destroy(c.rkey);
      c.rkey = nullptr;
      c.reply_req.test();
      c.reply_req.release();
      closing.erase(closing.begin() + static_cast<ptrdiff_t>(i));
    }
  }

  // Before an operation: what arrived is taken in (a stalled operation may have completed).
  void refresh() {
    progress();
    reap();
  }

  // Turns failed connections into losses (admitted) or drops them (not yet reported), closes
  // connections that never sent their hello, and frees completed reply sends.
  void reap() {
    std::vector<int64_t> to_close;
    const auto now = Clock::now();
    for (auto& [id, c] : conns) {
      c->reply_req.test();
      settle_stalled(*c, now);
      if (c->state == State::hello_wait && !c->failed &&
          now - c->since > std::chrono::duration<double>(kHelloTimeoutS))
        c->fail_with("no handshake");
      if (!c->failed) continue;
      if (c->state == State::admitted) {
        lost.push_back(Lost{c->unit, c->reason});
        to_close.push_back(id);
      } else if (c->state != State::reported) {
        to_close.push_back(id);
      }
      // State::reported: kept until the caller admits or refuses it.
    }
    for (int64_t id : to_close) start_close(id, true);
    if (!to_close.empty()) drain(worker);  // the forced closes take effect (sockets closed) now
    progress_closing();
  }

  Conn* usable(int u) const {
    if (u < 0 || u >= units) fail("UCX link: unit {} out of range 0..{}", u, units - 1);
    Conn* c = closed ? nullptr : unit_conn[u];
    return c != nullptr && !c->failed ? c : nullptr;
  }

  static void check_range(const Conn& c, int u, size_t offset, size_t size) {
    if (offset > c.bytes || size > c.bytes - offset)
      fail("UCX link: access to unit {} at [{}, {}) is beyond its {} bytes", u, offset,
           offset + size, c.bytes);
  }
  static void check_word(const Conn& c, int u, size_t offset) {
    if (offset % 8 != 0) fail("UCX link: word offset {} of unit {} is not 8-byte aligned", offset, u);
    check_range(c, u, offset, 8);
  }

  // ---- operations
  // One operation's requests (a put and its flush use two), the unit it goes to, its outcome,
  // and its own buffer: a get lands in `own` and is copied to `dst` only if it completes
  // within its patience; a put or an atomic reads from it. So an operation can be left in
  // flight (stalled) without writing into, or reading from, a caller's memory afterwards.
  struct Op {
    int unit = -1;
    Conn* conn = nullptr;
    Req req[2];
    bool done = false;
    bool ok = false;
    std::vector<std::byte> own;
    std::span<std::byte> dst;
    uint64_t operand = 0;
    uint64_t result = 0;
    bool is_put = false;
    Clock::time_point expires;  // issued + op_timeout_s + bytes at the floor rate

    // True once every request is complete; the first time, sets ok and fails the connection
    // on an error.
    bool settle() {
      if (done) return true;
      bool complete = true;
      for (Req& r : req) complete = r.test() && complete;
      if (!complete) return false;
      done = true;
      ok = req[0].status == UCS_OK && req[1].status == UCS_OK;
      if (!ok) conn->fail_with(ucs_status_string(req[0].status != UCS_OK ? req[0].status : req[1].status));
      return true;
    }
  };
  using Ops = std::vector<std::unique_ptr<Op>>;

  double seconds_for(size_t bytes) const { return static_cast<double>(bytes) / floor_bytes_per_s; }

  std::unique_ptr<Op> new_op(int u, Conn& c, size_t bytes) {
    auto op = std::make_unique<Op>();
    op->unit = u;
    op->conn = &c;
    op->own.resize(bytes);
    op->expires = after(op_timeout_s + seconds_for(bytes));
    return op;
  }

  // A stalled operation that completed is dropped (its result came too late to be used; the
  // unit's operations are accepted again once none is left); one past its timeout fails the
  // connection: reap() reports the unit lost and force-closes its endpoint.
  void settle_stalled(Conn& c, Clock::time_point now) {
    std::erase_if(c.stalled, [](const std::unique_ptr<Op>& op) { return op->settle(); });
    for (const auto& op : c.stalled) expire(c, *op, now);
    for (const auto& [ticket, op] : c.transfers)
      if (!op->settle()) expire(c, *op, now);
  }
  void expire(Conn& c, const Op& op, Clock::time_point now) {
    if (now >= op.expires)
      c.fail_with(fmt::format("operation timed out after {:.1f} s (link down, or peer not progressing)",
                              op_timeout_s + seconds_for(op.own.size())));
  }

  // Waits for every op, at most their patience (patience_s + their bytes at the floor rate):
  // one silent unit must not hold up the syncer's work with the others. An op still in
  // flight then moves (pointer and buffers) to its connection's stalled list, leaving null in
  // `ops`; completed gets are copied out to their destination. ok(ops, i) says how op i went.
  void finish(Ops& ops, size_t total_bytes) {
    wait([&] {
      bool all = true;
      for (auto& op : ops) all = op->settle() && all;
      return all;
    }, after(patience_s + seconds_for(total_bytes)));
    for (auto& op : ops) {
      if (op->done) {
        if (op->ok && !op->dst.empty()) std::memcpy(op->dst.data(), op->own.data(), op->dst.size());
        continue;
      }
      Conn& c = *op->conn;
      c.stalled.push_back(std::move(op));
    }
  }
  static bool ok(const Ops& ops, size_t i) { return ops[i] != nullptr && ops[i]->ok; }

  template <typename Done>
  bool wait(Done&& done, Clock::time_point deadline) {
    for (;;) {
      progress();
      if (done()) return true;
      if (Clock::now() >= deadline) return false;
      sleep_on(worker, efd, poll_ms(deadline, 100));
    }
  }

  // The unit's connection if an operation may be issued to it now: admitted, not failed, and
  // no operation of it stalled.
  Conn* ready(int u) const {
    Conn* c = usable(u);
    return c != nullptr && c->stalled.empty() ? c : nullptr;
  }

  // A put from the op's own copy of `src`, and a flush: the put's completion is local (the
  // source may be reused), the flush's is remote.
  void issue_put(Conn& c, Op& op, size_t offset, std::span<const std::byte> src) {
    op.is_put = true;
    std::memcpy(op.own.data(), src.data(), src.size());
    ucp_request_param_t p{};
    op.req[0] = Req::of(ucp_put_nbx(c.ep, op.own.data(), op.own.size(), c.base + offset, c.rkey, &p));
    if (op.req[0].ptr != nullptr || op.req[0].status == UCS_OK)
      op.req[1] = Req::of(ucp_ep_flush_nbx(c.ep, &p));
  }
  Ticket start(Conn& c, std::unique_ptr<Op> op);

  std::unique_ptr<Op> issue_get(int u, Conn& c, size_t offset, std::span<std::byte> dst) {
    auto op = new_op(u, c, dst.size());
    op->dst = dst;
    ucp_request_param_t p{};
    op->req[0] = Req::of(ucp_get_nbx(c.ep, op->own.data(), op->own.size(), c.base + offset, c.rkey, &p));
    return op;
  }
};

UcxSyncerLink::UcxSyncerLink(const std::string& bind_ip, int port, int units)
    : impl_(std::make_unique<Impl>()) {
  if (units <= 0) fail("UCX link: units must be positive (got {})", units);
  Impl& s = *impl_;
  s.units = units;
  s.unit_conn.assign(static_cast<size_t>(units), nullptr);
  const sockaddr_storage addr = resolve(bind_ip, port, true);
  s.context = create_context("ddiloco-syncer", is_loopback(addr));
  try {
    s.worker = create_worker(s.context, &s.efd);
    set_am_handler(s.worker, kAmHello, &Impl::on_hello, &s);
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    lp.sockaddr.addrlen = sockaddr_len(addr);
    lp.conn_handler.cb = &Impl::on_conn_request;
    lp.conn_handler.arg = &s;
    const ucs_status_t st = ucp_listener_create(s.worker, &lp, &s.listener);
    if (st != UCS_OK)
      fail("UCX link: cannot listen on {}: {}", format_address(addr), ucs_status_string(st));
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    check(ucp_listener_query(s.listener, &attr), "listener_query");
    s.address = format_address(attr.sockaddr);
  } catch (...) {
    if (s.listener != nullptr) ucp_listener_destroy(s.listener);
    if (s.worker != nullptr) ucp_worker_destroy(s.worker);
    ucp_cleanup(s.context);
    throw;
  }
}

UcxSyncerLink::~UcxSyncerLink() { close(); }

std::string UcxSyncerLink::address() const { return impl_->address; }

int UcxSyncerLink::units() const { return impl_->units; }

bool UcxSyncerLink::connected(int u) const { return impl_->usable(u) != nullptr; }

size_t UcxSyncerLink::bytes(int u) const {
  const Impl::Conn* c = impl_->usable(u);
  return c != nullptr ? c->bytes : 0;
}

void UcxSyncerLink::set_min_rate(double bytes_per_s) {
  if (!(bytes_per_s > 0)) fail("UCX link: minimum rate must be positive (got {} B/s)", bytes_per_s);
  impl_->floor_bytes_per_s = bytes_per_s;
}

void UcxSyncerLink::set_op_timeout(double seconds) {
  if (!(seconds > 0)) fail("UCX link: operation timeout must be positive (got {})", seconds);
  impl_->op_timeout_s = seconds;
}

std::vector<UcxSyncerLink::Pending> UcxSyncerLink::accept_pending() {
  Impl& s = *impl_;
  std::vector<Pending> out;
  if (s.closed) return out;
  s.progress();
  s.reap();
  for (auto& [id, c] : s.conns) {
    if (c->state != Impl::State::pending || c->failed) continue;
    c->state = Impl::State::reported;
    out.push_back(Pending{id, c->payload, c->bytes, c->peer});
  }
  return out;
}

void UcxSyncerLink::admit(int64_t id, int unit) {
  Impl& s = *impl_;
  const auto it = s.conns.find(id);
  if (s.closed || it == s.conns.end() || it->second->state != Impl::State::reported)
    fail("UCX link: admit: connection {} is not pending", id);
  if (unit < 0 || unit >= s.units)
    fail("UCX link: admit: unit {} out of range 0..{}", unit, s.units - 1);
  s.progress();
  s.reap();  // a previous, failed connection of the unit becomes a loss first ...
  if (s.usable(unit) != nullptr)
    fail("UCX link: admit: unit {} is connected (disconnect it first)", unit);
  // ... which this admission supersedes: the caller admits the unit afresh.
  std::erase_if(s.lost, [&](const Lost& l) { return l.unit == unit; });
  Impl::Conn& c = *it->second;
  if (c.failed) {
    // Died between accept_pending() and now: admitted and lost at once.
    s.lost.push_back(Lost{unit, c.reason});
    s.start_close(id, true);
    return;
  }
  const ucs_status_t st = ucp_ep_rkey_unpack(c.ep, c.rkey_buf.data(), &c.rkey);
  if (st != UCS_OK) {
    c.rkey = nullptr;
    refuse(id, "malformed remote key");
    fail("UCX link: admit: cannot unpack the remote key of connection {} ({}): {}", id, c.peer,
         ucs_status_string(st));
  }
  c.rkey_buf.clear();
  c.state = Impl::State::admitted;
  c.unit = unit;
  s.unit_conn[static_cast<size_t>(unit)] = &c;
  c.reply = ReplyHeader{kMagic, kAdmitted, c.nonce};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_EAGER;
  c.reply_req = Req::of(ucp_am_send_nbx(c.ep, kAmReply, &c.reply, sizeof c.reply, nullptr, 0, &p));
  if (c.reply_req.ptr == nullptr && c.reply_req.status != UCS_OK)
    c.fail_with(ucs_status_string(c.reply_req.status));
  s.progress();
}

void UcxSyncerLink::refuse(int64_t id, const std::string& reason) {
  Impl& s = *impl_;
  const auto it = s.conns.find(id);
  if (s.closed || it == s.conns.end() || it->second->state != Impl::State::reported)
    fail("UCX link: refuse: connection {} is not pending", id);
  Impl::Conn& c = *it->second;
  c.rkey_buf.clear();  // never unpacked: a refused peer keeps no access
  if (!c.failed) {
    c.reply = ReplyHeader{kMagic, kRefused, c.nonce};
    c.reply_text = reason;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    c.reply_req = Req::of(ucp_am_send_nbx(c.ep, kAmReply, &c.reply, sizeof c.reply,
                                          c.reply_text.data(), c.reply_text.size(), &p));
  }
  // A graceful close flushes the reply out before the disconnect.
  s.start_close(id, false);
  s.progress();
  s.progress_closing();
}

std::vector<UcxSyncerLink::Lost> UcxSyncerLink::take_lost() {
  Impl& s = *impl_;
  if (!s.closed) {
    s.progress();
    s.reap();
  }
  std::vector<Lost> out;
  out.swap(s.lost);
  return out;
}

void UcxSyncerLink::disconnect(int unit) {
  Impl& s = *impl_;
  Impl::Conn* c = s.usable(unit);
  if (c == nullptr) return;
  s.lost.push_back(Lost{unit, "closed"});
  s.start_close(c->id, false);
  s.progress();
  s.progress_closing();
}

void UcxSyncerLink::get_all(std::span<Read> reads) {
  Impl& s = *impl_;
  if (!s.closed) s.refresh();
  Impl::Ops ops;
  std::vector<size_t> index;  // reads[index[i]] is ops[i]
  size_t total = 0;
  for (Read& r : reads) {  // check every request before issuing any
    r.ok = false;
    if (const Impl::Conn* c = s.usable(r.unit)) Impl::check_range(*c, r.unit, r.offset, r.dst.size());
  }
  for (size_t i = 0; i < reads.size(); ++i) {
    Read& r = reads[i];
    Impl::Conn* c = s.ready(r.unit);
    if (c == nullptr) continue;
    if (r.dst.empty()) {
      r.ok = true;
      continue;
    }
    ops.push_back(s.issue_get(r.unit, *c, r.offset, r.dst));
    index.push_back(i);
    total += r.dst.size();
  }
  if (ops.empty()) return;
  s.finish(ops, total);
  for (size_t i = 0; i < ops.size(); ++i) reads[index[i]].ok = Impl::ok(ops, i);
}

bool UcxSyncerLink::get(int u, size_t offset, std::span<std::byte> dst) {
  Read r{u, offset, dst};
  get_all(std::span<Read>(&r, 1));
  return r.ok;
}

bool UcxSyncerLink::put(int u, size_t offset, std::span<const std::byte> src) {
  Impl& s = *impl_;
  if (!s.closed) s.refresh();
  if (const Impl::Conn* c = s.usable(u)) Impl::check_range(*c, u, offset, src.size());
  Impl::Conn* c = s.ready(u);
  if (c == nullptr) return false;
  if (src.empty()) return true;
  Impl::Ops ops;
  ops.push_back(s.new_op(u, *c, src.size()));
  s.issue_put(*c, *ops[0], offset, src);
  s.finish(ops, src.size());
  return Impl::ok(ops, 0);
}

RemoteMemory::Ticket UcxSyncerLink::Impl::start(Conn& c, std::unique_ptr<Op> op) {
  const Ticket t = next_ticket++;
  ticket_conn[t] = c.id;
  c.transfers.emplace(t, std::move(op));
  return t;
}

RemoteMemory::Ticket UcxSyncerLink::start_get(int u, size_t offset, size_t bytes) {
  Impl& s = *impl_;
  if (!s.closed) s.refresh();
  if (const Impl::Conn* c = s.usable(u)) Impl::check_range(*c, u, offset, bytes);
  Impl::Conn* c = s.ready(u);
  if (c == nullptr) return 0;
  auto op = s.new_op(u, *c, bytes);
  ucp_request_param_t p{};
  if (bytes > 0)
    op->req[0] = Req::of(ucp_get_nbx(c->ep, op->own.data(), op->own.size(), c->base + offset, c->rkey, &p));
  return s.start(*c, std::move(op));
}

RemoteMemory::Ticket UcxSyncerLink::start_put(int u, size_t offset, std::span<const std::byte> src) {
  Impl& s = *impl_;
  if (!s.closed) s.refresh();
  if (const Impl::Conn* c = s.usable(u)) Impl::check_range(*c, u, offset, src.size());
  Impl::Conn* c = s.ready(u);
  if (c == nullptr) return 0;
  auto op = s.new_op(u, *c, src.size());
  s.issue_put(*c, *op, offset, src);
  return s.start(*c, std::move(op));
}

RemoteMemory::Status UcxSyncerLink::test(Ticket ticket, std::span<std::byte> dst) {
  Impl& s = *impl_;
  if (!s.closed) s.refresh();
  const auto at = s.ticket_conn.find(ticket);
  if (at == s.ticket_conn.end()) return Status::failed;
  const auto conn = s.conns.find(at->second);
  Impl::Conn* c = conn == s.conns.end() ? nullptr : conn->second.get();
  const auto it = c == nullptr ? decltype(c->transfers)::iterator{} : c->transfers.find(ticket);
  if (c == nullptr || it == c->transfers.end() || c->failed) {  // lost: a forced close purges it
    s.ticket_conn.erase(at);
    return Status::failed;
  }
  Impl::Op& op = *it->second;
  if (!op.settle()) return Status::running;
  if (op.ok && !op.is_put && !op.own.empty()) {
    if (dst.size() != op.own.size())
      fail("UCX link: transfer {} read {} bytes into a buffer of {}", ticket, op.own.size(), dst.size());
    std::memcpy(dst.data(), op.own.data(), dst.size());
  }
  const Status result = op.ok ? Status::done : Status::failed;
  c->transfers.erase(it);
  s.ticket_conn.erase(at);
  return result;
}

void UcxSyncerLink::abandon(Ticket ticket) {
  Impl& s = *impl_;
  const auto at = s.ticket_conn.find(ticket);
  if (at == s.ticket_conn.end()) return;
  const auto conn = s.conns.find(at->second);
  s.ticket_conn.erase(at);
  if (conn == s.conns.end()) return;
  Impl::Conn& c = *conn->second;
  const auto it = c.transfers.find(ticket);
  if (it == c.transfers.end()) return;
  // Still running: it keeps its buffers, as a stalled operation (new ones wait for it).
  if (!it->second->settle()) c.stalled.push_back(std::move(it->second));
  c.transfers.erase(it);
}

// A fetching atomic's reply comes back once the target performed it, so it is complete at the
// target on completion (no flush needed).
bool UcxSyncerLink::Impl::atomic_word(int u, size_t offset, ucp_atomic_op_t opcode,
                                      uint64_t operand, uint64_t& old) {
  if (!closed) refresh();
  if (const Conn* c = usable(u)) check_word(*c, u, offset);
  Conn* c = ready(u);
  if (c == nullptr) return false;
  Ops ops;
  ops.push_back(new_op(u, *c, 0));
  Op& op = *ops[0];
  op.operand = operand;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER;
  p.datatype = ucp_dt_make_contig(8);
  p.reply_buffer = &op.result;
  op.req[0] = Req::of(ucp_atomic_op_nbx(c->ep, opcode, &op.operand, 1, c->base + offset, c->rkey, &p));
  finish(ops, 8);
  if (!ok(ops, 0)) return false;
  old = ops[0]->result;
  return true;
}

bool UcxSyncerLink::put_word(int u, size_t offset, int64_t value) {
  uint64_t old = 0;
  return impl_->atomic_word(u, offset, UCP_ATOMIC_OP_SWAP, static_cast<uint64_t>(value), old);
}

bool UcxSyncerLink::fetch_word(int u, size_t offset, int64_t& value) {
  uint64_t result = 0;
  if (!impl_->atomic_word(u, offset, UCP_ATOMIC_OP_ADD, 0, result)) return false;
  value = static_cast<int64_t>(result);
  return true;
}

void UcxSyncerLink::close() {
  if (!impl_ || impl_->closed) return;
  Impl& s = *impl_;
  s.progress();
  // Transfers still on their way end first (bounded): a put that reaches a unit after its
  // endpoint failed makes UCX 1.13 abort that unit (its software RMA cannot send the put's
  // completion: "ucp_request.inl Fatal: unexpected error"), and the unit must outlive us.
  s.wait(
      [&] {
        s.reap();
        for (const auto& [id, c] : s.conns) {
          if (c->failed) continue;
          for (const auto& [ticket, op] : c->transfers)
            if (!op->settle()) return false;
          for (const auto& op : c->stalled)
            if (!op->settle()) return false;
        }
        return true;
      },
      after(2));
  for (auto& [id, c] : s.conns) {  // ended ones are not in flight: the closes stay graceful
    std::erase_if(c->transfers, [](auto& t) { return t.second->settle(); });
    std::erase_if(c->stalled, [](auto& op) { return op->settle(); });
  }
  std::vector<int64_t> ids;
  for (const auto& [id, c] : s.conns) ids.push_back(id);
  for (int64_t id : ids) s.start_close(id, false);
  if (s.listener != nullptr) ucp_listener_destroy(s.listener);
  s.listener = nullptr;
  // Graceful closes need the peers' answers; bounded, then whatever is left is abandoned.
  s.wait(
      [&] {
        s.progress_closing();
        return s.closing.empty();
      },
      after(2));
  for (Impl::Closing& c : s.closing) {
    c.req.release();
    c.conn->reply_req.release();
    for (auto& op : c.conn->stalled)
      for (Req& r : op->req) r.release();
    for (auto& [ticket, op] : c.conn->transfers)
      for (Req& r : op->req) r.release();
  }
  s.closed = true;
  ucp_worker_destroy(s.worker);
  ucp_cleanup(s.context);
  s.closing.clear();  // after the worker: a stalled get's buffer outlives its request
  s.worker = nullptr;
  s.context = nullptr;
  s.unit_conn.assign(s.unit_conn.size(), nullptr);
}

}  // namespace ddiloco::comm
