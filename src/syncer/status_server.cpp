// The syncer's HTTP endpoint (status_server.hpp), on CivetWeb.
//
// Why CivetWeb's limits matter here: a client of this port is untrusted, and the process it
// shares is the one that merges. CivetWeb reads a request's line and headers into a fixed
// buffer (max_request_size: a longer one is refused) within a total deadline
// (request_timeout_ms, counted from the request's first byte: a client that trickles its
// request, slowloris, is dropped when it runs out), keeps at most connection_queue accepted
// sockets waiting for a worker (then the kernel's backlog), and never stores a body a handler
// does not read: no request can grow the server, and mg_stop() ends within about one deadline.
#include "syncer/status_server.hpp"

#include <civetweb.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <optional>
#include <string_view>

#include "ddiloco/error.hpp"
#include "ddiloco/membership.hpp"

namespace ddiloco::syncer {

namespace {

// The page (src/syncer/status_page.html), embedded at build time.
constexpr const char kPage[] =
#include "status_page.inc"
    ;

constexpr const char* kWorkers = "16";          // blocked workers cost no CPU
constexpr const char* kQueue = "32";            // accepted sockets waiting for a worker
constexpr const char* kBacklog = "16";          // then the kernel's
constexpr const char* kRequestTimeoutMs = "2000";
constexpr const char* kMaxRequestBytes = "8192";  // request line and headers

using Digest = std::array<unsigned char, 32>;
std::optional<Digest> sha256(std::string_view s) {
  Digest d{};
  unsigned int n = 0;
  if (EVP_Digest(s.data(), s.size(), d.data(), &n, EVP_sha256(), nullptr) != 1 || n != d.size())
    return std::nullopt;
  return d;
}

}  // namespace

struct HttpReply {
  int status = 200;
  std::string type = "application/json";
  std::string body;
  std::vector<std::pair<const char*, std::string>> headers;
};

namespace {

using Reply = HttpReply;

Reply json_reply(int status, const nlohmann::json& body) {
  return {.status = status,
          .body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
          .headers = {}};
}

Reply error_reply(int status, const std::string& why) { return json_reply(status, {{"error", why}}); }

int send(mg_connection* c, const Reply& r) {
  mg_response_header_start(c, r.status);
  mg_response_header_add(c, "Content-Type", r.type.c_str(), -1);
  mg_response_header_add(c, "Content-Length", std::to_string(r.body.size()).c_str(), -1);
  mg_response_header_add(c, "Cache-Control", "no-store", -1);
  mg_response_header_add(c, "X-Content-Type-Options", "nosniff", -1);
  for (const auto& [name, value] : r.headers) mg_response_header_add(c, name, value.c_str(), -1);
  mg_response_header_send(c);
  if (!r.body.empty()) mg_write(c, r.body.data(), r.body.size());
  return r.status;
}

// Server threads at nice 10 (this thread only): on a machine whose cores the learners and the
// merge loop keep busy, a flood of requests takes what they leave.
void* nice_thread(const mg_context*, int) {
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);
  return nullptr;
}

// Before routing: a request with a body is refused (no action takes one). CivetWeb then reads
// the body and discards it, a buffer at a time, never storing it. (Not mg_send_http_error,
// which would close at once: CivetWeb 1.15's corrupts the worker thread it runs on.)
int refuse_bodies(mg_connection* c) {
  const mg_request_info* ri = mg_get_request_info(c);
  if (ri->content_length > 0 || mg_get_header(c, "Transfer-Encoding") != nullptr)
    return send(c, error_reply(413, "requests here carry no body"));
  return 0;
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
    : board_(board), secret_(std::move(secret)), units_(units) {
  if (secret_.empty()) fail("the status server needs a secret for its actions");
}

StatusServer::~StatusServer() {
  if (ctx_ != nullptr) mg_stop(ctx_);  // joins every thread: bounded by the request deadline
}

int StatusServer::start(const std::string& address) {
  const protocol::Endpoint at = protocol::Endpoint::parse(address, "syncer.http");
  // Once per process, never undone: a library that mg_start initialises implicitly is torn
  // down by mg_stop while its worker threads still exit, and their thread-local data with it.
  [[maybe_unused]] static const unsigned library = mg_init_library(0);
  const std::string ports = at.ip + ":" + std::to_string(at.port);
  const char* options[] = {"listening_ports", ports.c_str(),
                           "num_threads", kWorkers,
                           "connection_queue", kQueue,
                           "listen_backlog", kBacklog,
                           "request_timeout_ms", kRequestTimeoutMs,
                           "max_request_size", kMaxRequestBytes,
                           "enable_keep_alive", "no",
                           nullptr};
  mg_callbacks callbacks{};
  callbacks.begin_request = refuse_bodies;
  callbacks.init_thread = nice_thread;
  callbacks.log_message = [](const mg_connection*, const char*) { return 1; };  // not to stderr
  char why[256] = "";
  unsigned code = 0;
  mg_error_data error{.code = &code, .text = why, .text_buffer_size = sizeof why};
  mg_init_data init{.callbacks = &callbacks, .user_data = this, .configuration_options = options};
  ctx_ = mg_start2(&init, &error);
  if (ctx_ == nullptr)
    fail("syncer.http: cannot serve on {} ({}); give another address, or 'off'", address, why);
  mg_set_request_handler(
      ctx_, "/",
      [](mg_connection* c, void* self) { return static_cast<StatusServer*>(self)->handle(c); }, this);
  mg_server_port bound{};
  if (mg_get_server_ports(ctx_, 1, &bound) != 1) fail("syncer.http: {}: no port was bound", address);
  return bound.port;
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

// "Bearer <secret>" (the scheme in any case, RFC 7235), compared through SHA-256 digests in
// constant time: neither the secret's bytes nor its length show in the time a refusal takes.
// A digest that cannot be made refuses.
bool StatusServer::authorised(const char* header) const {
  if (header == nullptr) return false;
  const std::string_view h = header;
  constexpr std::string_view kScheme = "bearer ";
  if (h.size() <= kScheme.size() || strncasecmp(h.data(), kScheme.data(), kScheme.size()) != 0) return false;
  const auto given = sha256(h.substr(kScheme.size())), want = sha256(secret_);
  return given && want && CRYPTO_memcmp(given->data(), want->data(), want->size()) == 0;
}

int StatusServer::handle(mg_connection* c) {
  const mg_request_info* ri = mg_get_request_info(c);
  const std::string_view method = ri->request_method, path = ri->local_uri ? ri->local_uri : "";
  Reply r;
  if (path.starts_with("/api/action/"))
    r = method == "POST" ? action(c, path.substr(std::strlen("/api/action/")))
                         : [] {
                             Reply e = error_reply(405, "actions are POST requests");
                             e.headers.emplace_back("Allow", "POST");
                             return e;
                           }();
  else if (method != "GET")
    r = error_reply(405, "this page answers GET");
  else if (path == "/")
    r = {.type = "text/html; charset=utf-8",
         .body = std::string(kPage, sizeof kPage - 1),
         // Everything inline: the page loads nothing from anywhere else, and no page frames it.
         .headers = {{"Content-Security-Policy",
                      "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                      "img-src data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'"}}};
  else if (path == "/api/state" || path == "/metrics") {
    const auto rendered_now = rendered();
    if (!rendered_now)
      r = error_reply(503, "the syncer has not published its state yet");
    else if (path == "/metrics")
      r = {.type = "text/plain; version=0.0.4; charset=utf-8", .body = rendered_now->metrics, .headers = {}};
    else
      r.body = rendered_now->json;
  } else {
    r = error_reply(404, fmt::format("no such page: {} (/, /api/state, /metrics, /api/action/...)",
                                     std::string(path.substr(0, 200))));
  }
  return send(c, r);
}

HttpReply StatusServer::action(mg_connection* c, std::string_view what) {
  if (!authorised(mg_get_header(c, "Authorization"))) {
    Reply e = error_reply(401, "this action needs the page's secret (run.dir/status.secret) as "
                               "'Authorization: Bearer <secret>'");
    e.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"ddiloco\"");
    return e;
  }
  const mg_request_info* ri = mg_get_request_info(c);
  Action a;
  a.peer = ri->remote_addr;
  const auto snapshot = board_.latest();
  const StatusSnapshot::Actions can = snapshot ? snapshot->actions : StatusSnapshot::Actions{};
  nlohmann::json answer = {{"accepted", true}, {"action", std::string(what)}};
  if (what == "kill") {
    a.kind = ActionKind::kill;
    char unit[16] = "";
    const char* q = ri->query_string ? ri->query_string : "";
    const int n = mg_get_var(q, std::strlen(q), "unit", unit, sizeof unit);
    const std::string_view u(unit, n > 0 ? static_cast<size_t>(n) : 0);
    if (u.empty() || u.size() > 6 || u.find_first_not_of("0123456789") != std::string_view::npos ||
        std::stoi(std::string(u)) >= units_)
      return error_reply(400, fmt::format("kill: expected ?unit=U with U in 0..{}", units_ - 1));
    a.unit = std::stoi(std::string(u));
    answer["unit"] = a.unit;
    if (!can.kill) return error_reply(409, "kill needs a job started by `ddiloco launch`, whose launcher kills");
  } else if (what == "checkpoint") {
    a.kind = ActionKind::checkpoint;
    if (!can.checkpoint) return error_reply(409, "checkpoint: this run writes no checkpoints (checkpoint.dir)");
  } else if (what == "stop") {
    a.kind = ActionKind::stop;
  } else {
    return error_reply(404, "no such action (kill, checkpoint, stop)");
  }
  {
    const std::lock_guard lock(actions_mutex_);
    if (actions_.size() >= kMaxQueued) return error_reply(429, "too many actions waiting for the merge loop");
    actions_.push_back(std::move(a));
  }
  return json_reply(202, answer);
}

}  // namespace ddiloco::syncer
