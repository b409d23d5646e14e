// The leader's outer-loop decisions (learner_core.hpp): snapshots out, merges in, stops,
// checkpoints; the faults are in learner_core_faults.cpp.
#include "learner/learner_core.hpp"

#include <algorithm>
#include <limits>

#include "ddiloco/error.hpp"
#include "ddiloco/signals.hpp"

namespace ddiloco::learner {

std::string_view cause_name(CrashCause c) {
  switch (c) {
    case CrashCause::chaos: return "chaos";
    case CrashCause::non_finite: return "non_finite";
    case CrashCause::syncer_restart: return "syncer_restart";
  }
  return "?";
}

LearnerCore::Settings LearnerCore::Settings::of(const Config& config, const OuterPlan& plan, int unit,
                                                bool isolated) {
  Settings s;
  s.unit = unit;
  s.carry = config.outer.apply == "carry";
  s.isolated = isolated;
  s.max_steps = plan.stops_on_token_budget ? std::numeric_limits<int64_t>::max() : config.train.steps;
  s.token_budget = config.token_budget();
  s.job_step_tokens = config.job_tokens_per_step();
  s.checkpoint_at_stop = config.checkpoint.at_stop;
  s.crash_during_read = config.debug.crash_during_read && plan.outer_steps;
  return s;
}

LearnerCore::LearnerCore(const OuterPlan& plan, const protocol::FragmentPlan& fragments, protocol::LearnerWindow* window,
                         Settings settings, chaos::UnitTimeline faults, Env env)
    : plan_(plan),
      fragments_(fragments),
      window_(window),
      settings_(settings),
      faults_(std::move(faults)),
      env_(std::move(env)),
      frag_(fragments.size()) {
  if (window_)
    for (int p = 0; p < fragments.size(); ++p) frag_[p].pending.resize(fragments.fragments()[p].numel);
}

void LearnerCore::log(nlohmann::json event) const {
  if (env_.log) env_.log(std::move(event));
}

// ---------------------------------------------------------------- every rank

void LearnerCore::count_step(int64_t tokens) {
  for (FragmentState& f : frag_) {
    ++f.c_steps;
    f.c_tok += tokens;
  }
}

void LearnerCore::record_sends(const Actions& actions) {
  for (int p = 0; p < fragments() && plan_.outer_steps; ++p)
    if (actions.sent[p]) {
      frag_[p].sent_c_steps = frag_[p].c_steps;
      frag_[p].sent_c_tok = frag_[p].c_tok;
    }
}

// Carry: the next snapshot counts the steps and tokens since the one this merge answered,
// not since the apply.
void LearnerCore::applied(int p, int64_t version) {
  FragmentState& f = frag_[p];
  f.count_from_merge(settings_.carry, f.sent_c_steps, f.sent_c_tok);
  f.applied = version;
  f.sent_step = -1;
}

// The next outer gradient is against what was fetched; the token weight restarts.
void LearnerCore::started_over(const std::vector<int64_t>& words) {
  for (int p = 0; p < fragments(); ++p) {
    FragmentState& f = frag_[p];
    f.c_steps = f.c_tok = 0;
    f.applied = f.pending_version = f.sends = words[1 + p];
    f.sent_step = -1;
  }
}

// ---------------------------------------------------------------- the leader: every step

// What the syncer reads of us every poll: alive, how far, how fast (its grace window and
// liveness timeout scale with our step time).
void LearnerCore::report_progress(int64_t t, int64_t tokens, double step_s) {
  step_ema_ = step_ema_ == 0 ? step_s : 0.9 * step_ema_ + 0.1 * step_s;
  beat();
  window_->set_control(protocol::kStepsDone, t);
  window_->set_control(protocol::kTokensDone, tokens);
  window_->set_control(protocol::kStepTimeNs, static_cast<int64_t>(step_ema_ * 1e9));
}

void LearnerCore::beat() { window_->set_control(protocol::kHeartbeat, window_->control(protocol::kHeartbeat) + 1); }

// In one job a signal reaches every rank (scancel, requeue) and the job stops as one: a diloco
// unit that receives it tells the syncer, which names the round every unit ends on. In the
// isolated deployment a signal is this unit's own (its Slurm task requeued, its node
// drained): it stops alone, the syncer loses it and merges on, whatever the mode.
bool LearnerCore::stop_requested() {
  if (stop_signal() != 0) window_->set_control(protocol::kSignal, stop_signal());
  const bool alone = settings_.isolated || !plan_.stops_on_named_round;
  return window_->control(protocol::kStop) != 0 || (stop_signal() != 0 && alone);
}

std::vector<int> LearnerCore::due(int64_t t, bool non_finite) const {
  if (!plan_.outer_steps || non_finite) return {};  // poisoned parameters are never published
  return fragments_.due_after(t);
}

// Flow control: the outbox is written only once the syncer consumed the previous snapshot;
// otherwise the publish is skipped and counted, and the counters keep growing for the next.
std::optional<protocol::SnapshotMeta> LearnerCore::claim_outbox(int p, int64_t t, Actions& actions) {
  if (!window_->outbox_free(p)) {
    window_->set_control(protocol::kPublishSkipped, ++skipped_);
    return std::nullopt;
  }
  FragmentState& f = frag_[p];
  const protocol::SnapshotMeta meta{f.c_steps, f.c_tok, t, f.applied};
  f.sent_step = t;
  ++f.sends;
  actions.sent[p] = 1;
  return meta;
}

void LearnerCore::publish(int p, std::span<const float> packed, const protocol::SnapshotMeta& meta) {
  frag_[p].last_seq = frag_[p].seq_base + window_->publish(p, packed, meta);
  // When each snapshot left, for whoever follows a run (and for tests that act once it has).
  log({{"event", "snapshot"}, {"fragment", p}, {"step", meta.step}, {"seq", frag_[p].last_seq},
       {"base_version", meta.base_version}, {"c_steps", meta.c_steps}});
}

int64_t LearnerCore::take(int p) {
  FragmentState& f = frag_[p];
  const int64_t v = window_->inbox_version(p);
  if (v <= f.pending_version) return 0;
  if (!window_->take_inbox(p, f.pending))
    fail("unit {}: merged fragment {} version {} failed its checksum", settings_.unit, p, v);
  f.pending_version = v;
  f.pending_epoch = window_->control(protocol::kSyncerEpoch);
  if (env_.taken) env_.taken(p, f.pending);
  return v;
}

// Decoupled: the newest merge is applied when due, whether or not it includes our snapshot;
// ours is merged later, with its staleness.
bool LearnerCore::take_merges(int64_t t, Actions& actions) {
  settle_offer();  // a restarted syncer that took our offer delivers as usual again
  bool crash_ready = false;
  for (int p = 0; p < fragments() && plan_.outer_steps; ++p) {
    take(p);
    const FragmentState& f = frag_[p];
    // Warm-up (post-local SGD): every step's merge is applied before the next step.
    const bool warm = fragments_.warm(t);
    const bool owed = f.sent_step >= 0 && t >= f.sent_step + (warm ? 0 : plan_.overlap);
    if (owed && (plan_.learners_wait || warm)) crash_ready = wait_for_merge(p, crash_ready);
    if (owed && f.pending_version > f.applied) actions.apply.emplace_back(p, f.pending_version);
  }
  return crash_ready;
}

// Synchronous modes, decoupled with τ = 0 and every mode in the warm-up: waits (beating) for
// the merge owed on p.
bool LearnerCore::wait_for_merge(int p, bool crash_ready) {
  const FragmentState& f = frag_[p];
  // Synchronous modes: every merge includes every unit, so the merge of our k-th snapshot is
  // version k. Decoupled with τ = 0: any merge newer than ours.
  const int64_t want = plan_.every_merge_has_all ? f.sends : f.applied + 1;
  // The merge may need our own snapshot, still on its way to host memory.
  if (env_.flush_snapshots && f.pending_version < want) env_.flush_snapshots();
  // A crash due meanwhile happens on time: a unit that waits can fail too. A restarted syncer
  // never sends the merge we wait for (it holds deliveries until we rejoin): we start over.
  if (f.pending_version < want) window_->set_control(protocol::kWaitingFor, p + 1);
  while (f.pending_version < want && !stop_requested() && !crash_ready && !syncer_restarted()) {
    if ((crash_ready = crash_now())) break;
    backoff_.idle();
    take(p);
    beat();  // alive while waiting
  }
  window_->set_control(protocol::kWaitingFor, 0);
  backoff_.reset();
  return crash_ready;
}

bool LearnerCore::decide_stop(const Actions& actions, int64_t t, bool ddp_agreed) {
  bool stop = (plan_.outer_steps ? stop_requested() : ddp_agreed) || t >= settings_.max_steps;
  if (const int64_t last_round = window_->control(protocol::kStopAfterVersion); last_round > 0) {
    int64_t round = frag_[0].applied;  // diloco (P = 1): the round this step ends on
    for (const auto& [p, version] : actions.apply) round = std::max(round, version);
    stop |= round >= last_round;
  }
  return stop;
}

// With no syncer to count the job's tokens, the unit counts them itself from the last count
// the syncer published (kJobTokens), as if every unit stepped as fast as it does. Without
// this, units whose syncer died near the end of the budget would train past it for as long as
// it is away.
void LearnerCore::wait_if_budget_spent_alone(int64_t t) {
  if (!plan_.stops_on_token_budget || !env_.syncer_present) return;
  if (const int64_t job = window_->control(protocol::kJobTokens); job != job_tokens_seen_) {
    job_tokens_seen_ = job;
    job_tokens_step_ = t;
  }
  const int64_t estimate = job_tokens_seen_ + (t - job_tokens_step_) * settings_.job_step_tokens;
  // Alone: no syncer, or a restarted one that has not taken our offer yet (it is recovering,
  // and cannot count the job's tokens before). A syncer that admits us meanwhile ends the wait:
  // it needs our offer (decide_crash), and so does one told to start over.
  auto alone = [&] {
    settle_offer();
    return (!env_.syncer_present() || offering_) && !syncer_restarted() && !start_over_asked();
  };
  if (estimate < settings_.token_budget || !alone()) return;
  log({{"event", "budget_spent_alone"}, {"step", t}, {"job_tokens_estimate", estimate}});
  while (alone() && !stop_requested()) {
    beat();
    backoff_.idle();
  }
  backoff_.reset();
}

int64_t LearnerCore::schedule_step() const {
  return window_->control(protocol::kJobTokens) / settings_.job_step_tokens;
}

// ---------------------------------------------------------------- checkpoints

int64_t LearnerCore::requested_checkpoint() const {
  const int64_t want = window_->control(protocol::kCheckpointWant);
  return want > ckpt_done_ ? want : 0;
}

int64_t LearnerCore::decide_checkpoint(bool stop, int64_t requested) const {
  if (stop && (settings_.checkpoint_at_stop || requested > 0)) return next_checkpoint_id();
  return requested;
}

int64_t LearnerCore::next_checkpoint_id() const {
  return std::max(window_->control(protocol::kCheckpointNext), ckpt_done_ + 1);
}

// A checkpoint that cannot be written (disk full, ...) is abandoned, not the job: the syncer
// hears of it, and the next one is tried at its time.
void LearnerCore::checkpoint_written(int64_t id, bool ok) {
  ckpt_done_ = std::max(ckpt_done_, id);
  window_->set_control(ok ? protocol::kCheckpointDone : protocol::kCheckpointFailed, id);
}

}  // namespace ddiloco::learner
