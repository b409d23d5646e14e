// The syncer's live status page (docs/status_page.md): the snapshot the merge loop publishes
// for the HTTP threads, and the actions they queue, carried out here on the loop's thread
// through the paths signals and chaos take.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "ddiloco/error.hpp"
#include "ddiloco/run_dir.hpp"
#include "ddiloco/status.hpp"
#include "syncer/syncer.hpp"

namespace ddiloco::syncer {

namespace {

constexpr double kPublishEveryS = 0.25;

// The launcher of this process (`ddiloco launch` sets DDILOCO_LAUNCH_PID), when it is our
// parent still; 0 otherwise.
pid_t launcher_pid() {
  const char* v = std::getenv("DDILOCO_LAUNCH_PID");
  if (v == nullptr) return 0;
  char* end = nullptr;
  const long pid = std::strtol(v, &end, 10);
  return end != v && *end == '\0' && pid > 1 && pid == ::getppid() ? static_cast<pid_t>(pid) : 0;
}

}  // namespace

// Off unless syncer.http names an address (`ddiloco launch` gives 127.0.0.1:0). The page's
// actions have a secret of their own, made afresh by every syncer process: typed into a
// browser and sent over plain HTTP, it must not be the run's secret, which admits units.
void Syncer::start_status() {
  const std::string& at = config_.syncer.http;
  if (at.empty() || at == "off") return;
  const std::filesystem::path dir = config_.run.dir;
  const std::string secret = protocol::Rendezvous::random_token();
  write_text_atomically(status_secret_file(dir), secret + "\n", 0600);
  status_.launcher = door_ ? launcher_pid() : 0;
  log_.observe([this](const nlohmann::json& e) { status_.board.event(e); });
  status_.server = std::make_unique<StatusServer>(status_.board, secret, M_);
  const int port = status_.server->start(at);
  HttpAddress addr;
  addr.address = protocol::Endpoint::parse(at, "syncer.http").ip + ":" + std::to_string(port);
  addr.pid = ::getpid();
  addr.host = host_name();
  addr.write(dir);
  publish_status();
  std::printf("syncer: status page at %s (metrics: %smetrics; actions need %s)\n", addr.url().c_str(),
              addr.url().c_str(), status_secret_file(dir).c_str());
  std::fflush(stdout);
}

// Unit u as the page shows it. Isolated, its membership says whether a process of it is
// there; a unit not heard from within its heartbeat timeout is silent.
UnitStatus Syncer::unit_status(int u) const {
  const protocol::UnitHeaders& h = core_.headers(u);
  UnitStatus s;
  s.unit = u;
  if (core_.unit_done(u))
    s.state = "done";
  else if (members_ && !members_->present(u))
    s.state = members_->lost_at(u) >= 0 ? "lost" : "starting";
  else if (core_.silent(u))
    s.state = "silent";
  else if (members_ && members_->healing(u))
    s.state = "rejoining";
  else
    s.state = h.reachable && h.control(protocol::kState) != protocol::kStarting ? "training" : "starting";
  if (members_) {
    s.pid = members_->pid(u);
    s.host = members_->host(u);
    s.restarts = members_->restarts(u);
  }
  if (!h.reachable) return s;  // nothing polled yet: the counts stay 0
  s.steps = core_.unit_steps(u);
  s.tokens = core_.unit_tokens(u);
  // (The unit's ack is its claim: clamped to what exists, so that no value of it overflows.)
  for (int p = 0; p < fragments_.size(); ++p)
    s.staleness = std::max(s.staleness, core_.versions()[p] - std::clamp(h.header(p, protocol::kInAck),
                                                                          int64_t{0}, core_.versions()[p]));
  const double merged_at = status_.board.last_merged_at(u);
  s.last_merge_s = merged_at >= 0 ? now() - merged_at : -1;
  const wan::LinkCounters c = links_.counters(u);
  s.bytes_up = c.up_bytes;
  s.bytes_down = c.down_bytes;
  if (const double loss = h.control_f64(protocol::kTrainLoss); loss != 0) s.train_loss = loss;
  s.step_time_s = static_cast<double>(std::max<int64_t>(h.control(protocol::kStepTimeNs), 0)) * 1e-9;
  return s;
}

// Goodput so far: the units' books as they stand at their last steps (isolated: in their
// windows), their dead processes' and their closed absences. One job gathers books only at
// the end: none until then.
void Syncer::status_goodput(StatusSnapshot& s) const {
  s.global_downtime_s = core_.downtime().seconds();
  if (!door_) return;
  TimeBook all;
  for (int u = 0; u < M_; ++u) all += unit_book(u);
  s.useful_s = all.useful();
  s.allocated_s = all.allocated;
  if (all.allocated > 0) s.goodput = all.goodput();
}

void Syncer::publish_status() {
  status_.next_publish = now() + kPublishEveryS;
  auto s = std::make_shared<StatusSnapshot>();
  s->elapsed_s = now();
  s->run = {{"dir", config_.run.dir}, {"mode", mode_name(plan_.mode)}, {"units", M_},
            {"fragments", fragments_.size()}, {"h", plan_.h}, {"tau", plan_.overlap},
            {"quorum", plan_.quorum}, {"token_budget", budget_}, {"isolated", door_ != nullptr},
            {"pid", ::getpid()}};
  s->tokens = core_.tokens_total();
  s->merges = core_.total_merges();
  s->versions = core_.versions();
  s->merge_rate = status_.board.merge_rate(now());
  s->stopping = core_.stopping() || stop_.after_version > 0 || stop_.leave_units;
  s->checkpoint_wanted = checkpoints_.wanted();
  s->recovering = restart_.recovery != nullptr;
  for (int u = 0; u < M_; ++u) {
    s->units.push_back(unit_status(u));
    if (s->units.back().train_loss)
      status_.board.train_loss(u, *s->units.back().train_loss, s->tokens, now());  // the job's tokens: val's x axis
  }
  status_goodput(*s);
  s->config_yaml = status_.yaml;
  s->actions = {.kill = status_.launcher != 0, .checkpoint = checkpoints_.on(), .stop = true};
  status_.board.attach_history(*s);
  status_.board.publish(std::move(s));
}

void Syncer::take_status_actions() {
  for (const StatusServer::Action& a : status_.server->take_actions()) act(a);
}

// An action a request with the page's secret asked for, through the path it has without the
// page: a kill is the launcher's chaos kill (a request file it picks up), a checkpoint a
// periodic one asked for now, a stop SIGTERM (under launch to the launcher, which forwards it
// to every child as it does a user's).
void Syncer::act(const StatusServer::Action& a) {
  nlohmann::json e = {{"event", "action"}, {"action", action_name(a.kind)}, {"peer", a.peer},
                      {"tokens", core_.tokens_total()}, {"elapsed_s", now()}};
  // The launcher, while it is still our parent: a pid that was its may be another process's now.
  const pid_t launcher = status_.launcher != 0 && ::getppid() == status_.launcher ? status_.launcher : 0;
  std::string refused;
  try {
    switch (a.kind) {
      case StatusServer::ActionKind::kill:
        e["unit"] = a.unit;
        if (launcher == 0)
          refused = "no launcher to carry out the kill";
        else
          launch_request_kill(config_.run.dir, a.unit, ++status_.requests);
        break;
      case StatusServer::ActionKind::checkpoint:
        refused = checkpoints_.request_now();
        break;
      case StatusServer::ActionKind::stop:
        if (launcher != 0)
          ::kill(launcher, SIGTERM);
        else
          ::raise(SIGTERM);
        break;
    }
  } catch (const std::exception& ex) {
    refused = ex.what();  // a request file that cannot be written: the action fails, not the syncer
  }
  if (!refused.empty()) e["refused"] = refused;
  log_.write(e);
  std::printf("syncer: status page (%s): %s%s%s\n", a.peer.c_str(), action_name(a.kind),
              a.kind == StatusServer::ActionKind::kill ? fmt::format(" unit {}", a.unit).c_str() : "",
              refused.empty() ? "" : (": refused: " + refused).c_str());
  std::fflush(stdout);
}

}  // namespace ddiloco::syncer
