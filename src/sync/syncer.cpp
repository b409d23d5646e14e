// The syncer rank: holds Θ and the outer optimizer, collects snapshots from the units'
// windows, merges each fragment once a quorum has reported (plus the grace window), delivers
// the result, and evaluates Θ (paper_notes.md, "Syncer, for each fragment round").
#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <cmath>
#include <numeric>
#include <thread>

#include <omp.h>

#include "ddiloco/chaos.hpp"
#include "ddiloco/checkpoint.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/fragments.hpp"
#include "ddiloco/goodput.hpp"
#include "ddiloco/grace.hpp"
#include "ddiloco/membership.hpp"
#include "ddiloco/merge.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/model_io.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/run_dir.hpp"
#include "ddiloco/signals.hpp"
#include "ddiloco/runtime.hpp"
#include "ddiloco/sync_window.hpp"
#include "ddiloco/trainer.hpp"
#include "ddiloco/wan.hpp"
#include "sync/global_eval.hpp"

namespace ddiloco {

namespace {

using Clock = std::chrono::steady_clock;

// What the syncer holds for one unit and fragment.
struct Slot {
  int64_t acked = 0;                  // last sequence number consumed
  bool fresh = false;                 // a snapshot waits to be merged
  sync::SnapshotMeta meta;            // ... its counters
  int64_t seq = 0;                    // ... its sequence number
  std::vector<float> data;            // ... its values
  int64_t delivered = 0;              // last version written to the unit's inbox
  // The unit is owed a merged fragment: one that merged its snapshot (or the current one after
  // its snapshot was refused). Merges between carry nothing of its own and would only be
  // superseded in its inbox: they are not sent, which keeps the down link to one fragment per
  // snapshot.
  bool owed = false;
  double arrives_at = 0;              // the snapshot counts from then on (its link's arrival)
  size_t wire_bytes = 0;              // ... bytes it took on the wire
  // The unit's link (wan.hpp): a snapshot read is acknowledged, freeing the unit's outbox, only
  // once its last byte has left the unit; a merged fragment lands in the inbox on arrival.
  int64_t unacked = 0;                // read, on its way: acknowledged at ack_at
  double ack_at = 0;
  std::vector<float> outgoing;        // Θ_p on its way down ...
  int64_t outgoing_version = 0;       // ... at this version (0: none)
  double lands_at = 0;                // ... written into the inbox then
};

struct Round {
  double first_at = -1;   // when the round's first fresh snapshot arrived (s since start)
  double quorum_at = -1;  // when the quorum was reached
};

class Syncer {
 public:
  Syncer(const Config& config, const OuterPlan& plan, const Topology& topo,
         const ValidationSet& val, const checkpoint::SyncerState* resumed,
         const std::filesystem::path& resumed_dir, const SyncerLink& link)
      : config_(config),
        plan_(plan),
        M_(topo.units),
        model_(config.model),
        fragments_(model_.layout(), plan.fragments, plan.h),
        layout_(fragments_, plan.outer_steps ? wire::parse_format(config.wan.format) : wire::Format::fp32,
                static_cast<size_t>(config.wan.block)),
        outer_(fragments_, config.outer.lr, config.outer.momentum,
               parse_merge_rule(config.outer.merge)),
        grace_(config.syncer.grace_gamma, config.syncer.grace_cap_steps, plan.overlap),
        val_(val),
        remote_(*link.remote),
        door_(link.listener),
        window_(remote_, layout_),
        topo_(topo) {
    // Θ₀ is the units' common initialisation (same seed).
    model_.init_weights(static_cast<uint64_t>(config.run.seed));
    const int P = fragments_.size();
    theta_.resize(P);
    for (int p = 0; p < P; ++p) {
      theta_[p].resize(layout_.numel(p));
      fragments_.pack(p, model_.parameters(), theta_[p]);
    }
    slots_.assign(M_, std::vector<Slot>(P));
    for (auto& unit : slots_)
      for (int p = 0; p < P; ++p) unit[p].data.resize(layout_.numel(p));
    incoming_.resize(P);
    for (int p = 0; p < P; ++p) incoming_[p].resize(layout_.numel(p));
    version_.assign(P, 0);
    rounds_.assign(P, Round{});
    if (anchor_base_) {
      history_.resize(P);
      for (int p = 0; p < P; ++p) history_[p].emplace(0, theta_[p]);
    }
    headers_.resize(M_);
    for (auto& h : headers_) h.words.assign(layout_.header_block_bytes() / sizeof(int64_t), 0);
    heartbeat_.assign(M_, -1);
    tokens_before_.assign(M_, 0);
    steps_before_.assign(M_, 0);
    if (door_) members_ = std::make_unique<sync::Membership>(config, link.run_id, link.secret, layout_.bytes());
    heard_at_.assign(M_, 0.0);
    silent_.assign(M_, false);
    rejoin_served_.assign(M_, 0);
    reads_started_.assign(M_, 0);
    schedule_ = chaos::Schedule::from_config(config.chaos, M_);
    for (int u = 0; u < M_; ++u) links_.emplace_back(schedule_, u);
    for (int u = 0; u < M_; ++u)
      wan_.emplace_back(wan::link_spec(config, u), static_cast<uint64_t>(config.run.seed) * 1000 + u);
    // The wire format's references (sync_window.hpp): Θ₀ (the units set the same).
    for (int u = 0; u < M_ && plan.outer_steps; ++u)
      for (int p = 0; p < P; ++p) window_.set_reference(u, p, 0, theta_[p]);
    budget_ = config.token_budget();
    for (int u = 0; u < M_; ++u) progress_step_ = std::min(progress_step_, tokens_per_step(u));
    merged_seq_.assign(M_, std::vector<int64_t>(P, 0));
    seq_base_.assign(M_, std::vector<int64_t>(P, 0));
    last_unit_file_.resize(M_);
    ckpt_root_ = config.checkpoint.directory(config.run.dir);
    if (resumed) {
      resumed_from_ = resumed_dir.string();
      resumed_tokens_ = resumed->tokens;
      restore(*resumed);
    }
    ckpt_next_ = std::max(resumed ? resumed->id : 0, checkpoint::highest_id(ckpt_root_)) + 1;
    ckpt_due_at_ = total_merges() + config.checkpoint.every;
  }

  int run();  // the stop signal that ended the job early, or 0

 private:
  int64_t tokens_per_step(int u) const { return config_.unit_tokens_per_step(u); }
  double now() const { return wall_.seconds(); }
  int64_t tokens_total() const {
    int64_t t = std::accumulate(tokens_before_.begin(), tokens_before_.end(), int64_t{0});
    for (const auto& h : headers_) t += h.control(sync::kTokensDone);
    return t;
  }
  int64_t total_merges() const { return std::accumulate(version_.begin(), version_.end(), int64_t{0}); }
  // Merges between two global evaluations: eval_every outer rounds of P merges; in ddp every
  // θ unit 0 ships (it ships at the evaluation cadence).
  int64_t eval_stride() const {
    return plan_.outer_steps ? static_cast<int64_t>(config_.syncer.eval_every) * fragments_.size()
                             : 1;
  }
  bool unit_done(int u) const { return headers_[u].control(sync::kState) == sync::kDone; }
  // Unit u has a snapshot of fragment p the syncer has not merged: read (or on its way), or
  // still unread in its outbox.
  bool snapshot_pending(int u, int p) const {
    const Slot& s = slots_[u][p];
    return s.fresh || headers_[u].header(p, sync::kOutSeq) > std::max(s.acked, s.unacked);
  }
  uint64_t down_link_bytes() const {
    uint64_t b = 0;
    for (const auto& l : wan_) b += l.down.bytes();
    return b;
  }
  // Alive and heard from within the heartbeat timeout: may be part of a quorum.
  bool unit_live(int u) const { return remote_.connected(u) && !unit_done(u) && !silent_[u]; }
  // The isolated deployment: units that connect, or whose process died.
  void admit_units();
  void unit_joined(int u, const sync::Hello& hello);
  void unit_lost(int u, const std::string& reason);
  // Finished, or (isolated, once the job is ending) absent: nothing more to wait for.
  bool unit_finished(int u) const { return unit_done(u) || (door_ && stopping_ && !remote_.connected(u)); }
  // Link degradation (chaos): a transfer of `bytes` to or from unit u takes this much longer
  // than on its nominal link of chaos.link_mbps. The syncer does not wait it out: the
  // snapshot counts, or the merged fragment lands, only once it is over.
  double link_delay_s(int u, size_t bytes) const {
    if (wan_on_) return 0.0;  // the emulated link carries the degradation (link_factor)
    const double factor = link_factor(u);
    if (factor >= 1.0) return 0.0;
    return static_cast<double>(bytes) * (1.0 / factor - 1.0) / (config_.chaos.link_mbps * 1e6);
  }
  double link_factor(int u) const { return links_[u].link_factor_at(resumed_elapsed_s_ + now()); }
  // The mode's nominal time between two updates of the global model: H/P inner steps (one
  // step in ddp, where every step updates it) at the units' median step time.
  // The nominal fragment period: a fragment is synchronised every H inner steps (ddp: every
  // step), at the units' median step time.
  double nominal_period() const { return (plan_.outer_steps ? plan_.h : 1.0) * median_step_s_; }

  bool collect();                  // reads new snapshots; true if any
  bool merge_ready_fragments();    // true if any merge happened
  bool deliver_pending();          // true if any delivery happened
  void merge(int p, const std::vector<int>& units);
  void maybe_evaluate();
  void log_eval_results();
  std::vector<float> flat_theta();
  void observe_step_times();
  void publish_progress(int64_t tokens);
  double merge_share(const std::vector<int>& units) const;
  void prune_history(int p);
  void watch_liveness();
  double silence_after_s(int u) const;
  void hear(int u, int64_t beat);  // alive now; back in the quorum if it was silent
  void serve_rejoins();
  // Checkpoints (checkpoint.hpp): ask the units for their files, then write ours last.
  bool checkpoints_on() const { return plan_.outer_steps && config_.checkpoint.enabled(); }
  void request_checkpoint();
  bool try_complete_checkpoint(bool final);
  void abandon_checkpoint(const std::string& why);
  void next_checkpoint();
  void restore(const checkpoint::SyncerState& state);

  const Config& config_;
  const OuterPlan plan_;
  const int M_;
  Gpt<float> model_;
  FragmentPlan fragments_;
  sync::WindowLayout layout_;
  OuterOptimizer outer_;
  GraceWindow grace_;
  const ValidationSet& val_;
  comm::RemoteMemory& remote_;
  // The isolated deployment: where units join and leave (null in the one-job deployment, where
  // every unit is present from the start to the end).
  comm::UnitListener* door_;
  std::unique_ptr<sync::Membership> members_;
  std::vector<int64_t> tokens_before_, steps_before_;  // per unit: its earlier processes' work
  sync::SyncerWindow window_;
  const Topology& topo_;

  std::vector<std::vector<float>> theta_;      // Θ, packed per fragment
  std::vector<std::vector<Slot>> slots_;       // [unit][fragment]
  std::vector<int64_t> version_;               // merges per fragment
  // outer.anchor: base — the Θ versions some unit may still measure its progress from
  // (from the oldest base version a live unit reported, to the current one).
  const bool anchor_base_ = config_.outer.anchor == "base";
  std::vector<std::map<int64_t, std::vector<float>>> history_;
  std::vector<Round> rounds_;
  std::vector<std::vector<float>> incoming_;   // per fragment: a snapshot being read
  std::vector<sync::UnitHeaders> headers_;     // last poll
  std::vector<int64_t> heartbeat_;             // last heartbeat seen per unit
  std::vector<double> heard_at_;               // ... when it last moved (s since start)
  std::vector<bool> silent_;                   // heartbeat older than the timeout
  std::vector<int64_t> rejoin_served_;
  std::vector<int64_t> reads_started_;         // debug.crash_during_read
  chaos::Schedule schedule_;
  std::vector<chaos::UnitTimeline> links_;     // per unit, for link degradations
  std::vector<wan::Link> wan_;                 // per unit: its emulated WAN link
  const bool wan_on_ = wan::emulated(config_);
  GlobalDowntime downtime_;
  int64_t ddp_steps_seen_ = 0;
  double median_step_s_ = 0;
  int64_t budget_ = 0;
  int64_t progress_sent_ = 0;  // job tokens last written to the units
  int64_t progress_step_ = INT64_MAX;  // ... refreshed after this many more: the smallest unit step
  int64_t next_eval_ = 0;
  bool stopping_ = false;
  int interrupted_by_ = 0;
  int64_t rejected_ = 0, superseded_ = 0;
  Stopwatch wall_;
  JsonlWriter log_;
  std::unique_ptr<GlobalEvaluator> evaluator_;
  std::vector<std::vector<int64_t>> merged_seq_;  // [unit][fragment]: last snapshot merged
  std::vector<std::vector<int64_t>> seq_base_;    // [unit][fragment]: added to window numbers
  std::filesystem::path ckpt_root_;
  int64_t ckpt_next_ = 1;       // id of the checkpoint being (or next to be) written
  bool ckpt_wanted_ = false;    // the units were asked for checkpoint ckpt_next_
  int64_t ckpts_written_ = 0;   // by this run
  std::vector<std::filesystem::path> last_unit_file_;  // per unit: its newest checkpoint file
  int64_t ckpt_due_at_ = 0;     // merges at which the next periodic checkpoint is asked for
  int64_t stop_after_version_ = 0;  // diloco, interrupted: the round every unit ends on
  double resumed_elapsed_s_ = 0;    // wall time of the runs this one resumes
  std::string resumed_from_;        // the checkpoint this run resumed from ("" = none)
  int64_t resumed_tokens_ = 0;
  int64_t resumed_next_eval_ = 0;
  ProgressBar bar_{config_.run.progress};
};

bool Syncer::collect() {
  bool any = false;
  for (int u = 0; u < M_; ++u) {
    if (!remote_.connected(u)) continue;
    for (int p = 0; p < fragments_.size(); ++p) {
      Slot& s = slots_[u][p];
      if (s.unacked > 0) {  // the last one is still leaving the unit over its link
        if (now() < s.ack_at) continue;
        window_.ack(u, p, s.unacked);
        s.acked = s.unacked;
        s.unacked = 0;
        any = true;
      }
      const int64_t seq = headers_[u].header(p, sync::kOutSeq);
      if (seq <= s.acked) continue;
      sync::SnapshotMeta meta{headers_[u].header(p, sync::kOutSteps),
                              headers_[u].header(p, sync::kOutTokens),
                              headers_[u].header(p, sync::kOutStep),
                              headers_[u].header(p, sync::kOutBaseVersion)};
      if (config_.debug.crash_during_read)  // test hook: tells the unit a read has begun
        window_.set_control(u, sync::kReadsStarted, ++reads_started_[u]);
      if (config_.debug.syncer_read_delay_ms > 0)  // test hook: a syncer slower than learners
        std::this_thread::sleep_for(std::chrono::milliseconds(config_.debug.syncer_read_delay_ms));
      // Read beside the slot: a refused snapshot leaves an earlier one that waits intact.
      std::vector<float>& incoming = incoming_[p];
      const sync::SyncerWindow::Fetched got = window_.fetch(u, p, headers_[u], incoming);
      if (!remote_.connected(u)) break;  // lost mid-read: abandoned, unit_lost follows
      const int64_t after = got.seq_after;
      any = true;
      std::string problem;
      if (after != seq)
        problem = fmt::format("torn: sequence {} became {} during the read", seq, after);
      else if (!got.problem.empty())
        problem = got.problem;
      else if (!std::all_of(incoming.begin(), incoming.end(), [](float x) { return std::isfinite(x); }))
        problem = "non-finite values";
      else if (meta.base_version < 0 || meta.base_version > version_[p])
        problem = fmt::format("base version {} outside 0..{}", meta.base_version, version_[p]);
      else if (anchor_base_ && !history_[p].contains(meta.base_version))
        problem = fmt::format("base version {} is no longer held (oldest {})", meta.base_version,
                              history_[p].begin()->first);
      if (!problem.empty()) {
        ++rejected_;
        log_.write({{"event", "snapshot_rejected"}, {"unit", u}, {"fragment", p}, {"seq", seq},
                    {"reason", problem}, {"elapsed_s", now()}, {"tokens", tokens_total()}});
        if (after != seq) continue;  // re-read the newer snapshot next poll
        window_.ack(u, p, seq);
        s.acked = seq;
        s.owed = true;  // a unit waiting for a merge gets the current one
        continue;
      }
      // The snapshot crosses the unit's up link (ddp's θ for evaluation is not WAN traffic):
      // it counts from its arrival, and the outbox stays busy (the unit skips publishing) until
      // its last byte has left. Without wan.* the link is unlimited and a chaos degradation
      // delays the arrival instead; a snapshot that supersedes one not merged yet then arrives
      // when that one would have (a unit that publishes faster than its degraded link carries
      // still gets merged). Over an emulated link it cannot outrun its own transfer.
      std::swap(s.data, incoming);
      s.wire_bytes = got.wire_bytes;
      if (s.fresh) ++superseded_;
      if (plan_.outer_steps) {
        const wan::Transfer t = wan_[u].up.transfer(got.wire_bytes, now(), now(), link_factor(u));
        const double arrival = t.arrive_s + link_delay_s(u, s.data.size() * sizeof(float));
        if (!s.fresh) s.arrives_at = arrival;
        else if (wan_on_) s.arrives_at = std::max(s.arrives_at, arrival);
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
  }
  return any;
}

// The isolated deployment's door: connections judged by the membership (the secret, the run,
// the unit's index, ranks, model shape, configuration and that no live process holds the
// index), and units whose process or link died.
void Syncer::admit_units() {
  for (const comm::UnitListener::Lost& l : door_->take_lost()) unit_lost(l.unit, l.reason);
  for (const comm::UnitListener::Pending& c : door_->accept_pending()) {
    std::string reason;
    sync::Hello hello;
    try {
      hello = sync::Hello::from_json(nlohmann::json::parse(c.payload), "handshake from " + c.peer);
      reason = members_->judge(hello);
      if (reason.empty() && c.bytes < layout_.bytes())
        reason = fmt::format("it exposes {} bytes, the window layout needs {}", c.bytes, layout_.bytes());
    } catch (const std::exception& e) {
      reason = e.what();
    }
    if (!reason.empty()) {
      door_->refuse(c.id, reason);
      log_.write({{"event", "unit_refused"}, {"peer", c.peer}, {"unit", hello.unit}, {"reason", reason},
                  {"tokens", tokens_total()}, {"elapsed_s", now()}});
      std::printf("syncer: refused a unit from %s: %s\n", c.peer.c_str(), reason.c_str());
      std::fflush(stdout);
      continue;
    }
    door_->admit(c.id, hello.unit);
    unit_joined(hello.unit, hello);
  }
}

// A new process of unit u: a fresh, zeroed window. What the syncer knew of the old one goes
// (its sequence numbers, references, rejoin count); its work stays counted. The unit asks for
// Θ at once (its first rejoin request), and is live from now on.
void Syncer::unit_joined(int u, const sync::Hello& hello) {
  members_->joined(hello, now());
  window_.reset_unit(u);
  for (int p = 0; p < fragments_.size(); ++p) {
    Slot& s = slots_[u][p];
    seq_base_[u][p] = std::max(seq_base_[u][p] + std::max(s.acked, s.seq), merged_seq_[u][p]);
    std::vector<float> keep = std::move(s.data);
    s = Slot{};
    s.data = std::move(keep);
  }
  // What its window says now: zeros for a new process; for a live one that reconnects to this
  // (restarted) syncer, the snapshots the previous syncer consumed stay consumed.
  window_.poll(headers_);
  for (int p = 0; p < fragments_.size(); ++p) slots_[u][p].acked = headers_[u].header(p, sync::kOutAck);
  heartbeat_[u] = -1;
  heard_at_[u] = now();
  silent_[u] = false;
  rejoin_served_[u] = 0;
  reads_started_[u] = 0;
  window_.set_control(u, sync::kCheckpointNext, ckpt_next_);
  if (ckpt_wanted_) window_.set_control(u, sync::kCheckpointWant, ckpt_next_);
  if (plan_.mode == Mode::decoupled) window_.set_job_tokens(u, progress_sent_);
  if (stopping_) window_.request_stop(u);
  log_.write({{"event", "unit_connected"}, {"unit", u}, {"restart", hello.restart}, {"host", hello.host},
              {"pid", hello.pid}, {"ranks", hello.ranks}, {"processes", hello.processes},
              {"tokens", tokens_total()}, {"elapsed_s", now()}});
  std::printf("syncer: unit %d connected (pid %lld on %s, restart %lld)\n", u,
              static_cast<long long>(hello.pid), hello.host.c_str(), static_cast<long long>(hello.restart));
  std::fflush(stdout);
}

// Unit u's process (or its link) died: weight 0 from now on. Snapshots of it that were read
// but not merged are dropped with it; reads from it in flight fail and are abandoned.
void Syncer::unit_lost(int u, const std::string& reason) {
  if (!members_->present(u)) return;  // already lost (the heartbeat, then the closed endpoint)
  const double last_seen = heard_at_[u];
  members_->lost(u, now(), reason);
  tokens_before_[u] += headers_[u].control(sync::kTokensDone);
  steps_before_[u] += headers_[u].control(sync::kStepsDone);
  std::fill(headers_[u].words.begin(), headers_[u].words.end(), 0);
  for (Slot& s : slots_[u]) {
    s.fresh = false;
    s.owed = false;
    s.outgoing_version = 0;
    s.unacked = 0;
  }
  log_.write({{"event", "unit_lost"}, {"unit", u}, {"reason", reason}, {"last_seen_s", last_seen},
              {"tokens", tokens_total()}, {"elapsed_s", now()}});
  std::printf("syncer: unit %d lost (%s); merging on without it\n", u, reason.c_str());
  std::fflush(stdout);
}

void Syncer::observe_step_times() {
  std::vector<double> steps;
  for (int u = 0; u < M_; ++u)
    if (unit_live(u) && headers_[u].control(sync::kStepTimeNs) > 0)
      steps.push_back(headers_[u].control(sync::kStepTimeNs) * 1e-9);
  if (steps.empty()) return;
  std::sort(steps.begin(), steps.end());
  median_step_s_ = steps[steps.size() / 2];
  grace_.observe_steps(steps.back(), median_step_s_);
}

// A heartbeat moves once per inner step: a unit whose steps are slow (a straggler, a large
// model, the first step) is not silent before three of its steps have passed.
double Syncer::silence_after_s(int u) const {
  const double step_s = static_cast<double>(headers_[u].control(sync::kStepTimeNs)) * 1e-9;
  return std::max(config_.syncer.heartbeat_timeout_s, 3 * step_s);
}

void Syncer::hear(int u, int64_t beat) {
  heartbeat_[u] = beat;
  heard_at_[u] = now();
  if (!silent_[u]) return;
  silent_[u] = false;
  log_.write({{"event", "unit_back"}, {"unit", u}, {"tokens", tokens_total()}, {"elapsed_s", now()}});
}

void Syncer::watch_liveness() {
  // ddp has no quorum to leave a unit out of, and its healthy units sit in the all-reduce
  // without a heartbeat while a crashed one is down: nothing to watch.
  if (!plan_.outer_steps) return;
  for (int u = 0; u < M_; ++u) {
    if (unit_done(u) || !remote_.connected(u)) continue;
    const int64_t beat = headers_[u].control(sync::kHeartbeat);
    if (beat != heartbeat_[u]) {
      hear(u, beat);
    } else if (!silent_[u] && now() - heard_at_[u] > silence_after_s(u)) {
      // Weight 0 and out of every quorum until it beats again (unit_back). Isolated, this is
      // one of the two ways to lose a unit (the other: its endpoint fails); its connection
      // stays, so that a slow process (a first step under load) is not made to start over.
      silent_[u] = true;
      log_.write({{"event", door_ ? "unit_lost" : "unit_silent"}, {"unit", u}, {"last_heard_s", heard_at_[u]},
                  {"last_seen_s", heard_at_[u]},
                  {"reason", fmt::format("heartbeat: silent for {:.1f} s", now() - heard_at_[u])},
                  {"tokens", tokens_total()}, {"elapsed_s", now()}});
    }
  }
}

// A unit back from a crash asks for Θ: every fragment goes into its inbox at the current
// version, whatever it held (it discarded its state and reads nothing until served; its
// acknowledgements read −1 until it has taken these, so no delivery overwrites them). A unit
// that asks is alive: it is heard now, and its next outer gradients are measured from the
// versions served, which the syncer keeps (outer.anchor: base).
void Syncer::serve_rejoins() {
  if (!plan_.outer_steps) return;
  for (int u = 0; u < M_; ++u) {
    const int64_t request = headers_[u].control(sync::kRejoinRequest);
    if (request <= rejoin_served_[u] || unit_done(u) || !remote_.connected(u)) continue;
    hear(u, headers_[u].control(sync::kHeartbeat));  // a unit that asks is alive
    // Synchronous modes count rounds: a snapshot the unit sent before it crashed and that
    // waits to be merged completes its round first (the request makes the unit heard, so the
    // round merges now); the rejoin then serves that round's Θ. Served before, the unit would
    // count the pending round as its next and stay one round behind.
    bool pending_round = false;
    for (int p = 0; p < fragments_.size(); ++p) pending_round |= slots_[u][p].fresh;
    if (pending_round && plan_.mode != Mode::decoupled) continue;
    const double start = now();
    const uint64_t before = window_.bytes_written();
    for (int p = 0; p < fragments_.size(); ++p) {
      // Raw fp32: the unit lost its reference. (Served at once: the unit waits for it; its
      // bytes are counted on its link.)
      wan_[u].down.transfer(window_.deliver(u, p, version_[p], theta_[p], /*raw=*/true), now());
      Slot& s = slots_[u][p];
      s.outgoing_version = 0;  // a delivery on its way is superseded
      s.delivered = version_[p];
      if (!s.fresh) s.meta.base_version = version_[p];
    }
    window_.set_control(u, sync::kRejoinServed, request);
    rejoin_served_[u] = request;
    log_.write({{"event", "rejoin"}, {"unit", u}, {"request", request}, {"versions", version_},
                {"bytes_out", window_.bytes_written() - before}, {"serve_s", now() - start},
                {"tokens", tokens_total()}, {"elapsed_s", now()}});
  }
}

// Decoupled: every unit's learning-rate schedule follows the job's progress (tokens of all
// units), refreshed whenever the job has moved by the smallest unit's step.
void Syncer::publish_progress(int64_t tokens) {
  if (plan_.mode != Mode::decoupled) return;
  if (tokens - progress_sent_ < progress_step_) return;
  for (int u = 0; u < M_; ++u)
    if (!unit_done(u)) window_.set_job_tokens(u, tokens);
  progress_sent_ = tokens;
}

bool Syncer::merge_ready_fragments() {
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
    // A silent unit is out of every quorum until it reports again; its last snapshot waits.
    // The final flush takes what has arrived: over an emulated WAN, a snapshot still on its
    // way when the job ends never reaches the syncer (without one, a degraded link's delay
    // is waived then).
    std::vector<int> fresh;
    for (int u = 0; u < M_; ++u)
      if (slots_[u][p].fresh && (!silent_[u] || stopping_) &&
          (slots_[u][p].arrives_at <= now() || (stopping_ && !wan_on_)))
        fresh.push_back(u);
    // Synchronous modes need every unit but those finished with nothing left to merge (all
    // finish on the same round; one that finished early must not hold the rest forever);
    // decoupled needs K (fewer if fewer are still alive). Once the job is ending, whatever
    // was published is merged: that is the final flush.
    int finished = 0;
    for (int u = 0; u < M_; ++u) finished += unit_done(u) && !snapshot_pending(u, p);
    int needed = plan_.mode == Mode::decoupled ? std::min(plan_.quorum, std::max(live, 1)) : M_ - finished;
    if (stopping_ || done == M_) needed = 1;
    if (static_cast<int>(fresh.size()) < needed) continue;
    Round& r = rounds_[p];
    if (r.quorum_at < 0) {
      r.quorum_at = now();
      grace_.observe_quorum(r.quorum_at - r.first_at);
    }
    const bool everyone = static_cast<int>(fresh.size()) >= live || stopping_;
    const double grace = plan_.mode == Mode::decoupled ? grace_.seconds() : 0.0;
    if (!everyone && now() < r.quorum_at + grace) continue;
    merge(p, fresh);
    any = true;
  }
  return any;
}

void Syncer::merge(int p, const std::vector<int>& units) {
  const double start = now();
  const Round round = rounds_[p];
  std::vector<Contribution> contributions;
  nlohmann::json weights = nlohmann::json::array(), staleness = nlohmann::json::array();
  std::vector<double> w(M_, 0.0);
  uint64_t bytes_in = 0;
  for (int u : units) {
    const Slot& s = slots_[u][p];
    w[u] = token_weight(s.meta.c_tok, s.meta.c_steps);
    contributions.push_back({s.data, w[u],
                             anchor_base_ ? std::span<const float>(history_[p].at(s.meta.base_version))
                                          : std::span<const float>()});
    bytes_in += s.wire_bytes;
  }
  for (int u = 0; u < M_; ++u) weights.push_back(w[u]);
  nlohmann::json base_versions = nlohmann::json::array(), steps = nlohmann::json::array(),
                 tokens = nlohmann::json::array(), at_steps = nlohmann::json::array();
  for (int u : units) {
    const Slot& s = slots_[u][p];
    staleness.push_back(version_[p] - s.meta.base_version);
    base_versions.push_back(s.meta.base_version);
    steps.push_back(s.meta.c_steps);
    tokens.push_back(s.meta.c_tok);
    at_steps.push_back(s.meta.step);
  }
  const double share = config_.outer.share_steps ? merge_share(units) : 1.0;
  const bool merged = outer_.step(p, theta_[p], contributions, share);
  for (int u : units) slots_[u][p].fresh = false;
  rounds_[p] = Round{};
  if (!merged) return;  // every weight zero: nothing learned, nothing to send
  ++version_[p];
  for (int u : units) {
    merged_seq_[u][p] = seq_base_[u][p] + slots_[u][p].seq;
    slots_[u][p].owed = true;
    if (!members_) continue;
    if (const auto heal = members_->merged(u, now()))
      log_.write({{"event", "unit_joined"}, {"unit", u}, {"restart", members_->restarts(u)},
                  {"heal_s", *heal}, {"fragment", p}, {"version", version_[p]},
                  {"tokens", tokens_total()}, {"elapsed_s", now()}});
  }
  // Asked for before this merge is delivered: a diloco unit then writes its file on the round
  // boundary where it applies this merge.
  if (config_.checkpoint.every > 0 && total_merges() >= ckpt_due_at_ && !ckpt_wanted_ && !stopping_)
    request_checkpoint();
  if (anchor_base_) {
    history_[p].emplace(version_[p], theta_[p]);
    prune_history(p);
  }
  downtime_.update(now(), nominal_period());
  const uint64_t bytes_out_before = down_link_bytes();
  deliver_pending();
  for (int u = 0; u < M_; ++u)
    if (!unit_done(u)) window_.set_global_version(u, total_merges());
  const double sync_s = now() - start;
  grace_.observe_sync(sync_s);
  log_.write({{"event", "merge"},
              {"fragment", p},
              {"version", version_[p]},
              {"global_version", total_merges()},
              {"units", units},
              {"weights", weights},
              {"staleness", staleness},
              {"share", share},
              {"period_s", nominal_period()},
              {"base_versions", base_versions},
              {"inner_steps", steps},
              {"inner_tokens", tokens},
              {"at_steps", at_steps},
              {"quorum_wait_s", round.quorum_at - round.first_at},
              {"grace_wait_s", start - round.quorum_at},
              {"grace_window_s", plan_.mode == Mode::decoupled ? grace_.seconds() : 0.0},
              {"merge_s", sync_s},
              {"bytes_in", bytes_in},
              {"bytes_out", down_link_bytes() - bytes_out_before},  // sent now (lands later over a WAN)
              {"tokens", tokens_total()},
              {"elapsed_s", now()}});
}

// The merged units' share of the tokens per step of every live unit (and of the merged ones,
// which may have just finished): a merge of k of M equal units is k/M of a round; a crashed or
// silent unit is not part of the round.
double Syncer::merge_share(const std::vector<int>& units) const {
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
void Syncer::prune_history(int p) {
  int64_t oldest = version_[p];
  for (int u = 0; u < M_; ++u) {
    const Slot& s = slots_[u][p];
    if (!unit_done(u) || s.fresh) oldest = std::min(oldest, s.meta.base_version);
  }
  auto& h = history_[p];
  h.erase(h.begin(), h.lower_bound(oldest));
}

bool Syncer::deliver_pending() {
  bool any = false;
  for (int u = 0; u < M_; ++u) {
    if (!unit_live(u) || !plan_.outer_steps) continue;
    for (int p = 0; p < fragments_.size(); ++p) {
      Slot& s = slots_[u][p];
      // Θ_p as it was when sent lands on arrival over the unit's down link (an unlimited link,
      // unless wan.* limits it or a chaos degradation slows it); the next waits for it.
      if (s.outgoing_version > 0) {
        if (now() < s.lands_at) continue;
        window_.deliver(u, p, s.outgoing_version, s.outgoing);
        s.delivered = s.outgoing_version;
        s.outgoing_version = 0;
        any = true;
      }
      // Owed a merge, and (flow control) the unit took what we delivered before.
      if (!s.owed || s.delivered >= version_[p] || headers_[u].header(p, sync::kInAck) != s.delivered) continue;
      s.owed = false;
      any = true;
      const double lands = wan_[u].down.transfer(window_.delivery_bytes(u, p), now(), now(), link_factor(u)).arrive_s +
                           link_delay_s(u, theta_[p].size() * sizeof(float));
      if (lands <= now()) {
        window_.deliver(u, p, version_[p], theta_[p]);
        s.delivered = version_[p];
      } else {
        s.outgoing = theta_[p];
        s.outgoing_version = version_[p];
        s.lands_at = lands;
      }
    }
  }
  return any;
}

void Syncer::restore(const checkpoint::SyncerState& c) {
  const int P = fragments_.size();
  for (int p = 0; p < P; ++p) {
    fragments_.pack(p, c.theta, theta_[p]);
    fragments_.pack(p, c.momentum, outer_.momentum(p));
    version_[p] = c.versions[p];
    if (anchor_base_) history_[p] = {{version_[p], theta_[p]}};
    for (int u = 0; u < M_; ++u) window_.set_reference(u, p, version_[p], theta_[p]);  // (below)
    // The units resume holding Θ_p at this version (they read it from the checkpoint).
    for (int u = 0; u < M_; ++u) {
      slots_[u][p].delivered = version_[p];
      slots_[u][p].meta.base_version = version_[p];
    }
  }
  grace_.restore(c.grace);
  // Wire-format references: a unit's own from its file when at the checkpoint's version (the
  // unit applies the same rule, checkpoint::has_reference).
  if (plan_.outer_steps && config_.wan.format != "fp32")
    for (int u = 0; u < M_; ++u) {
      const checkpoint::UnitState unit = checkpoint::read_unit(checkpoint::unit_file(resumed_from_, u), P);
      for (int p = 0; p < P; ++p)
        if (checkpoint::has_reference(unit, p, version_[p])) window_.set_reference(u, p, version_[p], unit.wire_ref[p]);
    }
  // Snapshot numbers go on across jobs: the new job's window counts from 1 again, after a base
  // above every number used before, the larger of the unit's last and the last merged (the
  // learner computes the same). A unit file linked from an earlier job then still compares
  // with merged_seq_ in one numbering.
  for (int u = 0; u < M_; ++u) {
    last_unit_file_[u] = checkpoint::unit_file(resumed_from_, u);
    const std::vector<int64_t> last = checkpoint::unit_last_seq(last_unit_file_[u], P);
    for (int p = 0; p < P; ++p) {
      merged_seq_[u][p] = c.merged_seq[static_cast<size_t>(u) * P + p];
      seq_base_[u][p] = std::max(last[p], merged_seq_[u][p]);
    }
  }
  resumed_elapsed_s_ = c.elapsed_s;
  resumed_next_eval_ = c.next_eval;
}

// Every unit writes its file at its next step boundary (diloco: round boundary) and says so
// in kCheckpointDone; merging and delivering go on meanwhile.
void Syncer::request_checkpoint() {
  ckpt_wanted_ = true;
  for (int u = 0; u < M_; ++u)
    if (!unit_done(u)) window_.set_control(u, sync::kCheckpointWant, ckpt_next_);
}

// Once every unit has written its file of checkpoint ckpt_next_, the syncer writes its own —
// its state is then newer than every unit's, which is what resuming assumes (learner.cpp,
// "resume") — and the manifest last. A unit that finished earlier and wrote an older
// checkpoint has not changed since: its file is linked in. `final`: the job is over and every
// unit has stopped.
bool Syncer::try_complete_checkpoint(bool final) {
  if (!checkpoints_on() || (!ckpt_wanted_ && !final)) return false;
  const std::filesystem::path dir = checkpoint::directory(ckpt_root_, ckpt_next_);
  // A unit that finished, or is silent (hung, or down after a crash), is not waited for:
  // its newest file (older than this checkpoint's syncer part, which is all resuming needs)
  // is linked in, so that one lost unit does not stop checkpoints.
  std::vector<int> linked;
  for (int u = 0; u < M_; ++u) {
    if (headers_[u].control(sync::kCheckpointFailed) == ckpt_next_) {
      abandon_checkpoint(fmt::format("unit {} could not write its file (see unit_{}.jsonl)", u, u));
      return false;
    }
    if (headers_[u].control(sync::kCheckpointDone) == ckpt_next_) continue;
    if (!unit_done(u) && !silent_[u] && remote_.connected(u)) return false;  // not written yet
    if (last_unit_file_[u].empty()) {
      if (unit_done(u) || final)
        log_.write({{"event", "checkpoint_skipped"}, {"id", ckpt_next_}, {"unit", u},
                    {"reason", "the unit stopped without ever writing a checkpoint file"},
                    {"elapsed_s", now()}});
      return false;
    }
    linked.push_back(u);
  }
  Stopwatch clock;
  checkpoint::SyncerState st;
  try {
    for (int u : linked) {
      // Never over a file the unit wrote meanwhile (it is newer, and written before our
      // part); nor will the unit's write replace the link (unit files are written once).
      std::filesystem::create_directories(dir);
      const auto to = checkpoint::unit_file(dir, u);
      std::error_code ec;
      std::filesystem::create_hard_link(last_unit_file_[u], to, ec);
      if (ec && !std::filesystem::exists(to))
        std::filesystem::copy_file(last_unit_file_[u], to, std::filesystem::copy_options::skip_existing);
    }
    st.id = ckpt_next_;
    st.mode = mode_name(plan_.mode);
    st.config_yaml = to_yaml(config_);
    st.model = config_.model;
    st.units = M_;
    st.fragments = fragments_.size();
    st.h = plan_.h;
    st.theta = flat_theta();
    st.momentum.resize(st.theta.size());
    for (int p = 0; p < fragments_.size(); ++p) fragments_.unpack(p, outer_.momentum(p), st.momentum);
    st.versions = version_;
    for (const auto& row : merged_seq_) st.merged_seq.insert(st.merged_seq.end(), row.begin(), row.end());
    st.grace = grace_.state();
    st.merges = total_merges();
    // What the units' files record (a resumed job starts from these), not what they have
    // done since.
    for (int u = 0; u < M_; ++u) st.tokens += checkpoint::unit_tokens(checkpoint::unit_file(dir, u));
    st.next_eval = next_eval_;
    st.elapsed_s = resumed_elapsed_s_ + now();
    st.run_seed = config_.run.seed;
    st.chaos_seed = config_.chaos.seed;
    checkpoint::write_syncer(dir, st, ckpts_written_ > 0 ? config_.debug.checkpoint_write_delay_ms : 0);
    ++ckpts_written_;
    checkpoint::write_manifest(dir, ckpt_next_, config_,
                               {{"merges", st.merges}, {"tokens", st.tokens},
                                {"versions", version_}, {"elapsed_s", st.elapsed_s},
                                {"final", final}});
    checkpoint::prune(ckpt_root_, config_.checkpoint.keep);
  } catch (const std::exception& e) {
    // Disk full, a file system gone: this checkpoint is abandoned, not the job.
    abandon_checkpoint(e.what());
    return false;
  }
  if (bar_.enabled()) bar_.clear();
  std::printf("checkpoint %lld: %lld merges, %.2fM tokens -> %s (%.2f s)\n",
              static_cast<long long>(ckpt_next_), static_cast<long long>(st.merges),
              st.tokens / 1e6, dir.c_str(), clock.seconds());
  std::fflush(stdout);
  for (int u = 0; u < M_; ++u) last_unit_file_[u] = checkpoint::unit_file(dir, u);
  log_.write({{"event", "checkpoint"}, {"id", ckpt_next_}, {"path", dir.string()},
              {"version", st.merges}, {"tokens", st.tokens}, {"write_s", clock.seconds()},
              {"linked_units", linked}, {"final", final}, {"elapsed_s", now()}});
  next_checkpoint();
  return true;
}

// The checkpoint being written stays incomplete (pruned once a later one is complete); the
// next is asked for at its time.
void Syncer::abandon_checkpoint(const std::string& why) {
  if (bar_.enabled()) bar_.clear();
  std::fprintf(stderr, "ddiloco: warning: checkpoint %lld abandoned: %s\n",
               static_cast<long long>(ckpt_next_), why.c_str());
  log_.write({{"event", "checkpoint_failed"}, {"id", ckpt_next_}, {"error", why},
              {"tokens", tokens_total()}, {"elapsed_s", now()}});
  next_checkpoint();
}

void Syncer::next_checkpoint() {
  ++ckpt_next_;
  ckpt_wanted_ = false;
  ckpt_due_at_ = total_merges() + config_.checkpoint.every;
  for (int u = 0; u < M_; ++u)
    if (!unit_done(u)) window_.set_control(u, sync::kCheckpointNext, ckpt_next_);
}

std::vector<float> Syncer::flat_theta() {
  std::vector<float> flat(model_.layout().size());
  for (int p = 0; p < fragments_.size(); ++p) fragments_.unpack(p, theta_[p], flat);
  return flat;
}

void Syncer::maybe_evaluate() {
  const int64_t merges = total_merges();
  if (merges < next_eval_ || merges == 0) return;
  int64_t steps = std::accumulate(steps_before_.begin(), steps_before_.end(), int64_t{0});
  for (const auto& h : headers_) steps += h.control(sync::kStepsDone);
  nlohmann::json tags = {{"event", "global_eval"},
                         {"version", merges},
                         {"round", merges / fragments_.size()},
                         {"step", steps / M_},
                         {"tokens", tokens_total()},
                         {"elapsed_s", now()}};
  if (evaluator_->submit(flat_theta(), std::move(tags))) next_eval_ = merges + eval_stride();
}

void Syncer::log_eval_results() {
  while (auto r = evaluator_->result()) {
    log_.write(*r);
    if (bar_.enabled()) bar_.clear();
    std::printf("global_eval | version %lld | tokens %.2fM | %.1fs | val_loss %.4f\n",
                static_cast<long long>((*r)["version"].get<int64_t>()),
                (*r)["tokens"].get<int64_t>() / 1e6, (*r)["elapsed_s"].get<double>(),
                (*r)["val_loss"].get<double>());
    std::fflush(stdout);
  }
}

int Syncer::run() {
  const std::filesystem::path dir = config_.run.dir;
  const std::string yaml = to_yaml(config_);
  write_text_atomically(dir / "config.yaml", yaml);
  std::printf("ddiloco %s: effective configuration (saved to %s)\n%s", DDILOCO_VERSION,
              (dir / "config.yaml").c_str(), yaml.c_str());
  log_ = JsonlWriter(dir / "metrics.jsonl", resumed_from_.empty());
  evaluator_ = std::make_unique<GlobalEvaluator>(config_.model, val_, config_.train.batch_size,
                                                 omp_get_max_threads());
  next_eval_ = resumed_next_eval_ > 0 ? resumed_next_eval_ : total_merges() + eval_stride();
  nlohmann::json unit_ranks = nlohmann::json::array();
  for (int u = 0; u < M_; ++u) unit_ranks.push_back(config_.unit_ranks(u));
  log_.write({{"event", "start"}, {"step", 0}, {"tokens", 0}, {"elapsed_s", 0.0},
              {"mode", mode_name(plan_.mode)}, {"units", M_}, {"unit_ranks", unit_ranks},
              {"fragments", fragments_.size()}, {"h", plan_.h}, {"overlap", plan_.overlap},
              {"quorum", plan_.quorum}, {"parameters", model_.layout().size()},
              {"token_budget", budget_}, {"checkpoints", checkpoints_on() ? ckpt_root_.string() : ""}});
  if (!resumed_from_.empty()) {
    log_.write({{"event", "resume"}, {"path", resumed_from_}, {"version", total_merges()},
                {"versions", version_}, {"tokens", resumed_tokens_}, {"elapsed_before_s", resumed_elapsed_s_},
                {"elapsed_s", 0.0}});
    std::printf("resumed from %s: %lld merges, %.2fM tokens\n", resumed_from_.c_str(),
                static_cast<long long>(total_merges()), resumed_tokens_ / 1e6);
    if (plan_.mode == Mode::decoupled && resumed_tokens_ >= budget_)
      std::printf("the checkpoint's job had completed its token budget (%.2fM): nothing left to "
                  "train\n", budget_ / 1e6);
  }
  for (int u = 0; u < M_; ++u) window_.set_control(u, sync::kCheckpointNext, ckpt_next_);
  std::printf("syncer: mode %s, %d units, P=%d fragments, H=%d, tau=%d, K=%d, budget %.2fM tokens\n",
              mode_name(plan_.mode), M_, fragments_.size(), plan_.h, plan_.overlap, plan_.quorum,
              budget_ / 1e6);
  if (config_.chaos.enabled()) {
    // The schedule replays exactly with chaos.schedule_file: RUN/chaos_schedule.yaml.
    const std::filesystem::path schedule_path = dir / "chaos_schedule.yaml";
    write_text_atomically(schedule_path, schedule_.to_yaml());
    const chaos::Schedule::Counts n = schedule_.counts();
    log_.write({{"event", "chaos"}, {"crashes", n.crashes}, {"slow_episodes", n.slow},
                {"link_episodes", n.link}, {"schedule", schedule_path.string()},
                {"tokens", 0}, {"elapsed_s", 0.0}});
    std::printf("chaos: %lld crashes, %lld straggler episodes, %lld link degradations scheduled "
                "(%s)\n",
                static_cast<long long>(n.crashes), static_cast<long long>(n.slow),
                static_cast<long long>(n.link), schedule_path.c_str());
  }
  std::fflush(stdout);
  mpi::barrier_patient(topo_.world);  // time zero of the fault schedule, on every rank
  wall_.restart();

  mpi::Backoff backoff(config_.syncer.poll_max_us);
  for (;;) {
    if (door_) admit_units();
    window_.poll(headers_);
    watch_liveness();
    observe_step_times();
    serve_rejoins();
    if (!plan_.outer_steps && headers_[0].control(sync::kStepsDone) > ddp_steps_seen_) {
      ddp_steps_seen_ = headers_[0].control(sync::kStepsDone);  // ddp: Θ moved a step
      downtime_.update(now(), nominal_period());
    }
    const int64_t tokens = tokens_total();
    int signal = stop_signal();
    for (int u = 0; u < M_ && signal == 0; ++u) signal = static_cast<int>(headers_[u].control(sync::kSignal));
    if (signal != 0 && plan_.mode == Mode::diloco && stop_after_version_ == 0) {
      // diloco ends on a round boundary, where every unit holds Θ and nothing is in flight:
      // the round now under way (no merge of it can have happened yet) is the last.
      stop_after_version_ = version_[0] + 1;
      interrupted_by_ = signal;
      for (int u = 0; u < M_; ++u)
        if (!unit_done(u)) window_.set_control(u, sync::kStopAfterVersion, stop_after_version_);
      log_.write({{"event", "interrupted"}, {"signal", signal}, {"stop_after_version", stop_after_version_},
                  {"tokens", tokens}, {"elapsed_s", now()}});
    }
    if (!stopping_ && plan_.mode != Mode::diloco &&
        (signal != 0 || (plan_.mode == Mode::decoupled && tokens >= budget_))) {
      // Token budget reached (decoupled) or told to stop: every unit stops at its next step
      // boundary (units waiting for a merge stop waiting). Set before this round's deliveries,
      // so that a unit taking its last merge also sees the stop.
      stopping_ = true;
      interrupted_by_ = signal;
      for (int u = 0; u < M_; ++u) window_.request_stop(u);
      log_.write({{"event", signal != 0 ? "interrupted" : "stop"}, {"signal", signal},
                  {"tokens", tokens}, {"elapsed_s", now()}});
    }
    publish_progress(tokens);
    // Before this iteration's merges: the syncer's part of a checkpoint must be newer than
    // every unit's, and a merge made now may already include a snapshot sent after a unit's.
    try_complete_checkpoint(false);
    bool work = collect();
    work |= merge_ready_fragments();
    work |= deliver_pending();
    maybe_evaluate();
    log_eval_results();
    bar_.update(std::min(tokens, budget_), budget_, fmt::format("tokens | {} merges | {:.0f}s",
                                                                total_merges(), now()));
    bool all_done = true;
    for (int u = 0; u < M_; ++u) all_done &= unit_finished(u);
    if (all_done && !work) {
      // Units are done, but their last snapshots may have been published after this poll.
      window_.poll(headers_);
      if (!collect() && !merge_ready_fragments()) break;
    }
    if (work)
      backoff.reset();
    else
      backoff.idle();
  }
  bar_.finish();
  if (checkpoints_on() && (config_.checkpoint.at_stop || ckpt_wanted_)) {
    window_.poll(headers_);  // every unit's last kCheckpointDone
    try_complete_checkpoint(true);
  }
  const double train_end = now();
  int64_t in_flight_at_end = 0;
  for (const auto& unit : slots_)
    for (const Slot& s : unit) in_flight_at_end += s.fresh;
  std::vector<TimeBook> books;
  if (door_) {
    // Isolated: each unit's leader left its unit's time book in its window with kDone; what
    // was absent (its process dead until a new one joined) is down time of all its ranks.
    books.emplace_back();  // the syncer's own, as the one-job deployment's rank 0
    for (int u = 0; u < M_; ++u) {
      double v[TimeBook::kFields];
      for (int i = 0; i < TimeBook::kFields; ++i) v[i] = headers_[u].control_f64(sync::kTimeBook + i);
      TimeBook b = TimeBook::from_vector(v);
      const double absent = members_->absent_s(u) * config_.unit_ranks(u);
      b.down += absent;
      b.allocated += absent;
      books.push_back(b);
      window_.set_control(u, sync::kReleased, 1);  // the unit may close its window now
    }
  } else {
    mpi::barrier_patient(topo_.sync_comm);  // the learners free their windows after this
  }
  const uint64_t bytes_read = window_.bytes_read(), bytes_written = window_.bytes_written();
  window_.close();
  if (!door_) books = gather_time_books(TimeBook{}, topo_.world);
  // What crossed each unit's link: snapshots and merged fragments here; ddp's ring at the
  // leaders.
  std::vector<wan::LinkCounters> link_counters(M_);
  for (int u = 0; u < M_; ++u) link_counters[u] = wan::LinkCounters::of(u, wan_[u]);
  if (!door_)
    for (const wan::LinkCounters& c : wan::gather_link_counters(wan::LinkCounters{}, topo_.world))
      link_counters[static_cast<size_t>(c.unit)] += c;
  const double global_downtime = downtime_.finish(train_end, nominal_period());
  TimeBook learners;
  double worst_booking = 0;
  for (size_t r = 1; r < books.size(); ++r) {
    learners += books[r];
    worst_booking = std::max(worst_booking, std::abs(books[r].booked() - books[r].allocated) /
                                                std::max(books[r].allocated, 1e-9));
    nlohmann::json e = {{"event", "goodput"}, {door_ ? "unit" : "rank", door_ ? r - 1 : r},
                        {"elapsed_s", now()}};
    e.update(books[r].to_json());
    log_.write(e);
  }

  // Final global evaluation of Θ, then the model file.
  const std::vector<float> flat = flat_theta();
  const double val_loss = evaluator_->evaluate_now(flat);
  log_eval_results();
  int64_t steps = std::accumulate(steps_before_.begin(), steps_before_.end(), int64_t{0});
  for (const auto& h : headers_) steps += h.control(sync::kStepsDone);
  const int64_t tokens = tokens_total();
  // Bytes across units, each message once: snapshots (up) and merged fragments (down); in
  // ddp a leader's message crosses its up link and the receiver's down link: counted once, up.
  uint64_t bytes = 0;
  nlohmann::json links = nlohmann::json::array();
  for (const wan::LinkCounters& c : link_counters) {
    bytes += c.up_bytes + (plan_.mode == Mode::ddp ? 0 : c.down_bytes);
    links.push_back({{"unit", c.unit}, {"up_bytes", c.up_bytes}, {"down_bytes", c.down_bytes},
                     {"up_messages", c.up_messages}, {"down_messages", c.down_messages}});
  }
  log_.write({{"event", "global_eval"}, {"final", true}, {"version", total_merges()},
              {"round", total_merges() / fragments_.size()}, {"step", steps / M_},
              {"tokens", tokens}, {"elapsed_s", now()}, {"val_loss", val_loss}});
  double heal_mean = 0, heal_max = 0;
  if (members_ && !members_->heal_times().empty()) {
    const auto& h = members_->heal_times();
    heal_mean = std::accumulate(h.begin(), h.end(), 0.0) / static_cast<double>(h.size());
    heal_max = *std::max_element(h.begin(), h.end());
  }
  const std::filesystem::path model_path = dir / "model.h5";
  save_model(model_path, config_.model, flat,
             {{"mode", mode_name(plan_.mode)}, {"version", total_merges()}, {"tokens", tokens},
              {"val_loss", val_loss}, {"run_dir", dir.string()}});
  log_.write({{"event", "done"},
              {"mode", mode_name(plan_.mode)},
              {"step", steps / M_},
              {"tokens", tokens},
              {"elapsed_s", now()},
              {"train_s", train_end},
              {"val_loss", val_loss},
              // This run's: a resumed run started from the checkpoint's tokens.
              {"tokens_per_s", (tokens - resumed_tokens_) / train_end},
              {"merges", total_merges()},
              {"bytes_across_units", bytes},
              {"bytes_per_token", tokens > resumed_tokens_ ? static_cast<double>(bytes) / (tokens - resumed_tokens_) : 0.0},
              {"wan_format", plan_.outer_steps || plan_.mode == Mode::ddp ? config_.wan.format : "fp32"},
              {"links", links},
              {"window_bytes", bytes_read + bytes_written},
              {"snapshots_rejected", rejected_},
              {"snapshots_superseded", superseded_},
              {"snapshots_in_flight", in_flight_at_end},  // on a WAN link when the job ended: not merged
              {"interrupted", interrupted_by_ != 0},
              {"syncer_cpu_s", process_cpu_seconds()},
              // Over the learner ranks: useful compute ÷ allocated rank-time.
              {"goodput", learners.goodput()},
              {"time", learners.to_json()},
              {"booking_error_max", worst_booking},
              {"global_downtime_s", global_downtime},
              {"downtime_episodes", downtime_.episodes()},
              {"longest_update_gap_s", downtime_.longest_gap_s()},
              {"rejoins", std::accumulate(rejoin_served_.begin(), rejoin_served_.end(), int64_t{0})},
              {"unit_restarts", members_ ? members_->total_restarts() : 0},
              {"heal_s_mean", heal_mean},
              {"heal_s_max", heal_max},
              {"model", model_path.string()}});
  const std::string resumed_part =
      resumed_from_.empty() ? "" : fmt::format(", {:.2f}M of them in this run", (tokens - resumed_tokens_) / 1e6);
  std::printf("%s: mode %s, %.2fM tokens%s in %.1fs (%.0f tokens/s), %lld merges, %.1f MB across "
              "units, final global val_loss %.4f; model saved to %s\n",
              interrupted_by_ != 0 ? "interrupted" : "done", mode_name(plan_.mode), tokens / 1e6,
              resumed_part.c_str(), train_end, (tokens - resumed_tokens_) / train_end,
              static_cast<long long>(total_merges()), bytes / 1e6, val_loss, model_path.c_str());
  std::printf("goodput %.1f%% (learner rank-time %.0fs: compute %.0fs of which discarded %.0fs, "
              "waiting %.0fs, down %.0fs, other %.0fs); global downtime %.1fs\n",
              100 * learners.goodput(), learners.allocated, learners.compute, learners.discarded,
              learners.wait, learners.down, learners.other, global_downtime);
  std::fflush(stdout);
  return interrupted_by_;
}

}  // namespace

int run_syncer(const Config& config, const OuterPlan& plan, const Topology& topology,
               const ValidationSet& val, const std::filesystem::path& resume,
               const checkpoint::SyncerState* resumed, const SyncerLink& link) {
  Syncer syncer(config, plan, topology, val, resumed, resume, link);
  return syncer.run();
}
}  // namespace ddiloco
