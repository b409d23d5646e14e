// UCX helpers shared by both sides of the link (ucx_common.hpp).
#include "comm/ucx_common.hpp"

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

namespace ddiloco::comm::ucx {

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(seconds));
}

int poll_ms(Clock::time_point deadline, int cap_ms) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count() + 1, 1, cap_ms));
}

void check(ucs_status_t status, const char* what) {
  if (status != UCS_OK) fail("UCX {} failed: {}", what, ucs_status_string(status));
}

sockaddr_storage resolve(const std::string& host, int port, bool passive) {
  if (port < 0 || port > 65535) fail("UCX link: port {} out of range 0..65535", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr)
    fail("UCX link: cannot resolve address '{}': {}", host, ::gai_strerror(rc));
  sockaddr_storage out{};
  std::memcpy(&out, res->ai_addr, std::min<size_t>(res->ai_addrlen, sizeof out));
  ::freeaddrinfo(res);
  return out;
}

socklen_t sockaddr_len(const sockaddr_storage& a) {
  return a.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

std::string format_address(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    ::inet_ntop(AF_INET, &in.sin_addr, host, sizeof host);
    port = ntohs(in.sin_port);
    return fmt::format("{}:{}", host, port);
  }
  if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
    ::inet_ntop(AF_INET6, &in6.sin6_addr, host, sizeof host);
    port = ntohs(in6.sin6_port);
    return fmt::format("[{}]:{}", host, port);
  }
  return "?";
}

bool is_loopback(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr) >> 24) == 127;
  if (a.ss_family == AF_INET6)
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6&>(a).sin6_addr);
  return false;
}

sockaddr_storage parse_address(const std::string& text) {
  std::string host;
  std::string port;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      fail("UCX link: malformed address '{}' (expected [ipv6]:port)", text);
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0)
      fail("UCX link: malformed address '{}' (expected ip:port)", text);
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  char* end = nullptr;
  const long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p <= 0 || p > 65535)
    fail("UCX link: malformed port in address '{}'", text);
  return resolve(host, static_cast<int>(p), false);
}

ucp_context_h create_context(const char* name, bool loopback_only) {
  ucp_config_t* config = nullptr;
  check(ucp_config_read(nullptr, nullptr, &config), "config_read");
  // Detection of a silent peer within seconds instead of UCX's defaults (keepalive rounds
  // every 20 s; TCP keepalive probes after 10 s idle). The environment wins: a variable that
  // is set is left alone. The TCP keys are the tcp transport's own (UCX_TCP_KEEPIDLE is
  // "KEEPIDLE" in its table) and are given only where tcp may be selected: UCX warns about a
  // key no transport used.
  const char* tls = std::getenv("UCX_TLS");
  const std::string tls_list = tls != nullptr ? tls : "";
  const bool tcp_possible = tls == nullptr || tls_list.find("all") != std::string::npos ||
                            (tls_list.find("tcp") != std::string::npos) != (tls_list[0] == '^');
  struct Default {
    const char* env;
    const char* key;
    const char* value;
    bool tcp;
  };
  static const Default defaults[] = {{"UCX_KEEPALIVE_INTERVAL", "KEEPALIVE_INTERVAL", "1s", false},
                                     {"UCX_TCP_KEEPIDLE", "KEEPIDLE", "2s", true},
                                     {"UCX_TCP_KEEPINTVL", "KEEPINTVL", "1s", true},
                                     {"UCX_TCP_KEEPCNT", "KEEPCNT", "3", true}};
  for (const Default& d : defaults) {
    if (std::getenv(d.env) != nullptr || (d.tcp && !tcp_possible)) continue;
    (void)ucp_config_modify(config, d.key, d.value);
  }
  if (loopback_only && std::getenv("UCX_NET_DEVICES") == nullptr)
    (void)ucp_config_modify(config, "NET_DEVICES", "lo");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO64 | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = name;
  ucp_context_h context = nullptr;
  const ucs_status_t status = ucp_init(&params, config, &context);
  ucp_config_release(config);
  check(status, "init");
  return context;
}

ucp_worker_h create_worker(ucp_context_h context, int* efd) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  check(ucp_worker_create(context, &params, &worker), "worker_create");
  const ucs_status_t status = ucp_worker_get_efd(worker, efd);
  if (status != UCS_OK) {
    ucp_worker_destroy(worker);
    check(status, "worker_get_efd");
  }
  return worker;
}

void set_am_handler(ucp_worker_h worker, unsigned id, ucp_am_recv_callback_t cb, void* arg) {
  ucp_am_handler_param_t p{};
  p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                 UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  p.id = id;
  p.cb = cb;
  p.arg = arg;
  p.flags = UCP_AM_FLAG_WHOLE_MSG;
  check(ucp_worker_set_am_recv_handler(worker, &p), "worker_set_am_recv_handler");
}

void drain(ucp_worker_h worker) {
  while (ucp_worker_progress(worker) != 0) {
  }
}

void sleep_on(ucp_worker_h worker, int efd, int ms, int extra_fd) {
  const ucs_status_t st = ucp_worker_arm(worker);
  if (st == UCS_ERR_BUSY) return;
  if (st != UCS_OK) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(ms, 1)));
    return;
  }
  pollfd fds[2] = {{efd, POLLIN, 0}, {extra_fd, POLLIN, 0}};
  ::poll(fds, extra_fd >= 0 ? 2 : 1, ms);
}

Req close_ep(ucp_ep_h ep, bool force) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  return Req::of(ucp_ep_close_nbx(ep, &p));
}

}  // namespace ddiloco::comm::ucx
