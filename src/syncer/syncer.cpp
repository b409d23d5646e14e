// The syncer process: holds Θ and the outer optimizer (syncer_core.hpp), collects snapshots
// from the units' windows, merges each fragment once a quorum has reported (plus the grace
// window), delivers the result, and evaluates Θ (docs/algorithm.md, "Syncer, for each fragment
// round"). This file: construction, the run loop, admission of units and the stop.
#include "syncer/syncer.hpp"

#include <omp.h>

#include <chrono>
#include <cstdio>

#include "ddiloco/chaos.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/run_dir.hpp"
#include "ddiloco/signals.hpp"
#include "ddiloco/status.hpp"
#include "ddiloco/wan.hpp"

namespace ddiloco::syncer {

std::string admit_or_refuse(comm::UnitListener& door, int64_t id, int unit) {
  try {
    door.admit(id, unit);
    return "";
  } catch (const std::exception& e) {  // the link could not take it (out of threads, a bad key)
    const std::string why = e.what()[0] != '\0' ? e.what() : "the link could not admit it";
    try {
      door.refuse(id, why);
    } catch (const std::exception&) {  // the link has refused or dropped it itself
    }
    return why;
  }
}

Syncer::Syncer(const Config& config, const OuterPlan& plan, const Topology& topo, const ValidationSet& val,
               const checkpoint::SyncerState* resumed, const std::filesystem::path& resumed_dir,
               const SyncerLink& link)
    : config_(config),
      plan_(plan),
      M_(topo.units),
      topo_(topo),
      parameters_(ParameterLayout::gpt2(config.model)),
      fragments_(parameters_, plan.fragments, plan.h, plan.warmup),
      layout_(fragments_, plan.outer_steps ? wan::wire_codec(config) : wire::Codec{}, config.wan.ef_decay,
              static_cast<size_t>(config.wan.down_topk)),
      remote_(*link.remote),
      door_(link.listener),
      window_(remote_, layout_),
      links_(config, M_),
      core_(config, plan, window_, fragments_, links_, [this] { return now(); },
            [this](nlohmann::json e) { log_.write(e); }),
      checkpoints_(config, plan, core_, window_, [this] { return now(); }, [this](nlohmann::json e) { log_.write(e); },
                   bar_, resumed ? resumed_dir : std::filesystem::path(), resumed ? resumed->id : 0),
      read_hooks_(config, plan, window_, M_),
      budget_(config.token_budget()),
      eval_(val),
      restart_(link.recover && link.listener != nullptr),
      status_(topo.units) {
  if (door_) members_ = std::make_unique<protocol::Membership>(config, link.run_id, link.secret, layout_.bytes());
  books_before_.resize(M_);
  unit_offers_.resize(M_);
  if (restart_.restarted) core_.set_restarted();
  core_.set_isolated(door_ != nullptr);
  if (read_hooks_.any()) core_.set_before_read([this](int u) { read_hooks_.before_read(u); });
  // Isolated, the units' links are real: polls take at most 5 % of the slowest one's rate,
  // yet come at least four times per heartbeat timeout (else every unit would seem silent).
  if (door_) window_.set_link_min_rate(config.syncer.link_min_mbit_s * 1e6 / 8);
  if (door_)
    window_.set_poll_budget(std::max(0.05 * config.syncer.link_min_mbit_s * 1e6 / 8,
                                     4.0 * static_cast<double>(layout_.header_block_bytes()) /
                                         config.syncer.heartbeat_timeout_s));
  core_.on_merge([this](int p, const std::vector<int>& units) { after_merge(p, units); });
  if (resumed) {
    resumed_.from = resumed_dir.string();
    resumed_.tokens = resumed->tokens;
    resumed_.elapsed_s = resumed->elapsed_s;
    resumed_.next_eval = resumed->next_eval;
    syncer::SyncerCheckpoints::restore(core_, config, *resumed, resumed_dir);
    links_.set_elapsed_before(resumed_.elapsed_s);
  }
}

int64_t Syncer::eval_stride() const {
  if (!plan_.outer_steps) return 1;
  // In the warm-up every fragment merges after every step: H times the merges per step, and
  // evaluations stay as many per step as after it.
  const bool warm = fragments_.warm(core_.steps_total() / M_ + 1);
  return static_cast<int64_t>(config_.syncer.eval_every) * fragments_.size() * (warm ? plan_.h : 1);
}

// An idle poll finds nothing new: the syncer sleeps between them, at most 1/16 of the units'
// median inner step, so that a snapshot waits a small part of a step before it is read (it is
// due back τ steps after it was sent), and at most syncer.poll_max_us. Every poll costs both
// sides CPU (over UCX's TCP transport the leader's progress thread serves each read), which
// the learners pay for on a machine they share with the syncer: polling every millisecond cost
// 4.5 % of a core here, beside a learner whose steps take 80 ms.
int Syncer::idle_poll_us() const {
  const int cap = config_.syncer.poll_max_us;
  const double step_us = core_.nominal_period() / (plan_.outer_steps ? plan_.h : 1) * 1e6;
  return static_cast<int>(std::clamp(step_us / 16, static_cast<double>(std::min(1000, cap)),
                                     static_cast<double>(cap)));
}

bool Syncer::unit_finished(int u) const {
  return core_.unit_done(u) || (door_ && core_.stopping() && !remote_.connected(u));
}

int Syncer::run() {
  start();
  mpi::barrier_patient(topo_.world);  // time zero of the fault schedule, on every rank
  wall_.restart();
  mpi::Backoff backoff(config_.syncer.poll_max_us);
  for (;;) {
    const bool work = poll_once();
    backoff.set_max_us(idle_poll_us());
    bool all_done = true;
    for (int u = 0; u < M_; ++u) all_done &= unit_finished(u);
    if (stop_.leave_units) break;
    if (all_done && !work) {
      // Units are done, but their last snapshots may have been published after this poll.
      core_.poll();
      // All three run (no short circuit): each may find work the others' results depend on.
      bool more = core_.collect();
      more |= core_.merge_ready();
      more |= core_.deliver_pending();
      if (!more && !core_.transfers_in_flight()) break;  // else reads or deliveries on their way
    }
    if (work)
      backoff.reset();
    else
      backoff.idle();
  }
  finish();
  if (status_.server) {
    status_.server.reset();
    std::error_code ec;
    std::filesystem::remove(HttpAddress::file(config_.run.dir), ec);  // nobody serves it now
  }
  return stop_.signal;
}

// One iteration of the run loop: the units' state, the stop, then the decisions of the core.
bool Syncer::poll_once() {
  if (door_) admit_units();
  core_.poll();
  if (status_.server) {
    take_status_actions();
    if (now() >= status_.next_publish) publish_status();
  }
  if (restart_.recovery) {
    recover_once();
    return restart_.recovery != nullptr;  // recovering: poll again soon; recovered: go on at once
  }
  if (door_) settle_offers();  // a unit that reconnected offers its copies of Θ
  core_.watch_liveness();
  core_.observe_step_times();
  core_.serve_rejoins();
  core_.watch_ddp_steps();
  if (!plan_.outer_steps) checkpoints_.after_merge();  // ddp: checkpoints count inner steps
  check_stop();
  const int64_t tokens = core_.tokens_total();
  core_.publish_progress(tokens);
  // Before this iteration's merges: the syncer's part of a checkpoint must be newer than every
  // unit's, and a merge made now may already include a snapshot sent after a unit's.
  checkpoints_.try_complete(false, resumed_.elapsed_s + now(), eval_.next);
  bool work = core_.collect();
  work |= core_.merge_ready();
  work |= core_.deliver_pending();
  maybe_evaluate();
  log_eval_results();
  bar_.update(std::min(tokens, budget_), budget_,
              fmt::format("tokens | {} merges | {:.0f}s", core_.total_merges(), now()));
  return work;
}

// A stop signal (here, or, in one job, one a unit's leader received) or, in decoupled, the
// token budget. The isolated deployment's units are separate jobs: a signal to one of them
// (its Slurm task requeued) stops that unit only, and the syncer merges on without it.
void Syncer::check_stop() {
  const int64_t tokens = core_.tokens_total();
  int signal = stop_signal();
  for (int u = 0; u < M_ && signal == 0 && !door_; ++u)
    signal = static_cast<int>(core_.headers(u).control(protocol::kSignal));
  if (signal != 0 && door_ && !config_.syncer.signal_stops_units && !stop_.leave_units) {
    // The syncer's own job is being requeued (or preempted): it exits, and the units train on
    // and reconnect to its next start, which resumes from the last periodic checkpoint (the
    // units are not asked for their parts of a final one: they go on).
    stop_.leave_units = true;
    stop_.signal = signal;
    log_.write({{"event", "interrupted"}, {"signal", signal}, {"units_left_running", true},
                {"tokens", tokens}, {"elapsed_s", now()}});
    return;
  }
  if (signal != 0 && plan_.stops_on_named_round && stop_.after_version == 0) {
    // diloco ends on a round boundary, where every unit holds Θ and nothing is in flight: the
    // round now under way (no merge of it can have happened yet) is the last.
    stop_.after_version = core_.versions()[0] + 1;
    stop_.signal = signal;
    for (int u = 0; u < M_; ++u)
      if (!core_.unit_done(u)) window_.set_control(u, protocol::kStopAfterVersion, stop_.after_version);
    log_.write({{"event", "interrupted"}, {"signal", signal}, {"stop_after_version", stop_.after_version},
                {"tokens", tokens}, {"elapsed_s", now()}});
  }
  if (!core_.stopping() && !plan_.stops_on_named_round &&
      (signal != 0 || (plan_.stops_on_token_budget && tokens >= budget_))) {
    // Token budget reached (decoupled) or told to stop: every unit stops at its next step
    // boundary (units waiting for a merge stop waiting). Set before this round's deliveries,
    // so that a unit taking its last merge also sees the stop.
    core_.set_stopping(/*flush=*/signal == 0);
    stop_.signal = signal;
    log_.write({{"event", signal != 0 ? "interrupted" : "stop"}, {"signal", signal},
                {"tokens", tokens}, {"elapsed_s", now()}});
  }
}

// The isolated deployment's door: connections judged by the membership (the secret, the run,
// the unit's index, ranks, model shape, configuration and that no live process holds the
// index), and units whose process or link died.
void Syncer::admit_units() {
  for (const comm::UnitListener::Lost& l : door_->take_lost()) unit_lost(l.unit, l.reason);
  take_link_refusals();
  for (const comm::UnitListener::Pending& c : door_->accept_pending()) {
    std::string reason;
    protocol::Hello hello;
    try {
      hello = protocol::Hello::from_json(nlohmann::json::parse(c.payload), "handshake from " + c.peer);
      reason = members_->judge(hello);
      if (reason.empty() && c.bytes < layout_.bytes())
        reason = fmt::format("it exposes {} bytes, the window layout needs {}", c.bytes, layout_.bytes());
    } catch (const std::exception& e) {
      reason = e.what();
    }
    if (!reason.empty()) {
      door_->refuse(c.id, reason);
      refused(c.peer, hello.unit, reason, 1);
      continue;
    }
    if (const std::string why = admit_or_refuse(*door_, c.id, hello.unit); !why.empty()) {
      refused(c.peer, hello.unit, why, 1);
      continue;
    }
    unit_joined(hello.unit, hello);
  }
  log_refusals(false);
}

// What the link refused on its own (caps, deadlines, failed handshakes) since the last call.
void Syncer::take_link_refusals() {
  for (const auto& [reason, n] : door_->take_refusals()) refused("", -1, reason, n);
}

// A refusal's line, unless this interval has had its share: then it waits for the summary.
void Syncer::refused(const std::string& peer, int unit, const std::string& reason, int64_t n) {
  if (!refusals_.add(reason, n, now())) return;
  log_.write({{"event", "unit_refused"}, {"peer", peer}, {"unit", unit}, {"reason", reason},
              {"tokens", core_.tokens_total()}, {"elapsed_s", now()}});
  std::printf("syncer: refused a connection%s%s: %s\n", peer.empty() ? "" : " from ", peer.c_str(), reason.c_str());
  std::fflush(stdout);
}

void Syncer::log_refusals(bool force) {
  const auto s = refusals_.take(now(), force);
  if (!s) return;
  log_.write({{"event", "connections_refused"}, {"count", s->total}, {"by_reason", s->by_reason},
              {"from_s", s->from_s}, {"to_s", s->to_s}, {"total", refusals_.total()},
              {"tokens", core_.tokens_total()}, {"elapsed_s", now()}});
  std::string reasons;
  for (const auto& [reason, n] : s->by_reason) reasons += fmt::format("{}{}: {}", reasons.empty() ? "" : "; ", reason, n);
  std::printf("syncer: refused %lld more connections in %.0f s (%s); %lld since the start\n",
              static_cast<long long>(s->total), s->to_s - s->from_s, reasons.c_str(),
              static_cast<long long>(refusals_.total()));
  std::fflush(stdout);
}

// A new process of unit u: a fresh, zeroed window (or a live unit's, reconnecting to a
// restarted syncer). The unit asks for Θ at once (its first rejoin request), and is live from
// now on.
void Syncer::unit_joined(int u, const protocol::Hello& hello) {
  members_->joined(hello, now());
  core_.unit_connected(u);
  checkpoints_.unit_connected(u);
  read_hooks_.unit_connected(u);
  // Its offers so far are settled as its window says (a new process: none; a live one: what
  // this or an earlier syncer took); what was read of an earlier connection is stale.
  unit_offers_[u].settled = core_.headers(u).control(protocol::kOfferTaken);
  unit_offers_[u].versions.clear();
  log_.write({{"event", "unit_connected"}, {"unit", u}, {"restart", hello.restart}, {"host", hello.host},
              {"pid", hello.pid}, {"ranks", hello.ranks}, {"processes", hello.processes},
              {"tokens", core_.tokens_total()}, {"elapsed_s", now()}});
  std::printf("syncer: unit %d connected (pid %lld on %s, restart %lld)\n", u,
              static_cast<long long>(hello.pid), hello.host.c_str(), static_cast<long long>(hello.restart));
  std::fflush(stdout);
}

// Unit u's process (or its link) died: weight 0 from now on, merges go on at the quorum rule.
void Syncer::unit_lost(int u, const std::string& reason) {
  if (!members_->present(u)) return;  // already lost (the heartbeat, then the closed endpoint)
  const double last_seen = core_.heard_at(u);
  members_->lost(u, now(), reason);
  books_before_[u] += book_in_window(u);  // as it stood at its last step: the process is gone
  core_.unit_lost(u);
  log_.write({{"event", "unit_lost"}, {"unit", u}, {"reason", reason}, {"last_seen_s", last_seen},
              {"tokens", core_.tokens_total()}, {"elapsed_s", now()}});
  std::printf("syncer: unit %d lost (%s); merging on without it\n", u, reason.c_str());
  std::fflush(stdout);
}

// After a merge, before its delivery: a unit merged for the first time since it joined again
// has healed; a periodic checkpoint may be due.
void Syncer::after_merge(int p, const std::vector<int>& units) {
  for (int u : units) {
    if (!members_) break;
    if (const auto heal = members_->merged(u, now()))
      log_.write({{"event", "unit_joined"}, {"unit", u}, {"restart", members_->restarts(u)},
                  {"heal_s", *heal}, {"fragment", p}, {"version", core_.versions()[p]},
                  {"tokens", core_.tokens_total()}, {"elapsed_s", now()}});
  }
  checkpoints_.after_merge();
}

void Syncer::maybe_evaluate() {
  const int64_t merges = core_.total_merges();
  if (merges < eval_.next || merges == 0) return;
  nlohmann::json tags = {{"event", "global_eval"},
                         {"version", merges},
                         {"round", merges / fragments_.size()},
                         {"step", core_.steps_total() / M_},
                         {"tokens", core_.tokens_total()},
                         {"elapsed_s", now()}};
  if (eval_.evaluator->submit(core_.flat_theta(), std::move(tags))) eval_.next = merges + eval_stride();
}

void Syncer::log_eval_results() {
  while (auto r = eval_.evaluator->result()) {
    log_.write(*r);
    if (bar_.enabled()) bar_.clear();
    std::printf("global_eval | version %lld | tokens %.2fM | %.1fs | val_loss %.4f\n",
                static_cast<long long>((*r)["version"].get<int64_t>()),
                (*r)["tokens"].get<int64_t>() / 1e6, (*r)["elapsed_s"].get<double>(),
                (*r)["val_loss"].get<double>());
    std::fflush(stdout);
  }
}

// Before time zero: the effective configuration, the log, the evaluator, the start events.
void Syncer::start() {
  const std::filesystem::path dir = config_.run.dir;
  const std::string yaml = to_yaml(config_);
  write_text_atomically(dir / "config.yaml", yaml);
  std::printf("ddiloco %s: effective configuration (saved to %s)\n%s", DDILOCO_VERSION,
              (dir / "config.yaml").c_str(), yaml.c_str());
  log_ = JsonlWriter(dir / "metrics.jsonl", resumed_.from.empty() && !restart_.restarted);
  status_.yaml = std::make_shared<const std::string>(yaml);
  start_status();
  eval_.evaluator = std::make_unique<GlobalEvaluator>(config_.model, eval_.val, config_.train.batch_size,
                                                 omp_get_max_threads());
  eval_.next = resumed_.next_eval > 0 ? resumed_.next_eval : core_.total_merges() + eval_stride();
  nlohmann::json unit_ranks = nlohmann::json::array();
  for (int u = 0; u < M_; ++u) unit_ranks.push_back(config_.unit_ranks(u));
  // unix_s: the wall clock as this syncer starts (its time zero follows within the start-up's
  // milliseconds), so that the events of the syncer processes of one run, each on its own
  // clock, can be put on one time line.
  const double unix_s = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  log_.write({{"event", "start"}, {"step", 0}, {"tokens", 0}, {"elapsed_s", 0.0}, {"unix_s", unix_s - now()},
              {"mode", mode_name(plan_.mode)}, {"units", M_}, {"unit_ranks", unit_ranks},
              {"fragments", fragments_.size()}, {"h", plan_.h}, {"overlap", plan_.overlap},
              {"quorum", plan_.quorum}, {"parameters", parameters_.size()},
              {"token_budget", budget_}, {"checkpoints", checkpoints_.on() ? checkpoints_.root().string() : ""}});
  if (restart_.restarted) {
    restart_.recovery = std::make_unique<syncer::Recovery>(
        M_, plan_.quorum, now(), config_.syncer.recover_timeout_s, config_.syncer.heartbeat_timeout_s);
    restart_.copies.assign(fragments_.size(), {});
    std::printf("syncer: restarted mid-run: recovering Θ from the units' copies (waiting up to "
                "syncer.recover_timeout_s = %g s for K = %d of them)\n",
                config_.syncer.recover_timeout_s, std::min(plan_.quorum, M_));
  }
  if (!resumed_.from.empty() || restart_.restarted) {
    log_.write({{"event", "resume"},
                {"path", resumed_.from.empty() ? nlohmann::json() : nlohmann::json(resumed_.from)},
                {"recovering", restart_.restarted}, {"version", core_.total_merges()},
                {"versions", core_.versions()}, {"tokens", resumed_.tokens},
                {"elapsed_before_s", resumed_.elapsed_s}, {"elapsed_s", 0.0}});
  }
  if (!resumed_.from.empty()) {
    std::printf("resumed from %s: %lld merges, %.2fM tokens\n", resumed_.from.c_str(),
                static_cast<long long>(core_.total_merges()), resumed_.tokens / 1e6);
    if (plan_.stops_on_token_budget && resumed_.tokens >= budget_)
      std::printf("the checkpoint's job had completed its token budget (%.2fM): nothing left to "
                  "train\n", budget_ / 1e6);
  }
  checkpoints_.start();
  std::printf("syncer: mode %s, %d units, P=%d fragments, H=%d, tau=%d, K=%d, budget %.2fM tokens\n",
              mode_name(plan_.mode), M_, fragments_.size(), plan_.h, plan_.overlap, plan_.quorum,
              budget_ / 1e6);
  if (config_.chaos.enabled()) {
    // The schedule replays exactly with chaos.schedule_file: RUN/chaos_schedule.yaml.
    const std::filesystem::path schedule_path = dir / "chaos_schedule.yaml";
    write_text_atomically(schedule_path, links_.schedule().to_yaml());
    const chaos::Schedule::Counts n = links_.schedule().counts();
    log_.write({{"event", "chaos"}, {"crashes", n.crashes}, {"slow_episodes", n.slow},
                {"link_episodes", n.link}, {"schedule", schedule_path.string()},
                {"tokens", 0}, {"elapsed_s", 0.0}});
    std::printf("chaos: %lld crashes, %lld straggler episodes, %lld link degradations scheduled "
                "(%s)\n",
                static_cast<long long>(n.crashes), static_cast<long long>(n.slow),
                static_cast<long long>(n.link), schedule_path.c_str());
  }
  std::fflush(stdout);
}

int run_syncer(const Config& config, const OuterPlan& plan, const Topology& topology,
               const ValidationSet& val, const std::filesystem::path& resume,
               const checkpoint::SyncerState* resumed, const SyncerLink& link) {
  Syncer syncer(config, plan, topology, val, resumed, resume, link);
  return syncer.run();
}

}  // namespace ddiloco::syncer
