// The leader's fault decisions (learner_core.hpp; docs/faults.md "Faults, rejoin and goodput"): a
// chaos crash, a diverged step, a restarted syncer — each ends in a start over from the
// syncer's Θ —, the rejoin's protocol, and the debug.crash_during_read test hook.
#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "ddiloco/error.hpp"
#include "learner/learner_core.hpp"

namespace ddiloco::learner {

void LearnerCore::decide_crash(Actions& actions, int64_t t, bool non_finite, bool crash_ready, double loss,
                               double grad_norm) {
  if (actions.stop) return;
  if (non_finite) {
    log({{"event", "non_finite"}, {"step", t}, {"train_loss", loss}, {"grad_norm", grad_norm}});
    // Down for no time: straight back from Θ. The snapshots already published were taken
    // before the parameters went bad: they stay for the syncer, nothing is lost.
    actions.crash = true;
    crash_cause_ = CrashCause::non_finite;
    crash_late_s_ = 0;
    if (env_.flush_snapshots) env_.flush_snapshots();  // taken before the parameters went bad
  } else if (syncer_restarted()) {
    const double gone_s = *std::exchange(syncer_gone_s_, std::nullopt);
    // A restarted syncer admitted us again: it recovers Θ from the units' copies, ours among
    // them (offer_theta). Where units never wait for a merge we train on meanwhile and keep
    // every step; otherwise we start over from its Θ, down for no time, like a rejoin.
    const bool train_on = trains_through_syncer_restart(t);
    log({{"event", "syncer_back"}, {"step", t}, {"no_syncer_s", gone_s}, {"start_over", !train_on}});
    offer_theta();
    if (!train_on) start_over_for_syncer(actions);
  } else if (start_over_asked()) {
    // The restarted syncer refused a copy of ours, or holds it as another history's (it
    // recovered without us): we start over from its Θ.
    log({{"event", "syncer_start_over"}, {"step", t}});
    start_over_for_syncer(actions);
  } else if (crash_ready || crash_now()) {
    take_chaos_crash(actions);
  }
}

// A restarted syncer's Θ replaces ours (our memory is intact: nothing is down).
void LearnerCore::start_over_for_syncer(Actions& actions) {
  actions.crash = true;
  actions.keep_memory = true;
  crash_cause_ = CrashCause::syncer_restart;
  crash_late_s_ = 0;
}

// Only where the unit never waits for a merge (decoupled with τ ≥ 1, past the warm-up): a unit
// that waits for the merge of a snapshot the dead syncer had read would wait for good.
bool LearnerCore::trains_through_syncer_restart(int64_t t) const {
  return plan_.outer_steps && !plan_.learners_wait && !fragments_.warm(t + 1);
}

// Has the syncer answered our offer with "start over" (kStartOver)?
bool LearnerCore::start_over_asked() const {
  return offering_ && window_->control(protocol::kStartOver) >= offers_;
}

// The restarted syncer has taken our offer (kOfferTaken): our inboxes are ours again, holding
// what we took last; what it merges from now on is delivered as usual.
void LearnerCore::settle_offer() {
  if (!offering_ || window_->control(protocol::kOfferTaken) < offers_ || start_over_asked()) return;
  for (int p = 0; p < fragments(); ++p) window_->set_inbox_taken(p, frag_[p].pending_version);
  offering_ = false;
}

// The newest Θ_p we took of every fragment (`pending`, at pending_version) goes back into our
// inboxes, held (nothing is delivered meanwhile), raw, for the restarted syncer to recover Θ
// from (syncer_recovery.cpp).
void LearnerCore::offer_theta() {
  window_->hold_inboxes();
  for (int p = 0; p < fragments(); ++p) {
    const FragmentState& f = frag_[p];
    if (f.pending_version > 0) window_->offer(p, f.pending_version, f.pending, f.seq_base, f.pending_epoch);
  }
  window_->set_control(protocol::kOfferFor, ++offers_);
  offering_ = true;
}

// Asked after every step and while waiting for a merge; the answer stays until decide_crash
// takes it.
bool LearnerCore::syncer_restarted() {
  if (!syncer_gone_s_ && env_.reconnected) syncer_gone_s_ = env_.reconnected();
  return syncer_gone_s_.has_value();
}

void LearnerCore::forget_syncer_restart() {
  syncer_gone_s_.reset();  // we start over from the syncer's Θ now, whoever that syncer is
  offering_ = false;       // ... which its serve fills our inboxes with
}

// The chaos schedule's crash that is due, with the snapshots it takes down with it (those the
// syncer has not read).
void LearnerCore::take_chaos_crash(Actions& actions) {
  const double now = env_.job_time();
  const chaos::Fault* crash = faults_.crash_due(now);
  crash_cause_ = CrashCause::chaos;
  actions.crash = true;
  // Steps and waits are not interrupted: in ddp a crash due inside the all-reduce takes
  // effect after it, with the down-time it has left (logged as late_s).
  crash_late_s_ = now - crash->start_s;
  actions.down_ms = static_cast<int64_t>(1e3 * std::max(0.0, crash->end_s() - now));
  for (int p = 0; p < fragments(); ++p) actions.lost[p] = !window_->outbox_free(p);
}

bool LearnerCore::crash_now() {
  if (!faults_.crash_pending(env_.job_time())) {
    answer_reads();
    return false;
  }
  return !settings_.crash_during_read || syncer_reading();
}

// ---------------------------------------------------------------- the rejoin

// ddp's other units sit inside the gradient all-reduce waiting for this one, so a ddp unit
// comes back whatever happens (and has no syncer to rejoin).
bool LearnerCore::go_down(const Actions& a, int64_t t, bool joining) {
  if (plan_.outer_steps && crash_cause_ == CrashCause::chaos && !joining) window_->lose_outboxes();
  else if (plan_.outer_steps) window_->hold_inboxes();
  answer_reads();  // a read waiting for us now finds what the crash left
  if (!joining)
    log({{"event", "crash"}, {"step", t}, {"down_s", a.down_ms / 1e3}, {"late_s", crash_late_s_},
         {"cause", cause_name(crash_cause_)}, {"lost_snapshots", std::count(a.lost.begin(), a.lost.end(), 1)}});
  wait_down(a.down_ms / 1e3);
  step_ema_ = 0;  // the step time is measured afresh once back
  if (!plan_.outer_steps) return true;
  if (stop_requested()) return false;
  window_->set_control(protocol::kRejoinRequest, ++rejoins_);
  while (window_->control(protocol::kRejoinServed) < rejoins_ && !stop_requested()) {
    answer_reads();
    backoff_.idle();
  }
  backoff_.reset();
  return !stop_requested();
}

// Down: no heartbeat. (Reads of the other garbage snapshots are answered meanwhile.)
void LearnerCore::wait_down(double down_s) {
  const double back_at = env_.job_time() + down_s;
  while (env_.job_time() < back_at && !(plan_.outer_steps && stop_requested())) {
    answer_reads();
    sleep(std::min(0.05, std::max(0.0, back_at - env_.job_time())));
  }
}

void LearnerCore::sleep(double s) const {
  if (env_.sleep)
    env_.sleep(s);
  else
    std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

void LearnerCore::fetch_theta(std::vector<int64_t>& words) {
  for (int p = 0; p < fragments(); ++p) {
    words[1 + p] = window_->inbox_version(p);
    frag_[p].pending_epoch = window_->control(protocol::kSyncerEpoch);
    if (!window_->take_inbox(p, frag_[p].pending))
      fail("unit {}: rejoin: Θ of fragment {} failed its checksum", settings_.unit, p);
  }
}

// ---------------------------------------------------------------- test hook

void LearnerCore::answer_reads() {
  if (settings_.crash_during_read) window_->set_control(protocol::kReadSeen, window_->control(protocol::kReadsStarted));
}

// Holds a due crash until the syncer announces a read of one of our snapshots; the read waits
// for our answer, given after the crash took our memory (go_down), so it finds garbage. False
// when no snapshot is left unread: the crash then waits for a later step.
bool LearnerCore::syncer_reading() {
  while (any_unread() && !stop_requested()) {
    if (window_->control(protocol::kReadsStarted) > window_->control(protocol::kReadSeen)) return true;
    sleep(200e-6);
    beat();
  }
  return false;
}

bool LearnerCore::any_unread() const {
  for (int p = 0; p < fragments(); ++p)
    if (!window_->outbox_free(p)) return true;
  return false;
}

}  // namespace ddiloco::learner
