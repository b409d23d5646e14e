// Faults on a learner (README "Faults, rejoin and goodput"): chaos crashes, a diverged step,
// a restarted syncer — each ends in a rejoin from the syncer's Θ —, the isolated deployment's
// join (a rejoin with nothing lost), and the test hooks that emulate faults.
#include "sync/learner.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <thread>
#include <utility>

#include "ddiloco/error.hpp"

namespace ddiloco {

namespace {

void poison(std::span<float> xs) { std::fill(xs.begin(), xs.end(), std::numeric_limits<float>::quiet_NaN()); }

}  // namespace

// Leader: does the unit start over from Θ after this step, and why?
void Learner::decide_crash(Actions& actions, int64_t t, const StepStats& s, bool non_finite, bool crash_ready) {
  if (non_finite && !actions.stop) {
    log_.write({{"event", "non_finite"}, {"unit", u_}, {"step", t}, {"tokens", tokens_},
                {"elapsed_s", wall_.seconds()}, {"train_loss", s.loss}, {"grad_norm", s.grad_norm}});
    // Down for no time: straight back from Θ. The snapshots already published were taken
    // before the parameters went bad: they stay for the syncer, nothing is lost.
    actions.crash = true;
    crash_cause_ = "non_finite";
    crash_late_s_ = 0;
    if (gpu_) publish_all();  // taken before the parameters went bad, as on the CPU path
  } else if (!actions.stop && syncer_restarted()) {
    const double gone_s = *std::exchange(syncer_gone_s_, std::nullopt);
    // A restarted syncer admitted us again: it recovers Θ from the units' copies, ours among
    // them (offer_theta). Where units never wait for a merge we train on meanwhile and keep
    // every step; otherwise we start over from its Θ, down for no time, like a rejoin.
    const bool train_on = trains_through_syncer_restart(t);
    log_.write({{"event", "syncer_back"}, {"unit", u_}, {"step", t}, {"tokens", tokens_},
                {"no_syncer_s", gone_s}, {"start_over", !train_on}, {"elapsed_s", wall_.seconds()}});
    offer_theta();
    if (!train_on) start_over_for_syncer(actions);
  } else if (!actions.stop && start_over_asked()) {
    // The restarted syncer refused a copy of ours, or holds it as another history's (it
    // recovered without us): we start over from its Θ.
    log_.write({{"event", "syncer_start_over"}, {"unit", u_}, {"step", t}, {"elapsed_s", wall_.seconds()}});
    start_over_for_syncer(actions);
  } else if (!actions.stop && (crash_ready || crash_now())) {
    take_chaos_crash(actions);
  }
}

// Leader: a restarted syncer's Θ replaces ours (our memory is intact: nothing is down).
void Learner::start_over_for_syncer(Actions& actions) {
  actions.crash = true;
  crash_cause_ = "syncer_restart";
  crash_late_s_ = 0;
}

// Leader: may the unit train on while a restarted syncer recovers Θ, keeping all its steps?
// Only where it never waits for a merge (decoupled with τ ≥ 1, past the warm-up): a unit that
// waits for the merge of a snapshot the dead syncer had read would wait for good.
bool Learner::trains_through_syncer_restart(int64_t t) const {
  return plan_.outer_steps && !plan_.learners_wait && !fragments_.warm(t + 1);
}

// Leader: has the syncer answered our offer with "start over" (kStartOver)?
bool Learner::start_over_asked() const { return offering_ && window_->control(sync::kStartOver) >= offers_; }

// Leader: the restarted syncer has taken our offer (kOfferTaken): our inboxes are ours again,
// holding what we took last; what it merges from now on is delivered as usual.
void Learner::settle_offer() {
  if (!offering_ || window_->control(sync::kOfferTaken) < offers_ || start_over_asked()) return;
  for (int p = 0; p < P_; ++p) window_->set_inbox_taken(p, frag_[p].pending_version);
  offering_ = false;
}

// Leader: the chaos schedule's crash that is due, with what it takes down with it.
void Learner::take_chaos_crash(Actions& actions) {
  const chaos::Fault* crash = faults_.crash_due(job_time());
  crash_cause_ = "chaos";
  actions.crash = true;
  // Steps and waits are not interrupted: in ddp a crash due inside the all-reduce takes
  // effect after it, with the down-time it has left (logged as late_s).
  crash_late_s_ = job_time() - crash->start_s;
  actions.down_ms = static_cast<int64_t>(1e3 * std::max(0.0, crash->end_s() - job_time()));
  for (int p = 0; p < P_; ++p) actions.lost[p] = !window_->outbox_free(p);
  for (int p = 0; p < P_ && gpu_; ++p)
    if (frag_[p].snap_meta) {  // never published: it dies with the unit
      actions.lost[p] = 1;
      frag_[p].snap_meta.reset();
    }
}

// Leader: a crash is due and is taken now (debug.crash_during_read: once it lands in a read).
bool Learner::crash_now() {
  if (!faults_.crash_pending(job_time())) {
    answer_reads();
    return false;
  }
  return !config_.debug.crash_during_read || !plan_.outer_steps || syncer_reading();
}

// Leader, isolated: has a restarted syncer admitted us since we last started over? Asked after
// every step and while waiting for a merge; the answer stays until decide_crash takes it.
bool Learner::syncer_restarted() {
  if (!syncer_gone_s_ && sync_link_.reconnected) syncer_gone_s_ = sync_link_.reconnected();
  return syncer_gone_s_.has_value();
}

// Test hook (debug.crash_during_read): the syncer announces every read of one of our snapshots
// and waits until we answer. Without a crash due we answer at once (every step boundary).
void Learner::answer_reads() {
  if (config_.debug.crash_during_read && plan_.outer_steps)
    window_->set_control(sync::kReadSeen, window_->control(sync::kReadsStarted));
}

// Test hook: hold a due crash until the syncer announces a read of one of our snapshots; the
// read waits for our answer, given after the crash took our memory (go_down), so it finds
// garbage. False when no snapshot is left unread: the crash then waits for a later step.
bool Learner::syncer_reading() {
  while (any_unread() && !stop_requested()) {
    if (window_->control(sync::kReadsStarted) > window_->control(sync::kReadSeen)) return true;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    beat();
  }
  return false;
}

bool Learner::any_unread() const {
  for (int p = 0; p < P_; ++p)
    if (!window_->outbox_free(p)) return true;
  return false;
}

// The step loop's crash: the time until the unit is back is down time. False when told to
// stop while down.
bool Learner::crash(const Actions& actions, int64_t& t) {
  Stopwatch down_clock;
  const bool back = crash_and_rejoin(actions, t);
  book_.down += down_clock.seconds();
  stopped_down_ = !back;
  return back;
}

// A crashed unit: its ranks lose parameters and optimizer state, stay down, then fetch Θ of
// every fragment from the syncer and start over from it with fresh counters and moments,
// on their own data streams from where they were. Returns false when told to stop while
// down. ddp keeps the replica: on a synchronous job a returning replica is copied from a
// peer's identical one, which we do not move; everyone waits for it all the same.
// joining: the isolated deployment's start, where a new unit process takes Θ from the
// syncer like a unit back from a crash (with nothing lost, nothing to wait out).
bool Learner::crash_and_rejoin(const Actions& a, int64_t& t, bool joining) {
  drop_unsent_work(a);
  syncer_gone_s_.reset();  // we start over from the syncer's Θ now, whoever that syncer is
  offering_ = false;       // ... which its serve fills our inboxes with
  std::vector<int64_t> words(1 + P_, 0);  // [stop, versions fetched...]
  if (topo_.leader) {
    go_down(a, t, joining);
    words[0] = stop_while_down();
    if (plan_.outer_steps && !words[0]) fetch_theta(words);
  }
  if (topo_.unit_size > 1) mpi::broadcast_patient(words, 0, topo_.unit_comm);
  if (words[0]) return false;
  if (plan_.outer_steps) start_over_from(words);
  // diloco counts rounds in steps: every unit's k-th snapshot is its step k·H (P = 1; after a
  // warm-up of W steps synchronised every step, W + (k − W)·H). A
  // unit back from a crash redoes, from the Θ it fetched (round words[1]), the steps of the
  // round it lost, so that its snapshots and its last step stay in line with the others'.
  const int64_t crashed_at = t;
  if (plan_.redoes_lost_round) {
    t = fragments_.step_of_sync(0, words[1]);
    trainer_.set_steps_done(t);  // the learning rate follows the round too
  }
  if (topo_.leader) {
    step_ema_ = 0;
    nlohmann::json versions(std::vector<int64_t>(words.begin() + 1, words.end()));
    log_.write({{"event", joining ? "join" : "rejoin"}, {"unit", u_}, {"step", t}, {"tokens", tokens_},
                {"elapsed_s", wall_.seconds()}, {"versions", versions},
                {"steps_redone", crashed_at - t}});
  }
  return true;
}

// The work no snapshot carried away dies with the crash, and so does the work in a snapshot
// the syncer had not read; then the parameters and optimizer state are gone.
void Learner::drop_unsent_work(const Actions& a) {
  for (int p = 0; p < P_ && tracks_fragments_; ++p) {
    FragmentState& f = frag_[p];
    book_.discarded += f.unsent + (a.lost[p] ? f.in_flight : 0.0);
    f.unsent = f.in_flight = 0;
  }
  // A restarted syncer took nothing of our memory: θ is replaced by its Θ when we start over,
  // and the moments stay, as over any merge (on a GPU the host holds no current copy of them).
  const bool memory_intact = crash_cause_ == "syncer_restart" && !gpu_;
  if (plan_.outer_steps && !memory_intact) {
    poison(trainer_.model().parameters());
    trainer_.optimizer().reset();
  }
}

// Leader: the unit's memory is gone (its outboxes turn to garbage; a unit that kept its memory
// leaves them for the syncer), its heartbeat stops for the down time, then it asks to rejoin.
void Learner::go_down(const Actions& a, int64_t t, bool joining) {
  if (plan_.outer_steps && crash_cause_ == "chaos" && !joining) window_->lose_outboxes();
  else if (plan_.outer_steps) window_->hold_inboxes();
  answer_reads();  // a read waiting for us now finds what the crash left
  if (!joining)
    log_.write({{"event", "crash"}, {"unit", u_}, {"step", t}, {"tokens", tokens_},
                {"elapsed_s", wall_.seconds()}, {"down_s", a.down_ms / 1e3}, {"late_s", crash_late_s_},
                {"cause", crash_cause_},
                {"lost_snapshots", std::count(a.lost.begin(), a.lost.end(), 1)}});
  // Down: no heartbeat. (Reads of the other garbage snapshots are answered meanwhile.)
  const double back_at = wall_.seconds() + a.down_ms / 1e3;
  while (wall_.seconds() < back_at && !stop_while_down()) {
    answer_reads();
    std::this_thread::sleep_for(std::chrono::duration<double>(
        std::min(0.05, std::max(0.0, back_at - wall_.seconds()))));
  }
  if (plan_.outer_steps && !stop_requested()) {
    window_->set_control(sync::kRejoinRequest, ++rejoins_);
    while (window_->control(sync::kRejoinServed) < rejoins_ && !stop_requested()) {
      answer_reads();
      backoff_.idle();
    }
    backoff_.reset();
  }
}

// Leader, its syncer restarted: the newest Θ_p it took of every fragment (`pending`, at
// pending_version) goes back into its inboxes, held (nothing is delivered meanwhile), raw, for
// the restarted syncer to recover Θ from (syncer_recovery.cpp).
void Learner::offer_theta() {
  window_->hold_inboxes();
  for (int p = 0; p < P_; ++p) {
    const FragmentState& f = frag_[p];
    if (f.pending_version > 0) window_->offer(p, f.pending_version, f.pending, f.seq_base, f.pending_epoch);
  }
  window_->set_control(sync::kOfferFor, ++offers_);
  offering_ = true;
}

// Leader: ddp's other units sit inside the gradient all-reduce waiting for this one, so it
// comes back whatever happens and stops with them after that step.
bool Learner::stop_while_down() { return plan_.outer_steps && stop_requested(); }

// Leader: Θ of every fragment, which the syncer wrote into our inboxes for the rejoin, into
// `pending`, and the versions fetched into words[1..].
void Learner::fetch_theta(std::vector<int64_t>& words) {
  for (int p = 0; p < P_; ++p) {
    words[1 + p] = window_->inbox_version(p);
    frag_[p].pending_epoch = window_->control(sync::kSyncerEpoch);
    if (!window_->take_inbox(p, frag_[p].pending))
      fail("unit {}: rejoin: Θ of fragment {} failed its checksum", u_, p);
  }
}

// Every rank: θ ← the Θ fetched, at the versions in words[1..].
void Learner::start_over_from(const std::vector<int64_t>& words) {
  for (int p = 0; p < P_; ++p) {
    fragments_.unpack(p, fragment_from_leader(p), trainer_.model().parameters());
    // The next outer gradient is against what was fetched; the token weight restarts.
    FragmentState& f = frag_[p];
    f.c_steps = f.c_tok = 0;
    f.applied = f.pending_version = f.sends = words[1 + p];
    f.sent_step = -1;
  }
  trainer_.upload_state();  // cuda: Θ and the fresh (zero) moments to the device
}

// The isolated deployment: a new process of the unit (not resumed from a checkpoint) starts
// from the syncer's Θ.
void Learner::join() {
  if (!topo_.isolated || !plan_.outer_steps || resume_) return;
  Stopwatch join_clock;
  int64_t t0 = first_step_ - 1;
  stopped_down_ = !crash_and_rejoin(Actions(P_), t0, /*joining=*/true);
  first_step_ = t0 + 1;
  (sync_link_.restart > 0 ? book_.down : book_.other) += join_clock.seconds();
}

// Test hook: hold this unit, silent, until the others have moved the syncer on, or the job is
// told to stop (in diloco a stop ends the job after the round under way, which needs this unit:
// a hold the stop did not release would never end).
void Learner::stall_hook(int64_t t) {
  if (config_.debug.stall_unit != u_ || stalled_ || t < config_.debug.stall_at_step ||
      ckpt_done_ < config_.debug.stall_after_checkpoints)
    return;
  stalled_ = true;
  while (window_->control(sync::kGlobalVersion) < config_.debug.stall_until_merges && !stop_requested() &&
         window_->control(sync::kStopAfterVersion) == 0)
    backoff_.idle();
  backoff_.reset();
}

// Test hook: the leader's parameters turn NaN just before a snapshot that is published (the
// syncer must refuse it); its next loss, all-reduced, is NaN on every rank of the unit.
void Learner::nan_hook(int64_t t) {
  if (config_.debug.nan_unit != u_ || t < config_.debug.nan_at_step || nan_injected_) return;
  poison(trainer_.model().parameters());
  trainer_.upload_state(false);  // cuda: the device's parameters turn NaN
  nan_injected_ = true;
}

}  // namespace ddiloco
