// `ddiloco status RUN_DIR`: the syncer's status page as a table in the terminal, for a person
// on a login node (docs/status_page.md).
#include <httplib.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <thread>

#include "cli/commands.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/signals.hpp"
#include "ddiloco/status.hpp"

namespace ddiloco::cli {

namespace {

// Printable: a peer's strings may carry terminal escapes, C0 or C1 (UTF-8 C2 80..9F) controls.
std::string clean(std::string s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) s[i] = '?';
    if (c == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
        static_cast<unsigned char>(s[i + 1]) <= 0x9f)
      s.replace(i, 2, "?");
  }
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// A boolean field, false unless it is one.
bool flag(const nlohmann::json& j, const char* key) {
  const auto it = j.is_object() ? j.find(key) : j.end();
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

// A field of an untrusted answer: its value when it has the type asked for, else `fallback`.
std::string text(const nlohmann::json& j, const char* key, const std::string& fallback = "-") {
  const auto it = j.is_object() ? j.find(key) : j.end();
  if (it == j.end()) return fallback;
  if (it->is_string()) return clean(it->get<std::string>());
  if (it->is_number_integer()) return std::to_string(it->get<int64_t>());
  if (it->is_number()) return fmt::format("{:.4g}", it->get<double>());
  if (it->is_boolean()) return it->get<bool>() ? "yes" : "no";
  return fallback;
}

double number(const nlohmann::json& j, const char* key, double fallback = NAN) {
  const auto it = j.is_object() ? j.find(key) : j.end();
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

std::string bytes(double b) {
  if (!std::isfinite(b)) return "-";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) b /= 1024, ++i;
  return i == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[i]);
}

std::string fixed(double x, const char* format, const std::string& suffix = "") {
  return std::isfinite(x) ? fmt::format(fmt::runtime(format), x) + suffix : "-";
}

std::string header(const nlohmann::json& state) {
  const nlohmann::json& run = state.contains("run") ? state["run"] : nlohmann::json::object();
  const nlohmann::json& pr = state.contains("progress") ? state["progress"] : nlohmann::json::object();
  const nlohmann::json& gp = state.contains("goodput") ? state["goodput"] : nlohmann::json::object();
  const double tokens = number(pr, "tokens"), budget = number(run, "token_budget");
  std::string out = fmt::format("{} · syncer {} · mode {} · {} units · P={} H={} tau={} K={} · {}\n",
                                clean(text(run, "dir")), text(run, "pid"), clean(text(run, "mode")),
                                text(run, "units"), text(run, "fragments"), text(run, "h"), text(run, "tau"),
                                text(run, "quorum"),
                                fixed(number(state, "elapsed_s"), "{:.1f}", " s"));
  std::string val = "-";
  if (state.contains("val_loss") && state["val_loss"].is_array() && !state["val_loss"].empty()) {
    const nlohmann::json& last = state["val_loss"].back();
    if (last.is_array() && last.size() == 3 && last[2].is_number()) val = fmt::format("{:.4f}", last[2].get<double>());
  }
  out += fmt::format("tokens {:.0f}{} · merges {} ({} /s) · val loss {} · goodput {} · downtime {}", tokens,
                     budget > 0 ? fmt::format(" / {:.0f} ({:.1f} %)", budget, 100 * tokens / budget) : "",
                     text(pr, "merges"), fixed(number(pr, "merge_rate_per_s"), "{:.2f}"), val,
                     fixed(100 * number(gp, "ratio"), "{:.1f}", " %"),
                     fixed(number(gp, "global_downtime_s"), "{:.1f}", " s"));
  for (const char* key : {"stopping", "checkpoint_wanted", "recovering"})
    if (flag(pr, key)) out += fmt::format(" · {}", key);
  return out + "\n";
}

std::string unit_row(const nlohmann::json& u) {
  const std::string at = text(u, "pid", "") + (text(u, "host", "").empty() ? "" : "@" + clean(text(u, "host", "")));
  return fmt::format("{:>4}  {:<9}  {:<22}  {:>8}  {:>8}  {:>10}  {:>5}  {:>10}  {:>10}  {:>10}  {:>6}  {:>7}\n",
                     text(u, "unit"), clean(text(u, "state")), at.empty() ? "-" : at, text(u, "restarts"),
                     text(u, "steps"), text(u, "tokens"), text(u, "staleness"),
                     fixed(number(u, "last_merge_s"), "{:.1f}", " s ago"), bytes(number(u, "bytes_up")),
                     bytes(number(u, "bytes_down")), fixed(number(u, "train_loss"), "{:.3f}"),
                     fixed(1e3 * number(u, "step_time_s"), "{:.0f}", " ms"));
}

}  // namespace

std::string format_status(const nlohmann::json& state) {
  std::string out = header(state) + "\n";
  out += fmt::format("{:>4}  {:<9}  {:<22}  {:>8}  {:>8}  {:>10}  {:>5}  {:>10}  {:>10}  {:>10}  {:>6}  {:>7}\n", "unit",
                     "state", "pid@host", "restarts", "steps", "tokens", "stale", "last merge", "up", "down",
                     "loss", "step");
  if (state.contains("units") && state["units"].is_array())
    for (const nlohmann::json& u : state["units"]) out += unit_row(u);
  if (state.contains("events") && state["events"].is_array() && !state["events"].empty()) {
    out += "\nrecent events:\n";
    const nlohmann::json& ev = state["events"];
    for (size_t i = ev.size() > 8 ? ev.size() - 8 : 0; i < ev.size(); ++i) {
      std::string rest;
      if (ev[i].is_object())
        for (const auto& [k, v] : ev[i].items())
          if (k != "event" && k != "elapsed_s" && k != "tokens") rest += fmt::format(" {}={}", k, v.dump());
      out += fmt::format("  {:>9}  {:<20} {}\n", fixed(number(ev[i], "elapsed_s"), "{:.1f}", " s"),
                         clean(text(ev[i], "event")), clean(rest));
    }
  }
  return out;
}

namespace {

// One /api/state answer, or why there is none (`error` not empty).
struct Answer {
  nlohmann::json state;
  std::string error;
};

// Asks the syncer that RUN_DIR/syncer.http names now: a restarted syncer writes a new address,
// so a watch reads the file again each time.
Answer ask(const StatusOptions& o) {
  constexpr size_t kMaxAnswer = 64 << 20;
  std::optional<HttpAddress> addr;
  try {
    addr = HttpAddress::read(o.run_dir);
  } catch (const Error& e) {
    return {{}, e.what()};
  }
  if (!addr)
    return {{}, fmt::format("no {} (no syncer of this run is serving its status page: not started, ended, or "
                            "syncer.http off)", HttpAddress::file(o.run_dir).string())};
  const auto colon = addr->address.rfind(':');
  // Served on every interface: this host's loopback, or the syncer's host by name.
  std::string ip = addr->address.substr(0, colon);
  if (ip == "0.0.0.0") ip = addr->host.empty() || addr->host == host_name() ? "127.0.0.1" : addr->host;
  httplib::Client client(ip, std::stoi(addr->address.substr(colon + 1)));
  const auto timeout = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::duration<double>(o.timeout_s));
  client.set_connection_timeout(timeout);
  client.set_read_timeout(timeout);
  // At most kMaxAnswer bytes: the address file may name another program's port.
  std::string body;
  const httplib::Result r = client.Get("/api/state", [&](const char* data, size_t n) {
    body.append(data, n);
    return body.size() <= kMaxAnswer;
  });
  if (!r)
    return {{}, fmt::format("{} (from {}) does not answer: {} (the syncer has ended or is restarting)", addr->url(),
                            HttpAddress::file(o.run_dir).string(), httplib::to_string(r.error()))};
  if (r->status != 200) return {{}, fmt::format("{}api/state answered {}: {}", addr->url(), r->status, clean(body))};
  nlohmann::json state = nlohmann::json::parse(body, nullptr, false);
  if (state.is_discarded() || !state.is_object())
    return {{}, fmt::format("{}api/state: the answer is not a JSON object", addr->url())};
  const auto run = state.find("run");
  if (run == state.end() || !run->is_object() || run->value("pid", nlohmann::json()) != nlohmann::json(addr->pid))
    return {{}, fmt::format("{} answers, but not as the syncer (pid {}) that {} names: that syncer has ended",
                            addr->url(), addr->pid, HttpAddress::file(o.run_dir).string())};
  return {std::move(state), ""};
}

}  // namespace

int status(const StatusOptions& o) {
  install_stop_signals();
  for (;;) {
    const Answer a = ask(o);
    // Once, an error is the answer; watching, the syncer may be restarting: say so and ask again.
    if (!a.error.empty() && o.watch_s <= 0) fail("status: {}", a.error);
    if (!a.error.empty() && o.json) {
      std::fprintf(stderr, "status: %s\n", a.error.c_str());
    } else if (o.json) {
      std::printf("%s\n", a.state.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      if (o.watch_s > 0) std::fputs("\033[H\033[2J", stdout);  // home, clear: a redraw in place
      std::fputs(a.error.empty() ? format_status(a.state).c_str()
                                 : fmt::format("{}: waiting for the syncer: {}\n", clean(o.run_dir), a.error).c_str(),
                 stdout);
    }
    std::fflush(stdout);
    if (o.watch_s <= 0) return 0;
    for (double slept = 0; slept < o.watch_s && stop_signal() == 0; slept += 0.1)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (stop_signal() != 0) return 0;
  }
}

}  // namespace ddiloco::cli
