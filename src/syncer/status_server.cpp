// The syncer's HTTP endpoint (status_server.hpp).
#include "syncer/status_server.hpp"

#include <httplib.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <functional>

#include "ddiloco/error.hpp"
#include "ddiloco/membership.hpp"

namespace ddiloco::syncer {

namespace {

// The page (src/syncer/status_page.html), embedded at build time.
constexpr const char kPage[] =
#include "status_page.inc"
    ;

// Workers at nice 10: on a machine whose cores the learners and the merge loop keep busy, a
// flood of requests takes what they leave. Handlers only render a published snapshot.
// cpp-httplib gives each connection a worker until it closes, and its read timeout is per
// recv: a client that trickles its request (slowloris) holds a worker as long as it likes.
// Such clients can deny the page, never the merges; what they must not do is grow the
// server's descriptors and memory with their connections. So at most `max_pending` wait for
// a worker; beyond that the accepting thread serves the connection itself, accepting none
// meanwhile, and the kernel's listen backlog bounds the rest.
class NiceWorkers : public httplib::TaskQueue {
 public:
  NiceWorkers(int n, size_t max_pending) : max_pending_(max_pending) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { work(); });
  }
  void enqueue(std::function<void()> fn) override {
    {
      const std::lock_guard lock(mutex_);
      if (jobs_.size() < max_pending_) {
        jobs_.push_back(std::move(fn));
        cv_.notify_one();
        return;
      }
    }
    fn();
  }
  void shutdown() override {
    {
      const std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

 private:
  void work() {
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);  // this thread only
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [this] { return done_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // done, and nothing left: every accepted socket is closed by its job
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  const size_t max_pending_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool done_ = false;
};

// Blocked workers cost no CPU: enough that a few slow clients leave the page to the others.
constexpr int kWorkers = 16;
constexpr size_t kMaxPending = 32;

void json_reply(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                  "application/json");
}

void error_reply(httplib::Response& res, int status, const std::string& why) {
  json_reply(res, status, {{"error", why}});
}

using Digest = std::array<unsigned char, 32>;
Digest sha256(const std::string& s) {
  Digest d{};
  unsigned int n = 0;
  if (EVP_Digest(s.data(), s.size(), d.data(), &n, EVP_sha256(), nullptr) != 1) d.fill(0);
  return d;
}

}  // namespace

const char* action_name(StatusServer::ActionKind kind) {
  switch (kind) {
    case StatusServer::ActionKind::kill: return "kill";
    case StatusServer::ActionKind::checkpoint: return "checkpoint";
    case StatusServer::ActionKind::stop: return "stop";
  }
  return "?";
}

// One snapshot's renderings, made by the first request that needs them.
struct StatusServer::Rendered {
  std::shared_ptr<const StatusSnapshot> of;
  std::string json, metrics;
};

StatusServer::StatusServer(const StatusBoard& board, std::string secret, int units)
    : board_(board), secret_(std::move(secret)), units_(units), server_(std::make_unique<httplib::Server>()) {
  if (secret_.empty()) fail("the status server needs the run's secret");
}

StatusServer::~StatusServer() {
  if (thread_.joinable()) {
    server_->stop();
    thread_.join();
  }
}

int StatusServer::start(const std::string& address) {
  const protocol::Endpoint at = protocol::Endpoint::parse(address, "syncer.http");
  server_->new_task_queue = [] { return new NiceWorkers(kWorkers, kMaxPending); };
  // A client that sends or reads nothing for 2 s is dropped: slow clients hold a worker that
  // long at most per byte, and never the merge loop.
  server_->set_read_timeout(2, 0);
  server_->set_write_timeout(2, 0);
  server_->set_keep_alive_timeout(2);
  server_->set_payload_max_length(4096);  // actions carry no body
  routes();
  const int port = at.port == 0 ? server_->bind_to_any_port(at.ip) : (server_->bind_to_port(at.ip, at.port) ? at.port : -1);
  if (port < 0)
    fail("syncer.http: cannot listen on {} ({}); give another address, or 'off'", address, std::strerror(errno));
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  return port;
}

std::vector<StatusServer::Action> StatusServer::take_actions() {
  std::vector<Action> out;
  const std::lock_guard lock(actions_mutex_);
  out.swap(actions_);
  return out;
}

std::shared_ptr<const StatusServer::Rendered> StatusServer::rendered() {
  std::shared_ptr<const StatusSnapshot> s = board_.latest();
  const std::lock_guard lock(render_mutex_);
  if (s && (!rendered_ || rendered_->of != s)) {
    auto r = std::make_shared<Rendered>();
    r->of = s;
    r->json = to_json(*s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    r->metrics = to_prometheus(*s);
    rendered_ = std::move(r);
  }
  return rendered_;
}

// "Bearer <secret>", compared through SHA-256 digests in constant time: neither the secret's
// bytes nor its length show in the time a refusal takes.
bool StatusServer::authorised(const std::string& header) const {
  static const std::string kScheme = "Bearer ";
  if (header.size() <= kScheme.size() || header.compare(0, kScheme.size(), kScheme) != 0) return false;
  const Digest given = sha256(header.substr(kScheme.size())), want = sha256(secret_);
  return CRYPTO_memcmp(given.data(), want.data(), want.size()) == 0;
}

void StatusServer::routes() {
  httplib::Server& s = *server_;
  s.set_default_headers({{"Cache-Control", "no-store"}, {"X-Content-Type-Options", "nosniff"}});
  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    // Everything inline: the page loads nothing from anywhere else, and no other page frames it.
    res.set_header("Content-Security-Policy",
                   "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                   "img-src data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'");
    res.set_content(kPage, sizeof kPage - 1, "text/html; charset=utf-8");
  });
  s.Get("/api/state", [this](const httplib::Request&, httplib::Response& res) {
    const auto r = rendered();
    if (!r) return error_reply(res, 503, "the syncer has not published its state yet");
    res.set_content(r->json, "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const auto r = rendered();
    if (!r) return error_reply(res, 503, "the syncer has not published its state yet");
    res.set_content(r->metrics, "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get(R"(/api/action/(\w+))", [](const httplib::Request&, httplib::Response& res) {
    res.set_header("Allow", "POST");
    error_reply(res, 405, "actions are POST requests");
  });
  s.Post(R"(/api/action/(\w+))", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorised(req.get_header_value("Authorization"))) {
      res.set_header("WWW-Authenticate", "Bearer realm=\"ddiloco\"");
      return error_reply(res, 401, "this action needs the run's secret (run.dir/syncer.secret) as "
                                   "'Authorization: Bearer <secret>'");
    }
    Action a;
    a.peer = req.remote_addr;
    const std::string what = req.matches[1];
    const auto snapshot = board_.latest();
    const StatusSnapshot::Actions can = snapshot ? snapshot->actions : StatusSnapshot::Actions{};
    nlohmann::json answer = {{"accepted", true}, {"action", what}};
    if (what == "kill") {
      a.kind = ActionKind::kill;
      const std::string unit = req.get_param_value("unit");
      if (unit.empty() || unit.size() > 6 || unit.find_first_not_of("0123456789") != std::string::npos ||
          std::stoi(unit) >= units_)
        return error_reply(res, 400, fmt::format("kill: expected ?unit=U with U in 0..{}, got '{}'", units_ - 1, unit));
      a.unit = std::stoi(unit);
      answer["unit"] = a.unit;
      if (!can.kill) return error_reply(res, 409, "kill needs a job started by `ddiloco launch`, whose launcher kills");
    } else if (what == "checkpoint") {
      a.kind = ActionKind::checkpoint;
      if (!can.checkpoint) return error_reply(res, 409, "checkpoint: this run writes no checkpoints (checkpoint.dir)");
    } else if (what == "stop") {
      a.kind = ActionKind::stop;
    } else {
      return error_reply(res, 404, fmt::format("no action '{}' (kill, checkpoint, stop)", what));
    }
    {
      const std::lock_guard lock(actions_mutex_);
      actions_.push_back(std::move(a));
    }
    json_reply(res, 202, answer);
  });
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (res.status == 404 && res.body.empty())
      error_reply(res, 404, fmt::format("no such page: {} (/, /api/state, /metrics, /api/action/...)", req.path));
  });
}

}  // namespace ddiloco::syncer
