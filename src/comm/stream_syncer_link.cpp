// The secure link's syncer side (stream_link.hpp): an acceptor that authenticates connections
// under a cap and a deadline, and one thread per admitted unit that carries the syncer's reads
// and writes to it as requests.
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "comm/stream_link.hpp"
#include "ddiloco/link_auth.hpp"

namespace ddiloco::comm {

namespace {

using Clock = std::chrono::steady_clock;

Deadline after(double s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

void wake(int fd) {
  const uint64_t one = 1;
  (void)!::write(fd, &one, sizeof one);
}

void drain(int fd) {
  uint64_t n = 0;
  (void)!::read(fd, &n, sizeof n);
}

int make_eventfd() {
  const int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) fail("secure link: eventfd: {}", std::strerror(errno));
  return fd;
}

// One read or write of a unit's window, owned jointly by the caller (until it stops waiting)
// and the unit's thread (until it is carried out): its buffer is never the caller's.
struct Op {
  wire::Op kind;
  uint64_t offset = 0, arg = 0;  // arg: a get's or put's size, a swap's value
  std::vector<std::byte> own;    // a put's bytes, a get's result
  uint64_t result = 0;           // a swap's or fetch's old word
  double limit_s = 0;            // the operation timeout, its bytes at the minimum rate included
  enum class State { queued, done, failed } state = State::queued;
  bool finished() const { return state != State::queued; }
};
using OpPtr = std::shared_ptr<Op>;

struct Conn {
  enum class State { pending, reported, admitted };
  int64_t id = 0;
  std::string peer;
  std::unique_ptr<Stream> stream;
  auth::Answer answer;
  uint64_t bytes = 0;
  std::string hello;
  State state = State::pending;
  int unit = -1;
  // Admitted: the unit's thread and its queue.
  std::thread io;
  int wake = -1;
  std::deque<OpPtr> queue;
  bool stop = false, failed = false, ended = false;
  std::string reason;
  std::vector<OpPtr> stalled;  // outlived their caller's patience, still queued
  ~Conn() {
    if (wake >= 0) ::close(wake);
  }
};

// A handshake in progress: its thread, and the socket close() shuts down to end it.
struct Shake {
  std::thread thread;
  int fd = -1;         // a duplicate of the socket's descriptor, ours until the Shake is reaped
  std::string source;  // the peer's address without the port
  bool done = false;
  ~Shake() {
    if (fd >= 0) ::close(fd);
  }
};

// "ip" of "ip:port" or "[ipv6]:port".
std::string source_of(const std::string& peer) {
  return peer.substr(0, peer.rfind(':'));
}

class StreamSyncerLink final : public SyncerEnd {
 public:
  StreamSyncerLink(bool tls, const std::string& secret, const std::string& ip, int port, int units)
      : tls_(tls), key_(auth::link_key(secret)), psk_(auth::tls_psk(secret)), listener_(ip, port),
        units_(units), unit_conn_(static_cast<size_t>(units), nullptr), acceptor_wake_(make_eventfd()) {
    if (units <= 0) fail("secure link: units must be positive (got {})", units);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~StreamSyncerLink() override {
    close();
    ::close(acceptor_wake_);
  }

  std::string address() const override { return listener_.address(); }
  int units() const override { return units_; }
  void set_op_timeout(double s) override {
    if (!(s > 0)) fail("secure link: operation timeout must be positive (got {})", s);
    op_timeout_s_ = s;
  }
  void set_min_rate(double r) override {
    if (!(r > 0)) fail("secure link: minimum rate must be positive (got {} B/s)", r);
    min_rate_ = r;
  }
  std::vector<std::pair<std::string, int64_t>> take_refusals() override {
    std::lock_guard lock(m_);
    std::vector<std::pair<std::string, int64_t>> out(refusals_.begin(), refusals_.end());
    refusals_.clear();
    return out;
  }

  std::vector<Pending> accept_pending() override;
  void admit(int64_t id, int unit) override;
  void refuse(int64_t id, const std::string& reason) override;
  std::vector<Lost> take_lost() override;
  void disconnect(int unit) override;

  bool connected(int u) const override {
    std::lock_guard lock(m_);
    return usable(u) != nullptr;
  }
  void get_all(std::span<Read> reads) override;
  bool get(int u, size_t offset, std::span<std::byte> dst) override {
    Read r{u, offset, dst};
    get_all(std::span<Read>(&r, 1));
    return r.ok;
  }
  bool put(int u, size_t offset, std::span<const std::byte> src) override;
  bool put_word(int u, size_t offset, int64_t value) override {
    uint64_t old = 0;
    return word(u, offset, wire::kSwap, static_cast<uint64_t>(value), old);
  }
  bool fetch_word(int u, size_t offset, int64_t& value) override {
    uint64_t v = 0;
    if (!word(u, offset, wire::kFetch, 0, v)) return false;
    value = static_cast<int64_t>(v);
    return true;
  }
  Ticket start_get(int u, size_t offset, size_t bytes) override;
  Ticket start_put(int u, size_t offset, std::span<const std::byte> src) override;
  Status test(Ticket ticket, std::span<std::byte> dst) override;
  void abandon(Ticket ticket) override;
  void close() override;

 private:
  void accept_loop();
  void start_handshake(std::unique_ptr<Stream> stream);
  void handshake(std::unique_ptr<Stream> stream, Shake* shake);
  void count_refusal(const std::string& why) { ++refusals_[why]; }
  void reap_shakes(bool all);
  void serve(Conn& c);
  void carry_out(Conn& c, Op& op);
  void fail_conn(Conn& c, const std::string& why);
  Conn* usable(int u) const {
    if (closed_ || u < 0 || u >= units_) return nullptr;
    Conn* c = unit_conn_[static_cast<size_t>(u)];
    return c != nullptr && !c->failed ? c : nullptr;
  }
  Conn* ready(int u) {
    Conn* c = usable(u);
    if (c == nullptr) return nullptr;
    std::erase_if(c->stalled, [](const OpPtr& op) { return op->finished(); });
    return c->stalled.empty() ? c : nullptr;
  }
  void check_range(int u, size_t offset, size_t n) const;
  OpPtr enqueue(Conn& c, wire::Op kind, uint64_t offset, uint64_t arg, std::span<const std::byte> data);
  bool wait_for(const std::vector<std::pair<Conn*, OpPtr>>& ops, double patience_s);
  bool word(int u, size_t offset, wire::Op kind, uint64_t operand, uint64_t& old);
  void end_conns(std::vector<std::unique_ptr<Conn>> ended);
  std::vector<std::unique_ptr<Conn>> reap_failed();

  const bool tls_;
  const auth::Key key_, psk_;
  TcpListener listener_;
  const int units_;
  double op_timeout_s_ = 10, min_rate_ = 1e7;

  mutable std::mutex m_;
  std::condition_variable cv_;  // an operation finished
  std::map<int64_t, std::unique_ptr<Conn>> conns_;
  std::vector<Conn*> unit_conn_;
  std::vector<Lost> lost_;
  std::map<std::string, int64_t> refusals_;
  std::map<Ticket, std::pair<int64_t, OpPtr>> transfers_;
  Ticket next_ticket_ = 1;
  int64_t next_id_ = 1;
  bool closed_ = false;

  int acceptor_wake_ = -1;
  bool stopping_ = false;
  std::list<Shake> shakes_;
  std::thread acceptor_;  // last: started once the members above exist
};

// ---------------------------------------------------------------- accepting and judging

void StreamSyncerLink::accept_loop() {
  pollfd fds[2] = {{listener_.fd(), POLLIN, 0}, {acceptor_wake_, POLLIN, 0}};
  for (;;) {
    ::poll(fds, 2, 200);
    reap_shakes(false);
    {
      std::lock_guard lock(m_);
      if (stopping_) return;
    }
    for (int batch = 0; batch < 256; ++batch) {
      std::unique_ptr<Stream> stream;
      try {
        stream = listener_.accept();
      } catch (const std::exception& e) {
        // Out of descriptors or buffers: the connection stays queued and the listener
        // readable, so count it and wait a little instead of polling at once again.
        {
          std::lock_guard lock(m_);
          count_refusal(fmt::format("cannot accept ({})", e.what()));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        break;
      }
      if (!stream) break;
      start_handshake(std::move(stream));
    }
  }
}

// A handshake thread for one accepted connection, within the caps; otherwise the connection is
// counted and closed at once (after the lock is released: `refused` outlives it).
void StreamSyncerLink::start_handshake(std::unique_ptr<Stream> stream) {
  std::unique_ptr<Stream> refused;
  const std::string source = source_of(stream->peer());
  std::lock_guard lock(m_);
  int waiting = static_cast<int>(shakes_.size()), from_source = 0;
  for (const Shake& s : shakes_) from_source += s.source == source;
  for (const auto& [id, c] : conns_) {
    if (c->state == Conn::State::admitted) continue;
    ++waiting;
    from_source += source_of(c->peer) == source;
  }
  std::string why;
  if (waiting >= kMaxPending) why = fmt::format("over the pending-connection cap ({})", kMaxPending);
  else if (from_source >= kMaxPendingPerSource)
    why = fmt::format("over the pending-connection cap of one address ({})", kMaxPendingPerSource);
  const int fd = why.empty() ? ::fcntl(stream->fd(), F_DUPFD_CLOEXEC, 0) : -1;
  if (why.empty() && fd < 0) why = fmt::format("cannot accept ({})", std::strerror(errno));
  if (!why.empty()) {
    count_refusal(why);
    refused = std::move(stream);
    return;
  }
  Shake& s = shakes_.emplace_back();
  s.fd = fd;
  s.source = source;
  try {
    s.thread = std::thread([this, &s, st = std::move(stream)]() mutable { handshake(std::move(st), &s); });
  } catch (const std::system_error& e) {
    shakes_.pop_back();
    count_refusal(fmt::format("cannot start a handshake thread ({})", e.what()));
  }
}

void StreamSyncerLink::handshake(std::unique_ptr<Stream> stream, Shake* shake) {
  const Deadline deadline = after(kHandshakeS);
  std::string failure;
  try {
    if (tls_) stream = tls_server(std::move(stream), psk_, deadline);
    auth::Answer a = auth::challenge(*stream, key_, tls_ ? 2 : 1, kMaxHello + 8, deadline);
    auto c = std::make_unique<Conn>();
    c->peer = stream->peer();
    if (a.payload.size() < 8) {
      auth::verdict(*stream, key_, a, false, "malformed hello (no window size)", after(1));
      failure = "malformed hello";
    } else {
      std::memcpy(&c->bytes, a.payload.data(), 8);
      c->hello = a.payload.substr(8);
      c->answer = std::move(a);
      std::lock_guard lock(m_);
      shake->done = true;
      c->id = next_id_++;
      c->stream = std::move(stream);
      conns_.emplace(c->id, std::move(c));
      return;
    }
  } catch (const auth::NotAuthenticated&) {
    failure = "not authenticated (no proof of the run's secret)";
  } catch (const std::exception& e) {
    failure = Clock::now() >= deadline ? fmt::format("no handshake within {} s", kHandshakeS)
                                       : "handshake failed (TLS or the stream)";
  }
  std::lock_guard lock(m_);
  count_refusal(failure);
  shake->done = true;
  // The stream closes as this thread ends, outside the lock.
}

void StreamSyncerLink::reap_shakes(bool all) {
  std::list<Shake> finished;
  {
    std::lock_guard lock(m_);
    for (auto it = shakes_.begin(); it != shakes_.end();) {
      if (it->done || all) {
        if (all && !it->done) ::shutdown(it->fd, SHUT_RDWR);  // our duplicate: never a reused number
        finished.splice(finished.end(), shakes_, it++);
      } else {
        ++it;
      }
    }
  }
  for (Shake& s : finished) s.thread.join();
}

// Has the peer of this authenticated, unjudged connection hung up? A unit that gave up waiting
// for its verdict retries on a new connection; admitting the old one would make the retry
// look like a second process of the unit.
bool peer_hung_up(const Stream& stream) {
  pollfd p{stream.fd(), POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

std::vector<UnitListener::Pending> StreamSyncerLink::accept_pending() {
  std::vector<Pending> out;
  std::vector<std::unique_ptr<Conn>> gone;  // closed after the lock is released
  std::lock_guard lock(m_);
  if (closed_) return out;
  for (auto it = conns_.begin(); it != conns_.end();) {
    Conn& c = *it->second;
    if (c.state == Conn::State::pending && peer_hung_up(*c.stream)) {
      count_refusal("gone before its verdict");
      gone.push_back(std::move(it->second));
      it = conns_.erase(it);
      continue;
    }
    if (c.state == Conn::State::pending) {
      c.state = Conn::State::reported;
      out.push_back(Pending{it->first, c.hello, c.bytes, c.peer});
    }
    ++it;
  }
  return out;
}

void StreamSyncerLink::refuse(int64_t id, const std::string& reason) {
  std::unique_ptr<Conn> c;
  {
    std::lock_guard lock(m_);
    const auto it = conns_.find(id);
    if (closed_ || it == conns_.end() || it->second->state != Conn::State::reported)
      fail("secure link: refuse: connection {} is not pending", id);
    c = std::move(it->second);
    conns_.erase(it);
  }
  try {  // best effort: a peer that does not read its verdict is not waited for
    auth::verdict(*c->stream, key_, c->answer, false, reason, after(1));
  } catch (const std::exception&) {
  }
}

void StreamSyncerLink::admit(int64_t id, int unit) {
  std::vector<std::unique_ptr<Conn>> ended = reap_failed();  // an earlier connection's loss first
  end_conns(std::move(ended));
  std::lock_guard lock(m_);
  const auto it = conns_.find(id);
  if (closed_ || it == conns_.end() || it->second->state != Conn::State::reported)
    fail("secure link: admit: connection {} is not pending", id);
  if (unit < 0 || unit >= units_) fail("secure link: admit: unit {} out of range 0..{}", unit, units_ - 1);
  if (usable(unit) != nullptr) fail("secure link: admit: unit {} is connected (disconnect it first)", unit);
  std::erase_if(lost_, [&](const Lost& l) { return l.unit == unit; });
  Conn& c = *it->second;
  c.wake = make_eventfd();  // may throw: the connection is still pending, to be refused
  c.state = Conn::State::admitted;
  c.unit = unit;
  unit_conn_[static_cast<size_t>(unit)] = &c;
  try {
    c.io = std::thread([this, &c] { serve(c); });
  } catch (const std::system_error& e) {  // out of threads: back to pending, nothing half-admitted
    unit_conn_[static_cast<size_t>(unit)] = nullptr;
    c.state = Conn::State::reported;
    c.unit = -1;
    fail("secure link: admit: cannot start a thread for unit {} ({}): {}", unit, c.peer, e.what());
  }
}

// ---------------------------------------------------------------- a unit's thread

void StreamSyncerLink::fail_conn(Conn& c, const std::string& why) {
  if (!c.failed) c.reason = why;
  c.failed = true;
  for (OpPtr& op : c.queue) op->state = Op::State::failed;
  c.queue.clear();
  cv_.notify_all();
}

void StreamSyncerLink::serve(Conn& c) {
  try {
    auth::verdict(*c.stream, key_, c.answer, true, "", after(kHandshakeS));
  } catch (const std::exception& e) {
    std::lock_guard lock(m_);
    fail_conn(c, e.what());
    c.ended = true;
    return;
  }
  for (;;) {
    OpPtr op;
    {
      std::lock_guard lock(m_);
      if (c.failed || (c.stop && c.queue.empty())) {
        if (!c.failed) fail_conn(c, "closed");
        c.ended = true;
        return;
      }
      if (!c.queue.empty()) op = c.queue.front();
    }
    if (op) {
      std::string error;
      try {
        carry_out(c, *op);
      } catch (const std::exception& e) {
        error = e.what();
      }
      std::lock_guard lock(m_);
      if (!error.empty()) {
        fail_conn(c, error);
        continue;
      }
      op->state = Op::State::done;
      c.queue.pop_front();
      cv_.notify_all();
      continue;
    }
    // Idle: the unit has nothing to say until asked; bytes or the end of the stream now mean
    // it is gone (or misbehaves).
    if (c.stream->wait_readable(200, c.wake)) {
      std::string why = "the unit sent bytes it was not asked for";
      try {
        std::byte b[1];
        c.stream->read_exact(b, after(1));
      } catch (const std::exception& e) {
        why = e.what();
      }
      std::lock_guard lock(m_);
      fail_conn(c, why);
      continue;
    }
    drain(c.wake);
  }
}

void StreamSyncerLink::carry_out(Conn& c, Op& op) {
  const Deadline deadline = after(op.limit_s);
  std::byte head[wire::kRequestBytes] = {};
  const uint32_t kind = op.kind;
  std::memcpy(head, &kind, 4);
  std::memcpy(head + 8, &op.offset, 8);
  std::memcpy(head + 16, &op.arg, 8);
  try {
    c.stream->write_all(head, deadline);
    if (op.kind == wire::kPut) c.stream->write_all(op.own, deadline);
    std::byte reply[wire::kReplyBytes];
    c.stream->read_exact(reply, deadline);
    uint32_t status;
    std::memcpy(&status, reply, 4);
    if (status != 0) fail("the unit answered status {}", status);
    std::memcpy(&op.result, reply + 8, 8);
    if (op.kind == wire::kGet) c.stream->read_exact(op.own, deadline);
  } catch (const std::exception& e) {
    if (Clock::now() >= deadline) fail("operation timed out after {:.1f} s", op.limit_s);
    throw;
  }
}

// ---------------------------------------------------------------- operations

void StreamSyncerLink::check_range(int u, size_t offset, size_t n) const {
  const Conn* c = usable(u);
  if (c == nullptr) return;
  if (offset > c->bytes || n > c->bytes - offset)
    fail("secure link: {} bytes at offset {} are outside unit {}'s memory of {} bytes", n, offset, u, c->bytes);
}

OpPtr StreamSyncerLink::enqueue(Conn& c, wire::Op kind, uint64_t offset, uint64_t arg,
                                std::span<const std::byte> data) {
  auto op = std::make_shared<Op>();
  op->kind = kind;
  op->offset = offset;
  op->arg = arg;
  const size_t n = kind == wire::kGet || kind == wire::kPut ? arg : 8;
  if (kind == wire::kGet) op->own.resize(arg);
  if (kind == wire::kPut) op->own.assign(data.begin(), data.end());
  op->limit_s = op_timeout_s_ + static_cast<double>(n) / min_rate_;
  c.queue.push_back(op);
  wake(c.wake);
  return op;
}

// Waits (without the lock held while asleep) until every op finished or the patience passed;
// the unfinished ones become their units' stalled operations. True when all are done.
bool StreamSyncerLink::wait_for(const std::vector<std::pair<Conn*, OpPtr>>& ops, double patience_s) {
  std::unique_lock lock(m_);
  cv_.wait_until(lock, after(patience_s), [&] {
    return std::all_of(ops.begin(), ops.end(), [](const auto& o) { return o.second->finished(); });
  });
  bool all = true;
  for (const auto& [c, op] : ops) {
    if (!op->finished()) c->stalled.push_back(op);
    all = all && op->state == Op::State::done;
  }
  return all;
}

void StreamSyncerLink::get_all(std::span<Read> reads) {
  std::vector<std::pair<Conn*, OpPtr>> ops;
  std::vector<size_t> index;
  size_t total = 0;
  {
    std::lock_guard lock(m_);
    for (Read& r : reads) {
      r.ok = false;
      check_range(r.unit, r.offset, r.dst.size());
    }
    for (size_t i = 0; i < reads.size(); ++i) {
      Conn* c = ready(reads[i].unit);
      if (c == nullptr) continue;
      if (reads[i].dst.empty()) {
        reads[i].ok = true;
        continue;
      }
      ops.emplace_back(c, enqueue(*c, wire::kGet, reads[i].offset, reads[i].dst.size(), {}));
      index.push_back(i);
      total += reads[i].dst.size();
    }
  }
  if (ops.empty()) return;
  wait_for(ops, 0.25 + static_cast<double>(total) / min_rate_);
  std::lock_guard lock(m_);
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = *ops[i].second;
    if (op.state != Op::State::done) continue;
    std::memcpy(reads[index[i]].dst.data(), op.own.data(), op.own.size());
    reads[index[i]].ok = true;
  }
}

bool StreamSyncerLink::put(int u, size_t offset, std::span<const std::byte> src) {
  OpPtr op;
  Conn* c = nullptr;
  {
    std::lock_guard lock(m_);
    check_range(u, offset, src.size());
    c = ready(u);
    if (c == nullptr) return false;
    if (src.empty()) return true;
    op = enqueue(*c, wire::kPut, offset, src.size(), src);
  }
  return wait_for({{c, op}}, 0.25 + static_cast<double>(src.size()) / min_rate_);
}

bool StreamSyncerLink::word(int u, size_t offset, wire::Op kind, uint64_t operand, uint64_t& old) {
  OpPtr op;
  Conn* c = nullptr;
  {
    std::lock_guard lock(m_);
    if (usable(u) != nullptr && (offset % 8 != 0 || offset + 8 > usable(u)->bytes))
      fail("secure link: word at offset {} of unit {} is unaligned or outside its memory", offset, u);
    c = ready(u);
    if (c == nullptr) return false;
    op = enqueue(*c, kind, offset, operand, {});
  }
  if (!wait_for({{c, op}}, 0.25)) return false;
  old = op->result;
  return true;
}

RemoteMemory::Ticket StreamSyncerLink::start_get(int u, size_t offset, size_t bytes) {
  std::lock_guard lock(m_);
  check_range(u, offset, bytes);
  Conn* c = ready(u);
  if (c == nullptr) return 0;
  const Ticket t = next_ticket_++;
  transfers_[t] = {c->id, enqueue(*c, wire::kGet, offset, bytes, {})};
  return t;
}

RemoteMemory::Ticket StreamSyncerLink::start_put(int u, size_t offset, std::span<const std::byte> src) {
  std::lock_guard lock(m_);
  check_range(u, offset, src.size());
  Conn* c = ready(u);
  if (c == nullptr) return 0;
  const Ticket t = next_ticket_++;
  transfers_[t] = {c->id, enqueue(*c, wire::kPut, offset, src.size(), src)};
  return t;
}

RemoteMemory::Status StreamSyncerLink::test(Ticket ticket, std::span<std::byte> dst) {
  std::lock_guard lock(m_);
  const auto it = transfers_.find(ticket);
  if (it == transfers_.end()) return Status::failed;
  const Op& op = *it->second.second;
  if (!op.finished()) return Status::running;
  const bool done = op.state == Op::State::done;
  if (done && op.kind == wire::kGet && !op.own.empty()) {
    if (dst.size() != op.own.size())
      fail("secure link: transfer {} read {} bytes into a buffer of {}", ticket, op.own.size(), dst.size());
    std::memcpy(dst.data(), op.own.data(), dst.size());
  }
  transfers_.erase(it);
  return done ? Status::done : Status::failed;
}

void StreamSyncerLink::abandon(Ticket ticket) {
  std::lock_guard lock(m_);
  const auto it = transfers_.find(ticket);
  if (it == transfers_.end()) return;
  const auto [id, op] = it->second;
  transfers_.erase(it);
  const auto c = conns_.find(id);
  // Still queued: it stays the unit's (new operations wait until it is carried out).
  if (c != conns_.end() && !op->finished()) c->second->stalled.push_back(op);
}

// ---------------------------------------------------------------- losses and the end

std::vector<std::unique_ptr<Conn>> StreamSyncerLink::reap_failed() {
  std::vector<std::unique_ptr<Conn>> ended;
  std::lock_guard lock(m_);
  for (auto it = conns_.begin(); it != conns_.end();) {
    Conn& c = *it->second;
    if (c.state == Conn::State::admitted && c.failed) {
      if (unit_conn_[static_cast<size_t>(c.unit)] == &c) {
        lost_.push_back(Lost{c.unit, c.reason});
        unit_conn_[static_cast<size_t>(c.unit)] = nullptr;
      }
      ended.push_back(std::move(it->second));
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
  return ended;
}

// Joins the threads of connections that left conns_ (outside the lock: they take it).
void StreamSyncerLink::end_conns(std::vector<std::unique_ptr<Conn>> ended) {
  for (auto& c : ended) {
    if (!c->io.joinable()) continue;
    {
      std::lock_guard lock(m_);
      c->stop = true;
      if (!c->ended && c->failed) c->stream->shutdown();
    }
    wake(c->wake);
    c->io.join();
  }
}

std::vector<UnitListener::Lost> StreamSyncerLink::take_lost() {
  end_conns(reap_failed());
  std::lock_guard lock(m_);
  std::vector<Lost> out;
  out.swap(lost_);
  return out;
}

void StreamSyncerLink::disconnect(int unit) {
  {
    std::lock_guard lock(m_);
    Conn* c = usable(unit);
    if (c == nullptr) return;
    // Gracefully: what is queued is carried out first (each bounded by its timeout).
    c->stop = true;
    wake(c->wake);
  }
  std::unique_lock lock(m_);
  Conn* c = unit_conn_[static_cast<size_t>(unit)];
  cv_.wait(lock, [&] { return c->failed; });
  lock.unlock();
  end_conns(reap_failed());  // the next take_lost() reports it, reason "closed"
}

void StreamSyncerLink::close() {
  {
    std::lock_guard lock(m_);
    if (closed_) return;
    stopping_ = true;
  }
  wake(acceptor_wake_);
  acceptor_.join();
  reap_shakes(true);
  std::vector<std::unique_ptr<Conn>> all;
  {
    // Transfers still on their way end first, bounded, then every connection closes.
    std::unique_lock lock(m_);
    cv_.wait_until(lock, after(2), [&] {
      return std::all_of(conns_.begin(), conns_.end(), [](const auto& c) { return c.second->queue.empty(); });
    });
    for (auto& [id, c] : conns_) {
      c->stop = true;
      if (c->state == Conn::State::admitted) {
        fail_conn(*c, "closed");
        c->stream->shutdown();
      }
      all.push_back(std::move(c));
    }
    conns_.clear();
    unit_conn_.assign(unit_conn_.size(), nullptr);
    closed_ = true;
  }
  for (auto& c : all)
    if (c->io.joinable()) c->io.join();
}

}  // namespace

std::unique_ptr<SyncerEnd> make_stream_syncer_link(bool tls, const std::string& secret,
                                                   const std::string& bind_ip, int port, int units) {
  return std::make_unique<StreamSyncerLink>(tls, secret, bind_ip, port, units);
}

}  // namespace ddiloco::comm
