// The syncer's decisions (syncer_core.hpp): reading snapshots, quorum and grace, merging,
// delivering under flow control, rejoins and liveness.
#include "ddiloco/syncer_core.hpp"

#include <algorithm>
#include <limits>
#include <cmath>
#include <numeric>
#include <random>

#include "ddiloco/checkpoint.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/model.hpp"

namespace ddiloco::syncer {

namespace {
int64_t random_epoch() {
  std::random_device rd;
  const uint64_t e = (static_cast<uint64_t>(rd()) << 32 | rd()) >> 1;  // ≥ 0
  return static_cast<int64_t>(e == 0 ? 1 : e);
}
}  // namespace

SyncerCore::SyncerCore(const Config& config, const OuterPlan& plan, protocol::SyncerWindow& window,
                       const protocol::FragmentPlan& fragments, UnitLinks& links, Clock clock, EventSink sink)
    : config_(config),
      plan_(plan),
      M_(config.units.count),
      fragments_(fragments),
      window_(window),
      links_(links),
      hooks_{std::move(clock), std::move(sink), {}, {}},
      outer_(fragments, config.outer.lr, config.outer.momentum, parse_merge_rule(config.outer.merge)),
      grace_(config.syncer.grace_gamma, config.syncer.grace_cap_steps, plan.overlap),
      bound_(fragments.size(), config.syncer.max_outer_grad_ratio, config.syncer.max_weight_ratio),
      history_(config.outer.anchor, fragments.size()),
      lineage_{random_epoch(), {}} {
  const int P = fragments_.size();
  // Θ₀ is the units' common initialisation (same seed).
  Gpt<float> model(config.model);
  model.init_weights(static_cast<uint64_t>(config.run.seed));
  theta_.resize(P);
  incoming_.resize(P);
  for (int p = 0; p < P; ++p) {
    theta_[p].resize(window_.layout().numel(p));
    fragments_.pack(p, model.parameters(), theta_[p]);
    incoming_[p].resize(theta_[p].size());
  }
  version_.assign(P, 0);
  lineage_.fork.assign(P, 0);
  rounds_.assign(P, Round{});
  slots_.assign(M_, std::vector<Slot>(P));
  for (auto& unit : slots_)
    for (int p = 0; p < P; ++p) unit[p].data.resize(theta_[p].size());
  for (int p = 0; p < P; ++p) history_.reset(p, 0, theta_[p]);
  headers_.resize(M_);
  for (auto& h : headers_) h.words.assign(window_.layout().header_block_bytes() / sizeof(int64_t), 0);
  unit_.assign(M_, Unit{});
  numbering_.merged.assign(M_, std::vector<int64_t>(P, 0));
  numbering_.base.assign(M_, std::vector<int64_t>(P, 0));
  for (int u = 0; u < M_; ++u) job_clock_.step = std::min(job_clock_.step, tokens_per_step(u));
  // The wire format's references (sync_window.hpp): Θ₀ (the units set the same).
  for (int u = 0; u < M_ && plan.outer_steps; ++u)
    for (int p = 0; p < P; ++p) window_.set_reference(u, p, 0, theta_[p]);
}

bool SyncerCore::unit_live(int u) const {
  return window_.remote().connected(u) && !unit_done(u) && !unit_[u].silent;
}

namespace {
// Sequence numbers past the last consumed, `acked` (0 ≤ acked ≤ kMaxAcked), that a unit can have
// reached (sequence_plausible).
constexpr int64_t kMaxJump = int64_t{1} << 32, kMaxAcked = int64_t{1} << 40;
bool plausible_sequence(int64_t seq, int64_t acked) { return seq > acked && seq - acked <= kMaxJump; }

// a + max(b, 0), saturating at INT64_MAX: the counts come from the units' header words.
int64_t add_count(int64_t a, int64_t b) {
  b = std::max<int64_t>(b, 0);
  return a > std::numeric_limits<int64_t>::max() - b ? std::numeric_limits<int64_t>::max() : a + b;
}
}  // namespace

int64_t SyncerCore::unit_tokens(int u) const {
  return add_count(add_count(0, unit_[u].tokens_before), headers_[u].control(protocol::kTokensDone));
}

int64_t SyncerCore::unit_steps(int u) const {
  return add_count(add_count(0, unit_[u].steps_before), headers_[u].control(protocol::kStepsDone));
}

int64_t SyncerCore::tokens_total() const {
  int64_t t = 0;
  for (int u = 0; u < units(); ++u) t = add_count(t, unit_tokens(u));
  return t;
}

int64_t SyncerCore::steps_total() const {
  int64_t s = 0;
  for (int u = 0; u < units(); ++u) s = add_count(s, unit_steps(u));
  return s;
}

int64_t SyncerCore::total_merges() const {
  return std::accumulate(version_.begin(), version_.end(), int64_t{0});
}

double SyncerCore::nominal_period() const {
  return (plan_.outer_steps ? plan_.h : 1.0) * pace_.median_step_s;
}

std::vector<float> SyncerCore::flat_theta() const {
  std::vector<float> flat(fragments_.layout().size());
  for (int p = 0; p < fragments_.size(); ++p) fragments_.unpack(p, theta_[p], flat);
  return flat;
}

std::vector<float> SyncerCore::flat_momentum() {
  std::vector<float> flat(fragments_.layout().size());
  for (int p = 0; p < fragments_.size(); ++p) fragments_.unpack(p, outer_.momentum(p), flat);
  return flat;
}

int64_t SyncerCore::snapshots_unmerged() const {
  int64_t n = 0;
  for (const auto& unit : slots_)
    for (const Slot& s : unit) n += s.fresh;
  return n;
}

int64_t SyncerCore::rejoins_served() const {
  int64_t n = 0;
  for (const Unit& unit : unit_) n += unit.rejoin_served;
  return n;
}

// Unit u has a snapshot of fragment p the syncer has not merged: read (or on its way), or
// still unread in its outbox (not one refused unread: sequence_plausible).
bool SyncerCore::snapshot_pending(int u, int p) const {
  const Slot& s = slots_[u][p];
  const int64_t seq = headers_[u].header(p, protocol::kOutSeq);
  return s.fresh || (seq > std::max(s.acked, s.unacked) && plausible_sequence(seq, s.acked));
}

void SyncerCore::poll() {
  window_.poll(headers_);
  for (int u = 0; u < M_; ++u)
    if (unit_[u].torn && !window_.poll_pending(u)) unit_[u].repolled = true;
}


void SyncerCore::set_stopping(bool flush) {
  stopping_ = true;
  flush_ = flush;
  for (int u = 0; u < M_; ++u) window_.request_stop(u);
}

// ---------------------------------------------------------------------------------------------
// Membership: units that come and go (isolated deployment).

void SyncerCore::unit_connected(int u) {
  window_.reset_unit(u);
  for (int p = 0; p < fragments_.size(); ++p) {
    Slot& s = slots_[u][p];
    int64_t& base = numbering_.base[u][p];
    base = std::max(base + std::max(s.acked, s.seq), numbering_.merged[u][p]);
    std::vector<float> keep = std::move(s.data);
    const int64_t may_hold = s.may_hold;
    s = Slot{};
    s.data = std::move(keep);
    s.may_hold = may_hold;
  }
  // What its window says now: zeros for a new process; for a live one that reconnects to this
  // (restarted) syncer, the snapshots the previous syncer consumed stay consumed.
  window_.poll(headers_, /*all=*/true);
  // (A word the unit wrote: kept where the numbering's sums cannot overflow.)
  for (int p = 0; p < fragments_.size(); ++p)
    slots_[u][p].acked = std::clamp<int64_t>(headers_[u].header(p, protocol::kOutAck), 0, kMaxAcked);
  // The unit's earlier processes' work, as this syncer or the one it replaces wrote it into a
  // live window (zeros in a new process's; a fresh run's syncer takes none of an earlier run):
  // the larger count holds, and the window keeps it for the next.
  const bool books = deployment_.restarted || headers_[u].control(protocol::kSyncerEpoch) == lineage_.epoch;
  const protocol::UnitHeaders& h = headers_[u];
  Unit& unit = unit_[u];
  unit.tokens_before = std::max({unit.tokens_before, books ? h.control(protocol::kTokensBefore) : 0,
                                 unit.tokens_floor - h.control(protocol::kTokensDone)});
  unit.steps_before = std::max(unit.steps_before, books ? h.control(protocol::kStepsBefore) : 0);
  window_.set_control(u, protocol::kTokensBefore, unit.tokens_before);
  window_.set_control(u, protocol::kStepsBefore, unit.steps_before);
  window_.set_control(u, protocol::kSyncerEpoch, lineage_.epoch);
  unit.heartbeat = -1;
  unit.heard_at = now();
  unit.silent = false;
  // A rejoin a previous syncer served is not served again.
  unit.rejoin_served = std::max<int64_t>(0, h.control(protocol::kRejoinServed));
  unit.serving = Serving{};
  unit.torn = unit.repolled = false;
  // The job's progress as the unit last heard it stays (a restarted syncer knows it from the
  // units): written lower, every unit's learning-rate schedule would start over.
  if (books) job_clock_.sent = std::max(job_clock_.sent, h.control(protocol::kJobTokens));
  if (plan_.lr_on_job_clock) window_.set_job_tokens(u, job_clock_.sent);
  if (stopping_) window_.request_stop(u);
}

void SyncerCore::unit_lost(int u) {
  Unit& unit = unit_[u];
  unit.tokens_before += headers_[u].control(protocol::kTokensDone);
  unit.steps_before += headers_[u].control(protocol::kStepsDone);
  std::fill(headers_[u].words.begin(), headers_[u].words.end(), 0);
  window_.abandon(u);
  unit.serving = Serving{};
  unit.torn = unit.repolled = false;
  for (Slot& s : slots_[u]) {
    s.fresh = false;
    s.owed = false;
    s.outgoing_version = 0;
    s.unacked = 0;
  }
}

// ---------------------------------------------------------------------------------------------
// Liveness and step times.

void SyncerCore::observe_step_times() {
  std::vector<double> steps;
  for (int u = 0; u < M_; ++u)
    if (unit_live(u) && headers_[u].control(protocol::kStepTimeNs) > 0)
      steps.push_back(headers_[u].control(protocol::kStepTimeNs) * 1e-9);
  if (steps.empty()) return;
  std::sort(steps.begin(), steps.end());
  pace_.median_step_s = steps[steps.size() / 2];
  grace_.observe_steps(steps.back(), pace_.median_step_s);
}

// A heartbeat moves once per inner step: a unit whose steps are slow (a straggler, a large
// model, the first step) is not silent before three of its steps have passed.
double SyncerCore::silence_after_s(int u) const {
  const double step_s = static_cast<double>(headers_[u].control(protocol::kStepTimeNs)) * 1e-9;
  return std::max(config_.syncer.heartbeat_timeout_s, 3 * step_s);
}

void SyncerCore::hear(int u, int64_t beat) {
  Unit& unit = unit_[u];
  unit.heartbeat = beat;
  unit.heard_at = now();
  if (!unit.silent) return;
  unit.silent = false;
  hooks_.log({{"event", "unit_back"}, {"unit", u}, {"tokens", tokens_total()}, {"elapsed_s", now()}});
}

void SyncerCore::watch_liveness() {
  // ddp has no quorum to leave a unit out of, and its healthy units sit in the all-reduce
  // without a heartbeat while a crashed one is down: nothing to watch.
  if (!plan_.outer_steps) return;
  for (int u = 0; u < M_; ++u) {
    if (unit_done(u) || !window_.remote().connected(u)) continue;
    const int64_t beat = headers_[u].control(protocol::kHeartbeat);
    // A unit whose transfer is on its way is not polled (its headers wait behind it): bytes
    // moving within the transfer's patience are a sign of life; past it, silence counts.
    report_slow_link(u);
    Unit& unit = unit_[u];
    if (beat != unit.heartbeat || window_.lane_on_time(u)) {
      hear(u, beat);
    } else if (!unit.silent && now() - unit.heard_at > silence_after_s(u)) {
      // Weight 0 and out of every quorum until it beats again (unit_back). Isolated, this is
      // one of the two ways to lose a unit (the other: its endpoint fails); its connection
      // stays, so that a slow process (a first step under load) is not made to start over.
      unit.silent = true;
      hooks_.log({{"event", deployment_.isolated ? "unit_lost" : "unit_silent"}, {"unit", u},
                  {"last_heard_s", unit.heard_at}, {"last_seen_s", unit.heard_at},
                  {"reason", fmt::format("heartbeat: silent for {:.1f} s", now() - unit.heard_at)},
                  {"tokens", tokens_total()}, {"elapsed_s", now()}});
    }
  }
}

// A transfer past its patience: the link is slower than the one the syncer was told to allow
// for (syncer.link_min_mbit_s), or cut. Said once per transfer, so that a user sees why a unit
// that trains on goes silent, and what to set.
void SyncerCore::report_slow_link(int u) {
  if (window_.lane(u) == protocol::SyncerWindow::Lane::idle || window_.lane_on_time(u) ||
      unit_[u].slow_reported == window_.lane_serial(u))
    return;
  unit_[u].slow_reported = window_.lane_serial(u);
  const double age = window_.lane_age_s(u);
  const auto bytes = window_.lane_bytes(u);
  hooks_.log({{"event", "link_slow"}, {"unit", u}, {"fragment", window_.lane_fragment(u)},
              {"transfer", window_.lane(u) == protocol::SyncerWindow::Lane::fetch ? "read" : "delivery"},
              {"bytes", bytes}, {"after_s", age},
              {"reason", fmt::format("{} bytes not through after {:.2f} s: the link is slower than "
                                     "syncer.link_min_mbit_s = {:g} allows for (or cut)",
                                     bytes, age, config_.syncer.link_min_mbit_s)},
              {"tokens", tokens_total()}, {"elapsed_s", now()}});
}

void SyncerCore::watch_ddp_steps() {
  if (plan_.outer_steps || headers_[0].control(protocol::kStepsDone) <= pace_.ddp_steps_seen) return;
  pace_.ddp_steps_seen = headers_[0].control(protocol::kStepsDone);  // ddp: Θ moved a step
  pace_.downtime.update(now(), nominal_period());
}

// ---------------------------------------------------------------------------------------------
// Rejoins.

// A unit back from a crash asks for Θ: every fragment goes into its inbox at the current
// version, whatever it held (it discarded its state and reads nothing until served; its
// acknowledgements read −1 until it has taken these, so no delivery overwrites them). A unit
// that asks is alive: it is heard now, and its next outer gradients are measured from the
// versions served, which the syncer keeps (outer.anchor: base).
void SyncerCore::serve_rejoins() {
  if (!plan_.outer_steps) return;
  for (int u = 0; u < M_; ++u) {
    const int64_t request = headers_[u].control(protocol::kRejoinRequest);
    if (request <= unit_[u].rejoin_served || unit_done(u) || !window_.remote().connected(u)) continue;
    hear(u, headers_[u].control(protocol::kHeartbeat));  // a unit that asks is alive
    // Synchronous modes count rounds: a snapshot the unit sent before it crashed and that
    // waits to be merged completes its round first (the request makes the unit heard, so the
    // round merges now); the rejoin then serves that round's Θ. Served before, the unit would
    // count the pending round as its next and stay one round behind.
    bool pending_round = false;
    for (int p = 0; p < fragments_.size(); ++p) pending_round |= slots_[u][p].fresh;
    if (pending_round && plan_.every_merge_has_all && unit_[u].serving.next == 0) continue;
    if (!serve(u)) continue;  // on its way, or unreachable now: the next poll goes on
    if (!window_.set_control(u, protocol::kRejoinServed, request)) continue;  // next poll
    unit_[u].rejoin_served = request;
    hooks_.log({{"event", "rejoin"}, {"unit", u}, {"request", request}, {"versions", version_},
                {"bytes_out", unit_[u].serving.bytes}, {"serve_s", now() - unit_[u].serving.started},
                {"tokens", tokens_total()}, {"elapsed_s", now()}});
    unit_[u].serving = Serving{};
  }
}

// Every fragment into unit u's inbox, raw fp32 (the unit lost its reference), one after another
// on its lane. The unit waits for them; their bytes cross its down link, over which (emulated)
// they land later, as they would over a real one. True once all are written and landed.
bool SyncerCore::serve(int u) {
  Serving& sv = unit_[u].serving;
  if (sv.next == 0 && window_.lane(u) == protocol::SyncerWindow::Lane::idle) sv.started = now();
  while (sv.next < fragments_.size()) {
    if (window_.lane(u) == protocol::SyncerWindow::Lane::deliver && unit_[u].in_flight.serve) {
      const std::optional<size_t> bytes = window_.end_deliver(u);
      if (!bytes) return false;
      if (*bytes == 0) return false;  // unreachable now (its link stalled): served again next poll
      const int p = unit_[u].in_flight.p;
      sv.lands_at = std::max(sv.lands_at, links_.served(u, *bytes, now()));
      sv.bytes += *bytes;
      Slot& s = slots_[u][p];
      s.outgoing_version = 0;  // a delivery on its way is superseded
      s.delivered = unit_[u].in_flight.version;
      s.may_hold = std::max(s.may_hold, s.delivered);
      if (!s.fresh) s.meta.base_version = unit_[u].in_flight.version;
      ++sv.next;
      continue;
    }
    if (window_.lane(u) != protocol::SyncerWindow::Lane::idle) return false;  // a transfer of before: wait
    const int p = sv.next;
    if (!window_.start_deliver(u, p, version_[p], theta_[p], /*raw=*/true)) return false;
    unit_[u].in_flight = InFlight{p, 0, {}, version_[p], true};
  }
  return now() >= sv.lands_at;  // over an emulated link: once the last fragment has landed
}

// ---------------------------------------------------------------------------------------------
// Collecting snapshots.

// syncer.max_staleness: a snapshot whose base is further behind Θ_p than this is refused, when
// it is read and again when it would be merged (a silent unit's snapshot waits, and ages).
bool SyncerCore::too_stale(int p, int64_t base_version) const {
  return config_.syncer.max_staleness > 0 && version_[p] - base_version > config_.syncer.max_staleness;
}
std::string SyncerCore::staleness_problem(int p, int64_t base_version) const {
  return fmt::format("staleness {} exceeds syncer.max_staleness = {}", version_[p] - base_version,
                     config_.syncer.max_staleness);
}

// A waiting snapshot that aged past the bound (its unit was silent, a partition) is dropped as
// one refused on arrival would be: the unit gets the current fragment instead of a merge.
void SyncerCore::drop_stale(int p) {
  for (int u = 0; u < M_; ++u) {
    Slot& s = slots_[u][p];
    if (!s.fresh || !too_stale(p, s.meta.base_version)) continue;
    ++rejected_;
    hooks_.log({{"event", "snapshot_rejected"}, {"unit", u}, {"fragment", p}, {"seq", s.seq},
                {"reason", staleness_problem(p, s.meta.base_version)}, {"elapsed_s", now()},
                {"tokens", tokens_total()}});
    s.fresh = false;
    s.owed = true;
  }
}

// Why a snapshot just read is refused ("" = it is accepted).
std::string SyncerCore::check_snapshot(int u, int p, const protocol::SnapshotMeta& meta,
                                       const protocol::SyncerWindow::Fetched& got, int64_t seq) const {
  if (got.seq_after != seq) return fmt::format("torn: sequence {} became {} during the read", seq, got.seq_after);
  if (!got.problem.empty()) return got.problem;
  // Its token weight c_tok²/c_steps (merge.hpp) is then at most c_steps · tps²: as much as the
  // steps it claims could have earned at its configured batch, never more.
  const int64_t tps = tokens_per_step(u);
  int64_t most = 0;  // c_steps · tps; an overflow is a limit no int64 c_tok exceeds
  const bool huge = __builtin_mul_overflow(meta.c_steps, tps, &most);
  if (meta.c_steps < 0 || meta.c_tok < 0 || (!huge && meta.c_tok > most))
    return fmt::format("token counters c_steps = {}, c_tok = {}: a unit of {} tokens per step makes "
                       "0..c_steps·{} tokens in c_steps ≥ 0 steps",
                       meta.c_steps, meta.c_tok, tps, tps);
  const std::vector<float>& x = incoming_[p];
  if (!std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); })) return "non-finite values";
  // A unit trains from what it was sent: a base newer than that is a lie, even once Θ_p has
  // reached it (measured from that version, the unit's stale values would pull Θ_p back).
  const int64_t newest = slots_[u][p].may_hold;
  if (meta.base_version < 0 || meta.base_version > newest)
    return fmt::format("base version {} outside 0..{} (the newest version of fragment {} unit {} may hold)",
                       meta.base_version, newest, p, u);
  if (too_stale(p, meta.base_version)) return staleness_problem(p, meta.base_version);
  if (!history_.holds(p, meta.base_version))
    return fmt::format("base version {} is no longer held (oldest {})", meta.base_version,
                       history_.oldest(p));
  return "";
}

// The snapshot crosses the unit's up link (ddp's θ for evaluation is not WAN traffic): it
// counts from its arrival, and the outbox stays busy (the unit skips publishing) until its last
// byte has left. Without wan.* the link is unlimited and a chaos degradation delays the arrival
// instead; a snapshot that supersedes one not merged yet then arrives when that one would have
// (a unit that publishes faster than its degraded link carries still gets merged). Over an
// emulated link it cannot outrun its own transfer.
void SyncerCore::accept_snapshot(int u, int p, int64_t seq, const protocol::SnapshotMeta& meta, size_t wire_bytes,
                                 int64_t ref) {
  Slot& s = slots_[u][p];
  std::swap(s.data, incoming_[p]);
  s.wire_bytes = wire_bytes;
  if (history_.by_reference()) {  // copied: the window prunes references the unit no longer names
    const std::span<const float> r = ref < 0 ? std::span<const float>() : window_.reference(u, p, ref);
    s.anchor.assign(r.begin(), r.end());
  }
  if (s.fresh) ++superseded_;
  if (plan_.outer_steps) {
    const wan::Transfer t = links_.snapshot(u, wire_bytes, s.data.size() * sizeof(float), now());
    if (!s.fresh) s.arrives_at = t.arrive_s;
    else if (links_.emulated()) s.arrives_at = std::max(s.arrives_at, t.arrive_s);
    if (t.left_s > now()) {
      s.unacked = seq;
      s.ack_at = t.left_s;
    }
  }
  s.fresh = true;
  s.meta = meta;
  s.seq = seq;
  if (s.unacked == 0) {
    window_.ack(u, p, seq);
    s.acked = seq;
  }
  if (rounds_[p].first_at < 0) rounds_[p].first_at = now();
}

bool SyncerCore::collect() {
  bool any = false;
  for (int u = 0; u < M_; ++u)
    if (window_.remote().connected(u)) any |= collect_unit(u);
  return any;
}

// Unit u's snapshots, one read at a time on its lane (SyncerWindow): the read that completed is
// taken in, then the next fragment with a new snapshot is started; over a slow link it is on
// its way while the syncer goes on with the other units.
bool SyncerCore::collect_unit(int u) {
  bool any = false;
  if (unit_[u].torn) {  // a torn read: wait for the poll that reads its headers again
    if (!headers_[u].reachable || !unit_[u].repolled) return false;
    unit_[u].torn = unit_[u].repolled = false;
  }
  if (window_.lane(u) == protocol::SyncerWindow::Lane::fetch) {
    if (!end_read(u)) return false;  // on its way, or the unit could not be read
    any = true;
    if (unit_[u].torn) return true;  // its headers are stale: nothing more before a fresh poll
  }
  for (int p = 0; p < fragments_.size(); ++p) {
    Slot& s = slots_[u][p];
    if (s.unacked > 0) {  // the last one is still leaving the unit over its link
      if (now() < s.ack_at) continue;
      window_.ack(u, p, s.unacked);
      s.acked = s.unacked;
      s.unacked = 0;
      any = true;
    }
    if (window_.lane(u) != protocol::SyncerWindow::Lane::idle) continue;  // a delivery on its way: acks only
    const int64_t seq = headers_[u].header(p, protocol::kOutSeq);
    if (seq == s.acked || !sequence_plausible(u, p, seq)) continue;
    const protocol::SnapshotMeta meta{headers_[u].header(p, protocol::kOutSteps), headers_[u].header(p, protocol::kOutTokens),
                            headers_[u].header(p, protocol::kOutStep), headers_[u].header(p, protocol::kOutBaseVersion)};
    if (hooks_.before_read) hooks_.before_read(u);  // test hooks (read_hooks.hpp)
    // Lost, or its link stalled (read again once it is back): nothing of this unit now.
    if (!window_.start_fetch(u, p, headers_[u])) break;
    unit_[u].in_flight = InFlight{p, seq, meta};
    any = true;
    if (!end_read(u) || unit_[u].torn) break;  // on its way: taken in at a later poll
  }
  return any;
}

// A unit numbers its snapshots 1, 2, ... and publishes only into an outbox the syncer consumed,
// so a new one is the last consumed + 1 (more after a torn read, never billions more: the
// numbering of a unit's processes adds them up). One that goes backwards or jumps is refused
// unread, with one line until a snapshot of the slot is read again, and its outbox left busy:
// in decoupled the unit holds up only itself (the synchronous modes wait for it as for a unit
// that never publishes).
bool SyncerCore::sequence_plausible(int u, int p, int64_t seq) {
  Slot& s = slots_[u][p];
  if (plausible_sequence(seq, s.acked)) return true;
  if (!s.seq_refused) {
    s.seq_refused = true;
    ++rejected_;
    hooks_.log({{"event", "snapshot_rejected"}, {"unit", u}, {"fragment", p}, {"seq", seq},
                {"reason", fmt::format("sequence number {} {} the last consumed, {}", seq,
                                       seq < s.acked ? "is below" : "jumps too far past", s.acked)},
                {"elapsed_s", now()}, {"tokens", tokens_total()}});
  }
  return false;
}

// The read on unit u's lane, once over: checked, then accepted or refused. False while it is on
// its way, or when the unit could not be read (lost mid-read: unit_lost follows; or its link
// stalled: read again once it is back), and nothing of it was done.
bool SyncerCore::end_read(int u) {
  const InFlight r = unit_[u].in_flight;
  // Read beside the slot: a refused snapshot leaves an earlier one that waits intact.
  const std::optional<protocol::SyncerWindow::Fetched> got = window_.end_fetch(u, incoming_[r.p]);
  if (!got || got->unreachable || !window_.remote().connected(u)) return false;
  Slot& s = slots_[u][r.p];
  s.seq_refused = false;
  if (const std::string problem = check_snapshot(u, r.p, r.meta, *got, r.seq); !problem.empty()) {
    ++rejected_;
    hooks_.log({{"event", "snapshot_rejected"}, {"unit", u}, {"fragment", r.p}, {"seq", r.seq},
                {"reason", problem}, {"elapsed_s", now()}, {"tokens", tokens_total()}});
    if (got->seq_after != r.seq) {  // re-read the newer snapshot after a fresh poll
      unit_[u].torn = true;
      window_.request_poll(u);
      return true;
    }
    window_.ack(u, r.p, r.seq);
    s.acked = r.seq;
    s.owed = true;  // a unit waiting for a merge gets the current one
    // (Not a checksum mismatch: that is what a crash leaves, and the unit rejoins and redoes
    // its round, whose merge waits for it: docs/algorithm.md "Failure and rejoin".)
    if (plan_.every_merge_has_all && plan_.outer_steps && !got->garbled) stand_in(u, r.p, r.seq);
    return true;
  }
  accept_snapshot(u, r.p, r.seq, r.meta, got->wire_bytes, got->ref);
  return true;
}

// The synchronous modes: every merge waits for every unit, and each unit for the merge of its
// own snapshot. A snapshot refused from a unit that goes on (one that lies, or whose values are
// not finite) stands in its round as Θ_p itself with weight 0 (it moves nothing), so the round
// is merged from the others and its merge goes to every unit.
void SyncerCore::stand_in(int u, int p, int64_t seq) {
  Slot& s = slots_[u][p];
  s.data.assign(theta_[p].begin(), theta_[p].end());
  s.meta = protocol::SnapshotMeta{0, 0, 0, version_[p]};
  s.seq = seq;
  s.fresh = true;
  s.wire_bytes = 0;
  s.anchor.clear();
  s.arrives_at = now();
  if (rounds_[p].first_at < 0) rounds_[p].first_at = now();
}

bool SyncerCore::transfers_in_flight() const {
  for (int u = 0; u < M_; ++u)
    if (window_.lane(u) != protocol::SyncerWindow::Lane::idle && window_.remote().connected(u)) return true;
  return false;
}

// ---------------------------------------------------------------------------------------------
// Quorum, grace and the merge.

// The units whose snapshot of fragment p may go into a merge now. A silent unit is out of
// every quorum until it reports again; its last snapshot waits. The final flush takes what has
// arrived: over an emulated WAN, a snapshot still on its way when the job ends never reaches
// the syncer (without one, a degraded link's delay is waived then).
std::vector<int> SyncerCore::ready_units(int p) const {
  std::vector<int> ready;
  for (int u = 0; u < M_; ++u) {
    const Slot& s = slots_[u][p];
    const bool arrived = s.arrives_at <= now() || (stopping_ && !links_.emulated());
    if (s.fresh && (!unit_[u].silent || stopping_) && arrived)
      ready.push_back(u);
  }
  return ready;
}

// Synchronous modes need every unit but those finished with nothing left to merge (all finish
// on the same round; one that finished early must not hold the rest forever); decoupled needs
// K (fewer if fewer are still alive). Once the job is ending, whatever was published is
// merged: that is the final flush; but not at a signal's stop (set_stopping), where a merge
// still needs its quorum: K in decoupled, every unit in streaming (whose units stop where
// they are, not on a named round like diloco's).
int SyncerCore::quorum_needed(int p, int live, int done) const {
  if (stopping_ && !flush_) return plan_.every_merge_has_all ? M_ : plan_.quorum;
  if (stopping_ || done == M_) return 1;
  if (!plan_.every_merge_has_all) return std::min(plan_.quorum, std::max(live - waiting_elsewhere(p), 1));
  int finished = 0;
  for (int u = 0; u < M_; ++u) finished += unit_done(u) && !snapshot_pending(u, p);
  return M_ - finished;
}

// Decoupled with τ = 0: live units with no snapshot of p to give that wait (kWaitingFor) for
// the merge of another fragment q which cannot come yet: their snapshot of q is unmerged and
// Θ_q holds nothing newer than the version it started from. Without them in p's quorum, p
// merges, and the unit waiting for it goes on to send what they wait for. A unit whose merge
// of q is made (only not taken yet) is about to go on, and still counts.
int SyncerCore::waiting_elsewhere(int p) const {
  int n = 0;
  for (int u = 0; u < M_; ++u) {
    const int64_t waits = headers_[u].control(protocol::kWaitingFor);  // the unit's word: checked
    if (!unit_live(u) || waits <= 0 || waits > fragments_.size() || waits == p + 1 || slots_[u][p].fresh)
      continue;
    const int q = static_cast<int>(waits - 1);
    const Slot& s = slots_[u][q];
    n += s.fresh && version_[q] <= s.meta.base_version;
  }
  return n;
}

bool SyncerCore::merge_ready() {
  if (!plan_.outer_steps) {
    // ddp: unit 0 ships θ for evaluation; Θ simply becomes it.
    Slot& s = slots_[0][0];
    if (!s.fresh) return false;
    theta_[0] = s.data;
    s.fresh = false;
    ++version_[0];
    return true;
  }
  bool any = false;
  int live = 0, done = 0;
  for (int u = 0; u < M_; ++u) {
    live += unit_live(u);
    done += unit_done(u);
  }
  for (int p = 0; p < fragments_.size(); ++p) {
    drop_stale(p);
    const std::vector<int> ready = ready_units(p);
    const bool quorum = static_cast<int>(ready.size()) >= quorum_needed(p, live, done);
    if (!quorum && !warm_round_overdue(p, ready)) continue;
    Round& r = rounds_[p];
    if (r.quorum_at < 0) {
      r.quorum_at = now();
      if (quorum) grace_.observe_quorum(r.quorum_at - r.first_at);
    }
    // Everyone alive has reported: nobody left to wait for.
    const bool everyone = static_cast<int>(ready.size()) >= live || stopping_;
    // In the warm-up the units wait for this merge (τ = 0): no slack to wait for stragglers in.
    const double grace = !plan_.every_merge_has_all && !warm(p, ready) ? grace_.seconds() : 0.0;
    if (!everyone && now() < r.quorum_at + grace) continue;
    merge(p, ready);
    any = true;
  }
  return any;
}

void SyncerCore::merge(int p, const std::vector<int>& units) {
  const double start = now();
  const Round round = rounds_[p];
  std::vector<Contribution> contributions;
  std::vector<double> w(M_, 0.0);
  nlohmann::json staleness = nlohmann::json::array(), base_versions = nlohmann::json::array(),
                 steps = nlohmann::json::array(), tokens = nlohmann::json::array(),
                 at_steps = nlohmann::json::array();
  uint64_t bytes_in = 0;
  std::vector<double> weight;  // the merge's units in order, capped (merge.hpp: cap_weights)
  std::vector<int64_t> unit_steps;
  for (int u : units) {
    weight.push_back(token_weight(slots_[u][p].meta.c_tok, slots_[u][p].meta.c_steps));
    unit_steps.push_back(slots_[u][p].meta.c_steps);
  }
  nlohmann::json capped = nlohmann::json::array();
  for (size_t i : cap_weights(unit_steps, weight, config_.syncer.max_weight_ratio)) capped.push_back(units[i]);
  const nlohmann::json clipped = bound_outer_gradients(p, units);
  for (size_t i = 0; i < units.size(); ++i) {
    const int u = units[i];
    const Slot& s = slots_[u][p];
    w[u] = weight[i];
    contributions.push_back({s.data, w[u], history_.anchor_of(p, s)});
    bytes_in += s.wire_bytes;
    staleness.push_back(version_[p] - s.meta.base_version);
    base_versions.push_back(s.meta.base_version);
    steps.push_back(s.meta.c_steps);
    tokens.push_back(s.meta.c_tok);
    at_steps.push_back(s.meta.step);
  }
  const double share = config_.outer.share_steps ? merge_share(units) : 1.0;
  const bool warm_up = warm(p, units);
  bool undone = false;
  const bool merged = outer_step(p, units, contributions, share, warm_up, undone);
  for (int u : units) slots_[u][p].fresh = false;
  rounds_[p] = Round{};
  // Every weight zero: nothing learned. Decoupled sends nothing; the synchronous modes' units
  // wait for the round's merge, which goes out as a new version of the same Θ.
  if (!merged && !plan_.every_merge_has_all) return;
  ++version_[p];
  for (int u : units) {
    numbering_.merged[u][p] = numbering_.base[u][p] + slots_[u][p].seq;
    slots_[u][p].owed = true;
  }
  if (hooks_.on_merge) hooks_.on_merge(p, units);
  if (history_.keeps()) {
    history_.add(p, version_[p], theta_[p]);
    prune_history(p);
  }
  pace_.downtime.update(now(), nominal_period());
  const uint64_t bytes_out_before = links_.down_bytes();
  deliver_pending();
  for (int u = 0; u < M_; ++u)
    if (!unit_done(u)) window_.set_global_version(u, total_merges());
  const double sync_s = now() - start;
  grace_.observe_sync(sync_s);
  hooks_.log({{"event", "merge"},
              {"fragment", p},
              {"version", version_[p]},
              {"global_version", total_merges()},
              {"units", units},
              {"weights", w},
              {"weights_capped", capped},
              {"outer_grads_clipped", clipped},
              {"undone", undone},
              {"staleness", staleness},
              {"share", share},
              {"warm", warm_up},
              {"period_s", nominal_period()},
              {"base_versions", base_versions},
              {"inner_steps", steps},
              {"inner_tokens", tokens},
              {"at_steps", at_steps},
              {"quorum_wait_s", round.quorum_at - round.first_at},
              {"grace_wait_s", start - round.quorum_at},
              {"grace_window_s", plan_.every_merge_has_all ? 0.0 : grace_.seconds()},
              {"merge_s", sync_s},
              {"bytes_in", bytes_in},
              {"bytes_out", links_.down_bytes() - bytes_out_before},  // sent now (lands later over a WAN)
              {"tokens", tokens_total()},
              {"elapsed_s", now()}});
}

// syncer.max_outer_grad_ratio (merge.hpp, OuterGradientBound): each unit's snapshot of fragment
// p is scaled towards its anchor where its outer gradient is too large for the steps it could
// have taken, relative to the others'. Returns the units scaled.
nlohmann::json SyncerCore::bound_outer_gradients(int p, const std::vector<int>& units) {
  std::vector<OuterGradientBound::Sized> sized;
  std::vector<int> weighed;  // a contribution of weight 0 (a stand-in) moves nothing: not sized
  std::vector<std::span<const float>> anchors;
  for (int u : units) {
    const Slot& s = slots_[u][p];
    if (token_weight(s.meta.c_tok, s.meta.c_steps) <= 0) continue;
    const std::span<const float> a = history_.anchor_of(p, s);
    weighed.push_back(u);
    anchors.push_back(a.empty() ? std::span<const float>(theta_[p]) : a);
    sized.push_back({u, outer_gradient_norm(s.data, anchors.back()), s.meta.c_steps});
  }
  const bool warm_up = warm(p, units);
  const std::vector<double> scale = bound_.clip(p, warm_up, warm_up ? 1 : plan_.h, sized);
  nlohmann::json clipped = nlohmann::json::array();
  for (size_t i = 0; i < weighed.size(); ++i) {
    if (scale[i] >= 1.0) continue;
    Slot& s = slots_[weighed[i]][p];
    const std::span<const float> anchor = anchors[i];
    for (size_t k = 0; k < s.data.size(); ++k)  // θ ← A − scale·(A − θ)
      s.data[k] = static_cast<float>(anchor[k] - scale[i] * (static_cast<double>(anchor[k]) - s.data[k]));
    clipped.push_back(weighed[i]);
  }
  return clipped;
}

// The outer step of fragment p, undone when Θ_p or its momentum would not be finite after it:
// snapshots of finite values far outside any step (3e38) pass check_snapshot, and their outer
// gradient can overflow (the momentum alone, too, and it would then poison every later step).
// Θ_p and its momentum are then as before, and one merge_undone line names the units; the
// merge still goes out as a new version of the same Θ_p, so that units that wait for a merge
// (every synchronous mode, the warm-up) go on from it. False when nothing was merged.
bool SyncerCore::outer_step(int p, const std::vector<int>& units, const std::vector<Contribution>& contributions,
                            double share, bool warm_up, bool& undone) {
  undo_theta_.assign(theta_[p].begin(), theta_[p].end());
  const std::span<float> m = outer_.momentum(p);
  undo_momentum_.assign(m.begin(), m.end());
  undone = false;
  if (!outer_.step(p, theta_[p], contributions, share, warm_up)) return false;
  const auto finite = [](float x) { return std::isfinite(x); };
  if (std::all_of(theta_[p].begin(), theta_[p].end(), finite) && std::all_of(m.begin(), m.end(), finite)) return true;
  std::copy(undo_theta_.begin(), undo_theta_.end(), theta_[p].begin());
  std::copy(undo_momentum_.begin(), undo_momentum_.end(), m.begin());
  undone = true;
  hooks_.log({{"event", "merge_undone"}, {"fragment", p}, {"units", units},
              {"reason", "the outer step made Θ or its momentum non-finite (snapshots far outside any step)"},
              {"tokens", tokens_total()}, {"elapsed_s", now()}});
  return true;
}

// decoupled, warm-up: every unit waits for a merge newer than the one it applied, and a unit
// left out of one (its snapshot came after K others') waits for the next, which merges its
// snapshot with K − 1 of the next step. Units each left out of a different fragment's merge
// can then wait for one another for good (with P > 1): a warm-up round whose oldest snapshot
// has waited a heartbeat timeout merges what it has, as if the units missing were gone. (The
// patience is that long so that it never splits a round that is only slow: a round trip over
// a WAN link, a loaded host, a unit restarted into the warm-up alone.) Three other ways were
// run at the full budget (one run each) and were worse: sending the unit left out the others'
// merge at once and merging its snapshot later let the units drift apart and their stale
// outer gradients pull Θ back (2.2543, still on the loss plateau); merging its snapshot at
// once, alone, 1.2794 (2.2382 with outer.anchor: base); dropping it, 1.2726; against 1.2337
// this way.
bool SyncerCore::warm_round_overdue(int p, const std::vector<int>& ready) const {
  if (plan_.every_merge_has_all || fragments_.size() == 1 || ready.empty() || !warm(p, ready))
    return false;
  double oldest = now();
  for (int u : ready) oldest = std::min(oldest, slots_[u][p].arrives_at);
  return now() - oldest > config_.syncer.heartbeat_timeout_s;
}

// A warm-up merge (post-local SGD): snapshots of warm-up steps only.
bool SyncerCore::warm(int p, const std::vector<int>& units) const {
  return std::all_of(units.begin(), units.end(),
                     [&](int u) { return fragments_.warm(slots_[u][p].meta.step); });
}

// The merged units' share of the tokens per step of every live unit (and of the merged ones,
// which may have just finished): a merge of k of M equal units is k/M of a round; a crashed or
// silent unit is not part of the round.
double SyncerCore::merge_share(const std::vector<int>& units) const {
  double merged = 0, all = 0;
  for (int u = 0; u < M_; ++u) {
    const bool in = std::find(units.begin(), units.end(), u) != units.end();
    if (in) merged += static_cast<double>(tokens_per_step(u));
    if (in || unit_live(u)) all += static_cast<double>(tokens_per_step(u));
  }
  return all > 0 ? std::min(1.0, merged / all) : 1.0;
}

// A unit's next snapshot is measured from the version it applies next, never an older one than
// its last snapshot's base; a unit that finished still counts while its last snapshot waits,
// and a silent one keeps its base (it may only be slow). A crashed unit releases its old base
// when it rejoins: the serve moves its base to the versions served.
void SyncerCore::prune_history(int p) {
  int64_t oldest = version_[p];
  for (int u = 0; u < M_; ++u) {
    const Slot& s = slots_[u][p];
    if (!unit_done(u) || s.fresh) oldest = std::min(oldest, s.meta.base_version);
  }
  history_.forget_before(p, oldest);
}

// ---------------------------------------------------------------------------------------------
// Delivering merged fragments.

// Θ_p goes to unit u now; over an emulated link it lands later (the next waits for it).
void SyncerCore::deliver(int u, int p) {
  Slot& s = slots_[u][p];
  s.lands_at = links_.merged(u, window_.delivery_bytes(u, p), theta_[p].size() * sizeof(float), now());
  s.outgoing = theta_[p];
  s.outgoing_version = version_[p];
  send(u, p);
}

// Starts the delivery of Θ_p on its way to unit u once it has landed (over an emulated link)
// and u's lane is free. False when it did not start (not landed, lane busy, unreachable now:
// the next poll tries again).
bool SyncerCore::send(int u, int p) {
  Slot& s = slots_[u][p];
  if (s.outgoing_version == 0 || now() < s.lands_at) return false;
  if (!window_.start_deliver(u, p, s.outgoing_version, s.outgoing)) return false;
  unit_[u].in_flight = InFlight{p, 0, {}, s.outgoing_version, false};
  if (const std::optional<size_t> bytes = window_.end_deliver(u)) end_delivery(u, *bytes);
  return true;
}

// The delivery (not a rejoin's) on unit u's lane is over: `bytes` written, or 0 when the unit
// could not be reached (its Θ_p stays on its way, sent again at a later poll).
void SyncerCore::end_delivery(int u, size_t bytes) {
  const InFlight& d = unit_[u].in_flight;
  Slot& s = slots_[u][d.p];
  if (bytes == 0) return;
  s.delivered = d.version;
  s.may_hold = std::max(s.may_hold, d.version);
  if (s.outgoing_version == d.version) s.outgoing_version = 0;
}

bool SyncerCore::deliver_pending() {
  if (!plan_.outer_steps) return false;
  bool any = false;
  for (int u = 0; u < M_; ++u) {
    // A delivery on its way ends whatever the unit's liveness (its lane is busy until then).
    if (window_.lane(u) == protocol::SyncerWindow::Lane::deliver && !unit_[u].in_flight.serve) {
      const std::optional<size_t> bytes = window_.end_deliver(u);
      if (!bytes) continue;
      end_delivery(u, *bytes);
      any = true;
    }
    if (!unit_live(u)) continue;
    for (int p = 0; p < fragments_.size(); ++p) {
      if (window_.lane(u) != protocol::SyncerWindow::Lane::idle) break;
      Slot& s = slots_[u][p];
      // Θ_p as it was when sent lands on arrival over the unit's down link (an unlimited link,
      // unless wan.* limits it or a chaos degradation slows it); the next waits for it.
      if (s.outgoing_version > 0) {
        any |= send(u, p);
        continue;
      }
      // Owed a merge, and (flow control) the unit took what we delivered before.
      if (!s.owed || s.delivered >= version_[p] || headers_[u].header(p, protocol::kInAck) != s.delivered) continue;
      s.owed = false;
      any = true;
      deliver(u, p);
    }
  }
  return any;
}

void SyncerCore::publish_progress(int64_t tokens) {
  if (!plan_.lr_on_job_clock) return;
  if (tokens - job_clock_.sent < job_clock_.step) return;
  for (int u = 0; u < M_; ++u)
    if (!unit_done(u)) window_.set_job_tokens(u, tokens);
  job_clock_.sent = tokens;
}

// ---------------------------------------------------------------------------------------------
// Resuming.

void SyncerCore::restore(const checkpoint::SyncerState& c, const std::vector<std::vector<int64_t>>& unit_last_seq,
                         const std::vector<std::vector<std::vector<float>>>& refs) {
  const int P = fragments_.size();
  for (int p = 0; p < P; ++p) {
    fragments_.pack(p, c.theta, theta_[p]);
    fragments_.pack(p, c.momentum, outer_.momentum(p));
    version_[p] = lineage_.fork[p] = c.versions[p];
    history_.reset(p, version_[p], theta_[p]);
    for (int u = 0; u < M_; ++u) {
      // Wire-format references: the unit's own from its file when at the checkpoint's version
      // (the unit applies the same rule, checkpoint::has_reference), else the checkpoint's Θ.
      const bool own = static_cast<size_t>(u) < refs.size() && static_cast<size_t>(p) < refs[u].size() &&
                       !refs[u][p].empty();
      window_.set_reference(u, p, version_[p], own ? std::span<const float>(refs[u][p]) : theta_[p]);
      // The units resume holding Θ_p at this version (they read it from the checkpoint).
      slots_[u][p].delivered = slots_[u][p].may_hold = version_[p];
      slots_[u][p].meta.base_version = version_[p];
    }
  }
  grace_.restore(c.grace);
  // Snapshot numbers go on across jobs: the new job's window counts from 1 again, after a base
  // above every number used before, the larger of the unit's last and the last merged (the
  // learner computes the same). A unit file linked from an earlier job then still compares
  // with merged_seq_ in one numbering.
  for (int u = 0; u < M_; ++u)
    for (int p = 0; p < P; ++p) {
      numbering_.merged[u][p] = c.merged_seq[static_cast<size_t>(u) * P + p];
      numbering_.base[u][p] = std::max(unit_last_seq[u][p], numbering_.merged[u][p]);
    }
}

void SyncerCore::adopt(int p, int64_t version, std::span<const float> values) {
  if (values.size() != theta_[p].size())
    fail("recovery: fragment {} has {} values, a copy of it {}", p, theta_[p].size(), values.size());
  if (version <= version_[p]) fail("recovery: fragment {}: version {} is not newer than {}", p, version, version_[p]);
  theta_[p].assign(values.begin(), values.end());
  version_[p] = lineage_.fork[p] = version;
  rounds_[p] = Round{};
  history_.reset(p, version, theta_[p]);
  for (int u = 0; u < M_; ++u) {
    Slot& s = slots_[u][p];
    s.delivered = std::min(s.delivered, version);
    s.may_hold = std::max(s.may_hold, version);  // the dead syncer's versions: any unit may hold one
    if (!s.fresh) s.meta.base_version = std::min(s.meta.base_version, version);
  }
}

void SyncerCore::offer_taken(int u, const std::vector<int64_t>& versions) {
  for (int p = 0; p < fragments_.size(); ++p) {
    Slot& s = slots_[u][p];
    s.delivered = versions[p];
    s.may_hold = std::max(s.may_hold, versions[p]);  // a version of this syncer's history
    s.owed = versions[p] < version_[p];
    if (!s.fresh) s.meta.base_version = std::min(versions[p], version_[p]);
  }
}

void SyncerCore::recovered_numbering(int u, int p, int64_t seq_base) {
  numbering_.base[u][p] = seq_base;
  numbering_.merged[u][p] = std::max(numbering_.merged[u][p], seq_base + headers_[u].header(p, protocol::kOutAck));
}

}  // namespace ddiloco::syncer
