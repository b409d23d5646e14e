// The secure link's unit side (stream_link.hpp): the window, and the thread that serves the
// syncer's requests after checking each against the window.
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "comm/stream_link.hpp"
#include "ddiloco/link_auth.hpp"

namespace ddiloco::comm {

static_assert(std::endian::native == std::endian::little, "the link's integers are little-endian");

namespace {

using Clock = std::chrono::steady_clock;

Deadline after(double s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

uint64_t load_u64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// A request the window cannot serve: why, or "" when it can. `end` is checked without overflow.
std::string check_request(uint32_t op, uint64_t offset, uint64_t arg, size_t bytes) {
  switch (op) {
    case wire::kGet:
    case wire::kPut:
      if (offset > bytes || arg > bytes - offset)
        return fmt::format("{} of {} bytes at offset {} is outside the window of {} bytes",
                           op == wire::kGet ? "a read" : "a write", arg, offset, bytes);
      return "";
    case wire::kSwap:
    case wire::kFetch:
      if (offset % 8 != 0 || offset > bytes || bytes - offset < 8)
        return fmt::format("a word at offset {} is unaligned or outside the window of {} bytes", offset, bytes);
      return "";
    default:
      return fmt::format("unknown request {}", op);
  }
}

class StreamUnitLink final : public UnitEnd {
 public:
  StreamUnitLink(bool tls, size_t bytes) : tls_(tls), bytes_(bytes) {
    if (bytes == 0) fail("secure link: the window must have at least one byte");
    const size_t rounded = (bytes + 63) / 64 * 64;
    memory_ = static_cast<std::byte*>(std::aligned_alloc(64, rounded));
    if (memory_ == nullptr) fail("secure link: cannot allocate a window of {} bytes", bytes);
    std::memset(memory_, 0, rounded);
    wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_ < 0) fail("secure link: eventfd: {}", std::strerror(errno));
  }
  ~StreamUnitLink() override {
    close();
    ::close(wake_);
    std::free(memory_);
  }

  std::byte* base() override { return memory_; }
  size_t bytes() const override { return bytes_; }
  void sync() override { std::atomic_thread_fence(std::memory_order_seq_cst); }

  void close() override {
    std::lock_guard lock(connect_mutex_);
    end_serving();
    closed_ = true;
    std::lock_guard l(reason_mutex_);
    if (lost_reason_.empty()) lost_reason_ = "closed";
  }

  void connect(const std::string& addr, const std::string& secret, const std::string& payload,
               double timeout_s) override {
    std::lock_guard lock(connect_mutex_);
    if (closed_) fail("secure link: connect after close");
    if (connected_) fail("secure link: already connected to the syncer");
    end_serving();  // the previous connection's thread, which has ended
    const Deadline deadline = after(timeout_s);
    std::unique_ptr<Stream> stream = tcp_connect(addr, deadline);
    if (tls_) stream = tls_client(std::move(stream), auth::tls_psk(secret), deadline);
    // The window's size goes first: what the syncer checks against its layout before admitting.
    std::string answer(8, '\0');
    const uint64_t n = bytes_;
    std::memcpy(answer.data(), &n, 8);
    answer += payload;
    auth::answer(*stream, auth::link_key(secret), mode_byte(), answer, deadline);
    {
      std::lock_guard l(reason_mutex_);
      lost_reason_.clear();
    }
    uint64_t drain = 0;
    (void)!::read(wake_, &drain, sizeof drain);
    stream_ = std::move(stream);
    connected_ = true;
    try {
      server_ = std::thread([this] { serve(); });
    } catch (const std::system_error& e) {  // out of threads: not connected, and it says why
      connected_ = false;
      stream_.reset();
      fail("secure link: cannot start the thread that serves the syncer: {}", e.what());
    }
  }

  bool connected() const override { return connected_.load(); }
  std::string lost_reason() const override {
    std::lock_guard l(reason_mutex_);
    return lost_reason_;
  }

 private:
  uint8_t mode_byte() const { return tls_ ? 2 : 1; }

  void end_serving() {
    if (server_.joinable()) {
      const uint64_t one = 1;
      (void)!::write(wake_, &one, sizeof one);
      if (stream_) stream_->shutdown();
      server_.join();
    }
    stream_.reset();
    connected_ = false;
  }

  // The connection is over: the syncer sees its end at once (the stream itself is freed by
  // the next connect() or close()).
  void lose(const std::string& why) {
    {
      std::lock_guard l(reason_mutex_);
      if (lost_reason_.empty()) lost_reason_ = why;
    }
    stream_->shutdown();
    connected_ = false;
  }

  // Serves requests until the stream ends or close() wakes us. A request is read whole before
  // it is checked; a bad one ends the connection.
  void serve() {
    std::vector<std::byte> data;
    try {
      for (;;) {
        if (!stream_->wait_readable(100, wake_)) {
          uint64_t woken = 0;
          if (::read(wake_, &woken, sizeof woken) == sizeof woken) return lose("closed");
          continue;
        }
        std::byte head[wire::kRequestBytes];
        stream_->read_exact(head, after(30));
        uint32_t op;
        std::memcpy(&op, head, 4);
        const uint64_t offset = load_u64(head + 8), arg = load_u64(head + 16);
        const std::string bad = check_request(op, offset, arg, bytes_);
        if (!bad.empty()) return lose("the syncer sent a request the window refuses: " + bad);
        answer_request(op, offset, arg, data);
      }
    } catch (const std::exception& e) {
      lose(e.what());
    }
  }

  void answer_request(uint32_t op, uint64_t offset, uint64_t arg, std::vector<std::byte>& data) {
    std::byte reply[wire::kReplyBytes] = {};
    uint64_t value = 0;
    if (op == wire::kPut) {
      // Into a buffer first: a write that is cut off half-way never reaches the window.
      data.resize(arg);
      stream_->read_exact(data, after(30 + static_cast<double>(arg) / 1e6));
      std::memcpy(memory_ + offset, data.data(), arg);
    } else if (op == wire::kSwap || op == wire::kFetch) {
      std::atomic_ref<int64_t> word(*reinterpret_cast<int64_t*>(memory_ + offset));
      value = static_cast<uint64_t>(op == wire::kSwap ? word.exchange(static_cast<int64_t>(arg)) : word.load());
    }
    std::memcpy(reply + 8, &value, 8);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    stream_->write_all(reply, after(30));
    if (op == wire::kGet && arg > 0)
      stream_->write_all(std::span<const std::byte>(memory_ + offset, arg), after(30 + static_cast<double>(arg) / 1e6));
  }

  const bool tls_;
  const size_t bytes_;
  std::byte* memory_ = nullptr;
  int wake_ = -1;
  std::mutex connect_mutex_;  // connect() and close() against each other
  bool closed_ = false;
  std::unique_ptr<Stream> stream_;
  std::thread server_;
  std::atomic<bool> connected_{false};
  mutable std::mutex reason_mutex_;
  std::string lost_reason_;
};

}  // namespace

std::unique_ptr<UnitEnd> make_stream_unit_link(bool tls, size_t bytes) {
  return std::make_unique<StreamUnitLink>(tls, bytes);
}

}  // namespace ddiloco::comm
