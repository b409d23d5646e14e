// UCX (UCP) implementation of the learner ↔ syncer transport, the unit's side: see
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

// ================================================================= unit side

struct UcxUnitLink::Impl {
  // One connection attempt: the endpoint and the buffers of its hello, which must live until
  // the send completes (they move to the closing list with the endpoint).
  struct Attempt {
    ucp_ep_h ep = nullptr;
    HelloHeader hello{};
    std::vector<char> data;
    Req send;
    bool failed = false;
    std::string reason;
    bool replied = false;
    uint32_t reply_status = 0;
    std::string reply_text;
  };
  struct Closing {
    std::unique_ptr<Attempt> attempt;
    Req req;
    Clock::time_point deadline;
  };

  size_t bytes = 0;
  size_t map_len = 0;
  std::byte* mem = nullptr;

  std::thread thread;
  int wake_fd = -1;  // eventfd: connect() / close() wake the progress thread
  std::mutex task_mu;
  std::deque<std::packaged_task<void()>> tasks;
  std::atomic<bool> stop{false};
  bool thread_running = false;

  // Owned by the progress thread.
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  int efd = -1;
  ucp_mem_h memh = nullptr;
  std::vector<char> rkey;
  std::unique_ptr<Attempt> current;  // the admitted connection
  std::unique_ptr<Attempt> attempt;  // the one connect() is waiting on
  std::vector<Closing> closing;
  uint64_t nonce = 0;

  // Read by any thread.
  std::atomic<bool> is_connected{false};
  mutable std::mutex reason_mu;
  std::string reason;

  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* self = static_cast<Impl*>(arg);
    for (Attempt* a : {self->current.get(), self->attempt.get()}) {
      if (a == nullptr || a->ep != ep || a->failed) continue;
      a->failed = true;
      a->reason = ucs_status_string(status);
    }
    if (self->current && self->current->ep == ep) {
      std::lock_guard lock(self->reason_mu);
      self->reason = self->current->reason;
      self->is_connected = false;
    }
  }
  static ucs_status_t on_reply(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    ReplyHeader h{};
    if (header_length != sizeof h || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) return UCS_OK;
    std::memcpy(&h, header, sizeof h);
    Attempt* a = self->attempt.get();
    if (h.magic != kMagic || a == nullptr || a->replied || h.nonce != a->hello.nonce) return UCS_OK;
    a->replied = true;
    a->reply_status = h.status;
    a->reply_text.assign(static_cast<const char*>(data), length);
    return UCS_OK;
  }

  void init() {
    context = create_context("ddiloco-unit", false);
    worker = create_worker(context, &efd);
    set_am_handler(worker, kAmReply, &Impl::on_reply, this);
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = mem;
    mp.length = bytes;
    check(ucp_mem_map(context, &mp, &memh), "mem_map");
    void* buf = nullptr;
    size_t len = 0;
    check(ucp_rkey_pack(context, memh, &buf, &len), "rkey_pack");
    rkey.assign(static_cast<char*>(buf), static_cast<char*>(buf) + len);
    ucp_rkey_buffer_release(buf);
  }

  void teardown() {
    if (context == nullptr) return;
    if (worker != nullptr) {
      is_connected = false;
      retire(std::move(attempt), true);
      retire(std::move(current), false);
      // Graceful closes are given a second, forced ones whatever is left of it.
      const auto deadline = after(1);
      for (;;) {
        drain(worker);
        progress_closing();
        if (closing.empty() || Clock::now() >= deadline) break;
        sleep_on(worker, efd, poll_ms(deadline, 50));
      }
      for (Closing& c : closing) {
        c.req.release();
        c.attempt->send.release();
      }
      closing.clear();
    }
    if (memh != nullptr) ucp_mem_unmap(context, memh);
    memh = nullptr;
    if (worker != nullptr) ucp_worker_destroy(worker);
    worker = nullptr;
    ucp_cleanup(context);
    context = nullptr;
  }

  // Closes an attempt's endpoint (force: no flush; a failed endpoint is always forced).
  void retire(std::unique_ptr<Attempt> a, bool force) {
    if (!a) return;
    Req r = close_ep(a->ep, force || a->failed);
    closing.push_back(Closing{std::move(a), r, after(5)});
  }

  void progress_closing() {
    for (size_t i = 0; i < closing.size();) {
      Closing& c = closing[i];
      if (c.req.test()) {
        c.attempt->send.test();
        c.attempt->send.release();
        closing.erase(closing.begin() + static_cast<ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }

  void run() {
    while (!stop) {
      for (;;) {
        std::packaged_task<void()> task;
        {
          std::lock_guard lock(task_mu);
          if (tasks.empty()) break;
          task = std::move(tasks.front());
          tasks.pop_front();
        }
        task();
      }
      drain(worker);
      if (current && current->failed) retire(std::move(current), true);
      if (current) current->send.test();
      progress_closing();
      if (stop) break;
      sleep_on(worker, efd, 100, wake_fd);
      eat_wakeups();
    }
  }

  void eat_wakeups() {
    uint64_t n = 0;
    while (::read(wake_fd, &n, sizeof n) > 0) {
    }
  }

  void wake() {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t w = ::write(wake_fd, &one, sizeof one);
  }

  // Runs on the progress thread.
  void do_connect(const std::string& addr_text, const std::string& payload, double timeout_s) {
    if (current && !current->failed) fail("UCX link: connect: already connected to the syncer");
    if (current) retire(std::move(current), true);
    if (payload.size() > kMaxPayload)
      fail("UCX link: connect: payload of {} bytes exceeds {} bytes", payload.size(), kMaxPayload);
    if (!(timeout_s > 0)) fail("UCX link: connect: timeout must be positive (got {})", timeout_s);
    const sockaddr_storage addr = parse_address(addr_text);
    const auto deadline = after(timeout_s);

    attempt = std::make_unique<Attempt>();
    Attempt& a = *attempt;
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                   UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    p.sockaddr.addrlen = sockaddr_len(addr);
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = &Impl::on_ep_error;
    p.err_handler.arg = this;
    const ucs_status_t st = ucp_ep_create(worker, &p, &a.ep);
    if (st != UCS_OK) {
      attempt.reset();
      fail("UCX link: cannot connect to the syncer at {}: {}", addr_text, ucs_status_string(st));
    }
    a.hello = HelloHeader{kMagic,
                          kVersion,
                          ++nonce,
                          reinterpret_cast<uint64_t>(mem),
                          bytes,
                          static_cast<uint32_t>(rkey.size()),
                          static_cast<uint32_t>(payload.size())};
    a.data.reserve(rkey.size() + payload.size());
    a.data.insert(a.data.end(), rkey.begin(), rkey.end());
    a.data.insert(a.data.end(), payload.begin(), payload.end());
    ucp_request_param_t sp{};
    sp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    // REPLY: the syncer learns which endpoint sent it; EAGER: it arrives whole, in one callback.
    sp.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    a.send = Req::of(ucp_am_send_nbx(a.ep, kAmHello, &a.hello, sizeof a.hello, a.data.data(),
                                     a.data.size(), &sp));
    if (a.send.ptr == nullptr && a.send.status != UCS_OK && !a.failed) {
      a.failed = true;
      a.reason = ucs_status_string(a.send.status);
    }
    for (;;) {
      drain(worker);
      a.send.test();
      if (a.replied || a.failed || stop || Clock::now() >= deadline) break;
      sleep_on(worker, efd, poll_ms(deadline, 50), wake_fd);
      eat_wakeups();
    }
    if (a.replied && a.reply_status == kAdmitted) {
      current = std::move(attempt);
      {
        std::lock_guard lock(reason_mu);
        reason.clear();
      }
      is_connected = true;
      return;
    }
    const bool replied = a.replied;
    const std::string text = a.reply_text;
    const std::string why = a.reason;
    retire(std::move(attempt), true);
    if (replied) {
      throw LinkRefused(
          fmt::format("UCX link: the syncer at {} refused the connection: {}", addr_text, text),
          text);
    }
    if (stop) fail("UCX link: connect to {}: the link was closed meanwhile", addr_text);
    if (!why.empty()) {
      fail("UCX link: cannot connect to the syncer at {}: {} (is it listening there?)", addr_text,
           why);
    }
    fail("UCX link: no answer from the syncer at {} within {} s (is it running?)", addr_text,
         timeout_s);
  }
};

UcxUnitLink::UcxUnitLink(size_t bytes) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  if (bytes == 0) fail("UCX link: the exposed memory must not be empty");
  s.bytes = bytes;
  // Anonymous pages: zeroed, page-aligned (so 64-byte aligned), touched lazily.
  s.map_len = bytes;
  void* m = ::mmap(nullptr, s.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) fail("UCX link: cannot allocate {} bytes: {}", bytes, std::strerror(errno));
  s.mem = static_cast<std::byte*>(m);
  s.wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s.wake_fd < 0) {
    ::munmap(s.mem, s.map_len);
    fail("UCX link: eventfd: {}", std::strerror(errno));
  }
  // The context and worker are created on the progress thread, the only one that uses them.
  std::promise<void> ready;
  auto started = ready.get_future();
  s.thread = std::thread([&s, &ready] {
    try {
      s.init();
    } catch (...) {
      s.teardown();
      ready.set_exception(std::current_exception());
      return;
    }
    ready.set_value();
    s.run();
    s.teardown();
    // Work posted after the loop ended is abandoned: its future reports a broken promise.
    std::lock_guard lock(s.task_mu);
    s.tasks.clear();
  });
  try {
    started.get();
  } catch (...) {
    s.thread.join();
    ::close(s.wake_fd);
    ::munmap(s.mem, s.map_len);
    throw;
  }
  s.thread_running = true;
}

UcxUnitLink::~UcxUnitLink() {
  close();
  ::close(impl_->wake_fd);
  ::munmap(impl_->mem, impl_->map_len);
}

std::byte* UcxUnitLink::base() { return impl_->mem; }

size_t UcxUnitLink::bytes() const { return impl_->bytes; }

void UcxUnitLink::sync() { std::atomic_thread_fence(std::memory_order_seq_cst); }

void UcxUnitLink::close() {
  Impl& s = *impl_;
  if (!s.thread_running) return;
  s.stop = true;
  s.wake();
  s.thread.join();
  s.thread_running = false;
  s.is_connected = false;
  std::lock_guard lock(s.reason_mu);
  if (s.reason.empty()) s.reason = "closed";
}

void UcxUnitLink::connect(const std::string& syncer_addr, const std::string& payload,
                          double timeout_s) {
  Impl& s = *impl_;
  if (!s.thread_running || s.stop) fail("UCX link: connect: the link is closed");
  std::packaged_task<void()> task([&] { s.do_connect(syncer_addr, payload, timeout_s); });
  auto done = task.get_future();
  {
    std::lock_guard lock(s.task_mu);
    s.tasks.push_back(std::move(task));
  }
  s.wake();
  try {
    done.get();
  } catch (const std::future_error&) {
    fail("UCX link: connect: the link was closed meanwhile");
  }
}

bool UcxUnitLink::connected() const { return impl_->is_connected; }

std::string UcxUnitLink::lost_reason() const {
  std::lock_guard lock(impl_->reason_mu);
  return impl_->reason;
}

}  // namespace ddiloco::comm
