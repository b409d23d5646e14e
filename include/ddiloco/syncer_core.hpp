// The syncer's decisions (docs/algorithm.md, "Syncer, for each fragment round"; docs/training.md "Learner
// units and the syncer"), apart from processes, files and the job's end: which snapshots are
// read and when they count, when a fragment is merged (minimum quorum K, adaptive grace
// window), with what token weights, what is delivered to whom under flow control, the order in
// which a unit that rejoins is served, and which units are alive. It holds Θ and the outer
// optimizer.
//
// It runs over the protocol of sync_window.hpp on any transport of remote_memory.hpp, with a
// clock and an event sink given to it, so that its decisions are unit-tested through an
// in-memory transport and a manual clock (tests/unit/test_syncer_core.cpp). The syncer process
// (syncer.cpp) adds admission, evaluation, checkpoints, the stop and the report around it.
//
// One poll of the run loop, in this order:
//   poll()                the units' control blocks and headers, one read per unit
//   watch_liveness()      heartbeats: a unit silent past its timeout leaves every quorum
//   observe_step_times()  the grace window's step times, the nominal fragment period
//   serve_rejoins()       Θ into every inbox of a unit back from a crash
//   collect()             new snapshots read, checked, acknowledged (after their link)
//   merge_ready()         every fragment whose quorum (and grace) is met is merged
//   deliver_pending()     merged fragments into the inboxes of the units owed one
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ddiloco/config.hpp"
#include "ddiloco/fragments.hpp"
#include "ddiloco/goodput.hpp"
#include "ddiloco/grace.hpp"
#include "ddiloco/merge.hpp"
#include "ddiloco/syncer.hpp"
#include "ddiloco/time_books.hpp"
#include "ddiloco/sync_window.hpp"
#include "ddiloco/unit_links.hpp"

namespace ddiloco::syncer {

/// What the syncer holds for one unit and fragment.
struct Slot {
  int64_t acked = 0;        ///< last sequence number consumed (the unit's outbox is free)
  bool seq_refused = false;  ///< a sequence number refused unread was logged (until the next read)
  bool fresh = false;       ///< a snapshot waits to be merged ...
  protocol::SnapshotMeta meta;        ///< ... its counters (c_steps, c_tok), step and base version
  int64_t seq = 0;          ///< ... its sequence number
  std::vector<float> data;  ///< ... θ_p, numel(p) floats
  int64_t delivered = 0;    ///< last version written to the unit's inbox
  /// The newest version of Θ_p the unit may hold, the most a snapshot's base may name: the
  /// newest this syncer sent it (delivered, served, settled from its offer), or that a
  /// checkpoint or a recovery began from. Unlike the rest, kept when the unit reconnects: a
  /// live unit trains on from what it took before the link broke.
  int64_t may_hold = 0;
  /// The unit is owed a merged fragment: one that merged its snapshot (or the current one after
  /// its snapshot was refused). Merges in between carry nothing of its own and would only be
  /// superseded in its inbox: they are not sent, which keeps the down link to one fragment per
  /// snapshot.
  bool owed = false;
  double arrives_at = 0;    ///< the snapshot counts from then on (its link's arrival), s
  size_t wire_bytes = 0;    ///< ... bytes it took on the wire
  std::vector<float> anchor;  ///< ... the reference it was sent against (outer.anchor: reference)
  /// The unit's link (unit_links.hpp): a snapshot read is acknowledged, freeing the unit's
  /// outbox, only once its last byte has left the unit; a merged fragment lands in the inbox
  /// on arrival.
  int64_t unacked = 0;      ///< read, on its way: acknowledged at ack_at
  double ack_at = 0;
  std::vector<float> outgoing;  ///< Θ_p on its way down ...
  int64_t outgoing_version = 0; ///< ... at this version (0: none)
  double lands_at = 0;          ///< ... written into the inbox then
};

/// One fragment's current round: from its first fresh snapshot to its merge (seconds).
struct Round {
  double first_at = -1;   ///< when the round's first fresh snapshot arrived
  double quorum_at = -1;  ///< when the quorum was reached
};

/// outer.anchor: what a snapshot's outer gradient is measured from. current: Θ now (nothing is
/// kept). base, and reference (whose raw snapshots fall back to base): the Θ version it was
/// based on, so per fragment the versions some unit may still measure its progress from are
/// kept (from the oldest base version a live unit reported, to the current one). reference: a
/// snapshot sent against a reference R is measured from that R (Slot::anchor), so that Δ_m is
/// the decoded message itself: with a sparse wire format the units' R lag Θ, and an anchor at
/// Θ (or at Θ's version) would count the lag as progress.
class AnchorHistory {
 public:
  AnchorHistory(const std::string& anchor, int fragments)
      : keep_(anchor != "current"), by_reference_(anchor == "reference"), versions_(keep_ ? fragments : 0) {}
  bool keeps() const { return keep_; }
  /// A snapshot keeps the reference it was sent against (Slot::anchor).
  bool by_reference() const { return by_reference_; }
  /// Θ_p at `version` is the only version held (the start, a resume, a recovery).
  void reset(int p, int64_t version, const std::vector<float>& theta) {
    if (keep_) versions_[p] = {{version, theta}};
  }
  /// Θ_p was merged into `version`.
  void add(int p, int64_t version, const std::vector<float>& theta) {
    if (keep_) versions_[p].emplace(version, theta);
  }
  /// No unit measures its progress from a version of Θ_p older than `oldest` any more.
  void forget_before(int p, int64_t oldest) {
    if (keep_) versions_[p].erase(versions_[p].begin(), versions_[p].lower_bound(oldest));
  }
  /// Can a snapshot based on this version of Θ_p be measured? (oldest(p) says from when on.)
  bool holds(int p, int64_t version) const { return !keep_ || versions_[p].contains(version); }
  int64_t oldest(int p) const { return versions_[p].begin()->first; }
  /// The anchor of slot s of fragment p (Contribution::anchor; empty: Θ now).
  std::span<const float> anchor_of(int p, const Slot& s) const {
    if (by_reference_ && !s.anchor.empty()) return s.anchor;
    if (keep_) return versions_[p].at(s.meta.base_version);
    return {};
  }

 private:
  const bool keep_;
  const bool by_reference_;
  std::vector<std::map<int64_t, std::vector<float>>> versions_;  // per fragment
};

class SyncerCore {
 public:
  /// Seconds since the job's start on this syncer (monotonic).
  using Clock = std::function<double()>;
  /// Where the decisions' events go (metrics.jsonl): snapshot_rejected, unit_silent or
  /// unit_lost (heartbeat), unit_back, rejoin, merge.
  using EventSink = std::function<void(nlohmann::json)>;
  /// Called after fragment p merged the snapshots of `units`, before the result is delivered
  /// (the syncer asks for a checkpoint there, and logs heal times).
  using MergeHook = std::function<void(int p, const std::vector<int>& units)>;

  /// `window` and `links` must outlive the core. Θ starts as Θ₀, the units' common
  /// initialisation (run.seed); every unit's wire reference is Θ₀ at version 0.
  SyncerCore(const Config& config, const OuterPlan& plan, protocol::SyncerWindow& window,
             const protocol::FragmentPlan& fragments, UnitLinks& links, Clock clock, EventSink sink);
  void on_merge(MergeHook hook) { hooks_.on_merge = std::move(hook); }
  /// Units come and go (the isolated deployment): a unit silent past its heartbeat timeout is
  /// then logged as lost (reason heartbeat), not only silent; it keeps its connection either way.
  void set_isolated(bool isolated) { deployment_.isolated = isolated; }
  /// Test hooks: called with unit u before each read of one of its snapshots starts (the
  /// syncer process installs src/syncer/read_hooks.hpp's; the core has none of its own).
  void set_before_read(std::function<void(int u)> hook) { hooks_.before_read = std::move(hook); }

  // One poll, in the order above. The bool results say whether anything happened (the loop
  // backs off only when nothing did).
  void poll();
  void watch_liveness();
  void observe_step_times();
  void serve_rejoins();
  bool collect();
  bool merge_ready();
  bool deliver_pending();
  /// Is a read or a delivery on its way on some connected unit's lane? (The final flush waits
  /// for them.)
  bool transfers_in_flight() const;
  /// Decoupled: every unit's learning-rate schedule follows the job's tokens, written to the
  /// units whenever they have moved by the smallest unit step since the last write.
  void publish_progress(int64_t tokens);
  /// ddp: unit 0's steps, each an update of Θ (global downtime counts their gaps).
  void watch_ddp_steps();

  /// The job is ending, and a unit that connects is told to stop. `flush` (the job's end: its
  /// token budget): every snapshot published is merged, whatever the quorum. A stop by a signal,
  /// which a resumed job goes on from, does not flush: a fragment still merges only with its
  /// quorum (K in decoupled, every unit in streaming), and a snapshot short of one stays
  /// unmerged for its unit to send again when resumed (learner_resume.cpp). Flushed alone, it
  /// would put its unit one round ahead of a unit that stopped before sending its own, and once
  /// resumed each would wait (streaming; decoupled with τ = 0) for a merge that needs the other.
  void set_stopping(bool flush);
  bool stopping() const { return stopping_; }

  /// A new process of unit u connected (isolated deployment): what was known of the old
  /// window goes (sequence numbers, references, rejoin count), its work stays counted, and it
  /// is alive from now on. The acknowledgements are read from its window: a live unit that
  /// reconnects to a restarted syncer keeps what the previous one consumed.
  void unit_connected(int u);
  /// Unit u's process or link died: weight 0 from now on; its unmerged snapshots are dropped
  /// and deliveries on their way abandoned. Its tokens and steps stay counted.
  void unit_lost(int u);
  /// Unit u is alive as of now (it waits on the syncer, silent: a restarted syncer recovering).
  void heard(int u) { hear(u, headers_[u].control(protocol::kHeartbeat)); }

  /// Resumes from a checkpoint: Θ, the outer momentum, the versions, the snapshot numbering
  /// (per unit: the last sequence number in its file) and, per unit, its wire reference when
  /// its file holds one at the checkpoint's version (`refs[u][p]` empty: none).
  void restore(const checkpoint::SyncerState& state, const std::vector<std::vector<int64_t>>& unit_last_seq,
               const std::vector<std::vector<std::vector<float>>>& refs);
  /// Resumed from a checkpoint: unit u had processed `tokens` by it. A new process of the unit
  /// (one that did not resume from that checkpoint, and holds no books of a previous syncer)
  /// goes on from there: its earlier processes' tokens are at least that.
  void set_tokens_floor(int u, int64_t tokens) { unit_[u].tokens_floor = tokens; }
  /// A restarted syncer recovered Θ_p at `version` from the units' copies (recovery.hpp):
  /// Θ_p and its version become these (the outer momentum stays as it was: the checkpoint's,
  /// or zero). Throws Error for a wrong size or a version not above the current one.
  void adopt(int p, int64_t version, std::span<const float> values);
  /// Unit u's offer named `seq_base`, the base of its snapshot numbering: the syncer's becomes
  /// the same, and its snapshots up to the last the previous syncer consumed count as merged
  /// (what they carried is in the recovered Θ, or was lost with the previous syncer).
  void recovered_numbering(int u, int p, int64_t seq_base);
  /// This syncer replaces one of the same run that died: a unit's window holds books (tokens
  /// of its earlier processes, the job's progress) that the previous syncer wrote, and they are
  /// read back. Otherwise only books this syncer wrote itself are (a unit that reconnects).
  void set_restarted() { deployment_.restarted = true; }
  /// This syncer process's epoch (kSyncerEpoch): random, ≠ 0.
  int64_t epoch() const { return lineage_.epoch; }
  /// Is a unit's copy of Θ_p at `version`, sent by the syncer of `epoch`, a version of this
  /// syncer's history? Its own copies are; a previous syncer's are up to the version this one
  /// took over from (recovered, resumed, or 0): beyond it the numbers are another history's.
  bool in_history(int p, int64_t version, int64_t epoch) const {
    return epoch == lineage_.epoch ? version <= version_[p] : version <= lineage_.fork[p];
  }
  /// A live unit offered Θ_p at `versions[p]` (0: none) and trains on: it holds those, and is
  /// owed every fragment the syncer holds newer (delivered as merges are, once it has taken its
  /// inboxes back). Every versions[p] must be at most the syncer's.
  void offer_taken(int u, const std::vector<int64_t>& versions);

  // What the rest of the syncer reads.
  int units() const { return M_; }
  int fragments() const { return fragments_.size(); }
  const protocol::FragmentPlan& fragment_plan() const { return fragments_; }
  const protocol::UnitHeaders& headers(int u) const { return headers_[u]; }
  bool unit_done(int u) const { return headers_[u].control(protocol::kState) == protocol::kDone; }
  /// Connected, not done, and heard from within its heartbeat timeout: may be in a quorum.
  bool unit_live(int u) const;
  bool silent(int u) const { return unit_[u].silent; }
  /// When unit u's heartbeat last moved, seconds.
  double heard_at(int u) const { return unit_[u].heard_at; }
  /// Tokens (steps) of every unit, its earlier processes' included. Each unit's count is taken
  /// as at least 0, and the sum saturates at INT64_MAX: a unit's header word cannot make it
  /// wrap (it can still claim tokens it never made; issue 34).
  int64_t tokens_total() const;
  int64_t steps_total() const;
  /// Unit u's share of those: its tokens (steps), its earlier processes' included.
  int64_t unit_tokens(int u) const;
  int64_t unit_steps(int u) const;
  int64_t total_merges() const;
  const std::vector<int64_t>& versions() const { return version_; }
  std::span<const float> theta(int p) const { return theta_[p]; }
  std::vector<float> flat_theta() const;
  std::vector<float> flat_momentum();
  /// [unit][fragment]: the last snapshot of it merged, in the numbering across jobs.
  const std::vector<std::vector<int64_t>>& merged_seq() const { return numbering_.merged; }
  const GraceWindow& grace() const { return grace_; }
  /// H inner steps at the units' median step time (ddp: one step): the nominal time between
  /// two updates of a fragment, seconds (0 until a step time is known).
  double nominal_period() const;
  GlobalDowntime& downtime() { return pace_.downtime; }
  const GlobalDowntime& downtime() const { return pace_.downtime; }
  int64_t snapshots_rejected() const { return rejected_; }
  int64_t snapshots_superseded() const { return superseded_; }
  /// Snapshots read but not merged (on a WAN link when the job ended).
  int64_t snapshots_unmerged() const;
  int64_t rejoins_served() const;

 private:
  double now() const { return hooks_.clock(); }
  bool snapshot_pending(int u, int p) const;
  bool collect_unit(int u);
  bool end_read(int u);
  bool send(int u, int p);
  void end_delivery(int u, size_t bytes);
  bool serve(int u);
  void hear(int u, int64_t beat);
  double silence_after_s(int u) const;
  nlohmann::json bound_outer_gradients(int p, const std::vector<int>& units);
  bool sequence_plausible(int u, int p, int64_t seq);
  void stand_in(int u, int p, int64_t seq);
  bool outer_step(int p, const std::vector<int>& units, const std::vector<Contribution>& contributions,
                  double share, bool warm_up, bool& undone);
  std::string check_snapshot(int u, int p, const protocol::SnapshotMeta& meta,
                             const protocol::SyncerWindow::Fetched& got, int64_t seq) const;
  void accept_snapshot(int u, int p, int64_t seq, const protocol::SnapshotMeta& meta, size_t wire_bytes, int64_t ref);
  void ack_arrived(int u, int p);
  std::vector<int> ready_units(int p) const;
  bool too_stale(int p, int64_t base_version) const;
  std::string staleness_problem(int p, int64_t base_version) const;
  void drop_stale(int p);
  int quorum_needed(int p, int live, int done) const;
  int waiting_elsewhere(int p) const;
  void merge(int p, const std::vector<int>& units);
  bool warm(int p, const std::vector<int>& units) const;
  bool warm_round_overdue(int p, const std::vector<int>& ready) const;
  double merge_share(const std::vector<int>& units) const;
  void prune_history(int p);
  void deliver(int u, int p);
  int64_t tokens_per_step(int u) const { return config_.unit_tokens_per_step(u); }

  const Config& config_;
  const OuterPlan plan_;
  const int M_;
  const protocol::FragmentPlan& fragments_;
  protocol::SyncerWindow& window_;
  UnitLinks& links_;
  // What the core calls out to: its clock, where its events go, and the syncer's hooks.
  struct Hooks {
    Clock clock;
    EventSink log;
    MergeHook on_merge;
    std::function<void(int)> before_read;
  };
  Hooks hooks_;
  OuterOptimizer outer_;
  GraceWindow grace_;
  OuterGradientBound bound_;

  std::vector<std::vector<float>> theta_;      // Θ, packed per fragment
  std::vector<float> undo_theta_, undo_momentum_;  // a merge's fragment before it (outer_step)
  std::vector<int64_t> version_;               // merges per fragment
  std::vector<std::vector<Slot>> slots_;       // [unit][fragment]
  std::vector<Round> rounds_;                  // per fragment
  std::vector<std::vector<float>> incoming_;   // per fragment: a snapshot being read
  AnchorHistory history_;
  std::vector<protocol::UnitHeaders> headers_;           // last poll
  // What each unit's lane (SyncerWindow) carries, as started here.
  struct InFlight {
    int p = -1;
    int64_t seq = 0;     // a read: the snapshot's sequence number and counters as polled
    protocol::SnapshotMeta meta;
    int64_t version = 0;  // a delivery: the version of Θ_p ...
    bool serve = false;   // ... served at a rejoin
  };
  struct Serving {  // a rejoin being served
    int next = 0;        // the next fragment to write
    double started = 0;  // s
    uint64_t bytes = 0;
    double lands_at = 0;  // s: when the last fragment lands (emulated link)
  };
  // What the core knows of one unit beside its slots: its liveness, its lane, and the work of
  // its earlier processes.
  struct Unit {
    int64_t heartbeat = -1;  // last heartbeat seen
    double heard_at = 0;     // ... when it last moved
    bool silent = false;     // heartbeat older than the timeout
    InFlight in_flight;
    Serving serving;
    int64_t rejoin_served = 0;
    uint64_t slow_reported = 0;  // the lane transfer last logged as link_slow
    // A read came back torn, so its polled headers are stale: no read starts before a poll has
    // read them again (else the same stale announcement is read again and again).
    bool torn = false, repolled = false;
    int64_t tokens_before = 0, steps_before = 0;  // its earlier processes' work
    int64_t tokens_floor = 0;  // its tokens in the checkpoint resumed from
  };
  std::vector<Unit> unit_;
  void report_slow_link(int u);
  // Snapshot numbers across jobs and syncers, [unit][fragment]: a unit's window numbers them
  // from 1 in each process, after a base this syncer adds.
  struct Numbering {
    std::vector<std::vector<int64_t>> merged;  // the last snapshot merged
    std::vector<std::vector<int64_t>> base;    // added to window numbers
  };
  Numbering numbering_;
  // The pace of Θ's updates: the units' median step time (nominal_period), ddp's steps seen,
  // and the gaps between updates (the global downtime).
  struct Pace {
    double median_step_s = 0;
    int64_t ddp_steps_seen = 0;
    GlobalDowntime downtime;
  };
  Pace pace_;
  // decoupled's job clock (publish_progress): the job tokens last written to the units, and
  // how many more refresh them (the smallest unit step).
  struct JobClock {
    int64_t sent = 0;
    int64_t step = INT64_MAX;
  };
  JobClock job_clock_;
  bool stopping_ = false;
  bool flush_ = false;  // set_stopping's
  // How this syncer is deployed: units come and go (isolated); it replaces one that died.
  struct Deployment {
    bool isolated = false;
    bool restarted = false;
  };
  Deployment deployment_;
  // This syncer's own history of Θ: its process's epoch (kSyncerEpoch: random, ≠ 0) and, per
  // fragment, the version it starts at (recovered, resumed, or 0).
  struct Lineage {
    const int64_t epoch;
    std::vector<int64_t> fork;
  };
  Lineage lineage_;
  int64_t rejected_ = 0, superseded_ = 0;
};

}  // namespace ddiloco::syncer
