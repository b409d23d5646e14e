// What a unit's leader decides after each inner step, and how the unit hears it. The leader
// alone reads and writes the window (sync_window.hpp), with local loads and stores that never
// block on the network; the rest of the unit follows its Actions.
#include "sync/learner.hpp"

#include "ddiloco/signals.hpp"

namespace ddiloco {

// The order matters: the leader publishes before it takes merges (a synchronous merge may
// need this step's snapshot), and decides the stop before the checkpoint it writes at a stop.
Actions Learner::decide(int64_t t, const StepStats& s, double step_s, bool non_finite) {
  Actions actions(P_);
  report_progress(t, step_s);
  if (!faults_.crash_pending(job_time())) answer_reads();  // a due crash answers when it lands
  if (gpu_) publish_landed();
  stall_hook(t);
  publish_due(t, non_finite, actions);
  settle_offer();
  const bool crash_ready = take_merges(t, actions);  // a crash came due while waiting
  actions.stop = decide_stop(actions, t);
  if (!actions.stop) wait_if_budget_spent_alone(t);
  if (checkpoints_) actions.checkpoint = decide_checkpoint(actions.stop);
  if (plan_.lr_on_job_clock)
    actions.schedule_step = window_->control(sync::kJobTokens) / job_step_tokens_;
  decide_crash(actions, t, s, non_finite, crash_ready);
  if (actions.crash) {
    actions.apply.clear();  // the unit starts over from Θ
    actions.checkpoint = 0;  // ... and writes its file once it is back
  } else if (gpu_ && (actions.stop || actions.checkpoint > 0)) {
    publish_all();  // the last snapshots reach the syncer; the checkpoint counts them sent
  }
  return actions;
}

// What the syncer reads of us every poll: alive, how far, how fast (its grace window and
// liveness timeout scale with our step time).
void Learner::report_progress(int64_t t, double step_s) {
  step_ema_ = step_ema_ == 0 ? step_s : 0.9 * step_ema_ + 0.1 * step_s;
  beat();
  window_->set_control(sync::kStepsDone, t);
  window_->set_control(sync::kTokensDone, tokens_);
  window_->set_control(sync::kStepTimeNs, static_cast<int64_t>(step_ema_ * 1e9));
  if (topo_.isolated) publish_running_book();
}

// Isolated: the unit's time book as it would stand if this process died now, so that the
// syncer can book a killed process's time (its final book, written at the end, replaces it).
// The work no snapshot has carried to the syncer yet would die with it: discarded. The
// leader's book stands for every rank of the unit, which step together.
void Learner::publish_running_book() {
  TimeBook b = book_;
  for (int p = 0; p < P_ && tracks_fragments_; ++p)
    b.discarded += frag_[p].unsent + (window_->outbox_free(p) ? 0.0 : frag_[p].in_flight);
  b.allocated = startup_s_ + wall_.seconds();
  const std::vector<double> v = b.to_vector();
  for (int i = 0; i < TimeBook::kFields; ++i)
    window_->set_control_f64(sync::kTimeBook + i, v[i] * topo_.unit_size);
}

bool Learner::decide_stop(const Actions& actions, int64_t t) {
  bool stop = (plan_.outer_steps ? stop_requested() : ddp_stop_->agreed) || t >= max_steps_;
  // diloco stops on the round the syncer named, so that every unit ends on the same merge.
  if (const int64_t last_round = window_->control(sync::kStopAfterVersion); last_round > 0) {
    int64_t round = frag_[0].applied;  // diloco (P = 1): the round this step ends on
    for (const auto& [p, version] : actions.apply) round = std::max(round, version);
    stop |= round >= last_round;
  }
  return stop;
}

// Leader, decoupled, isolated: with no syncer to count the job's tokens, the unit counts them
// itself from the last count the syncer published (kJobTokens), as if every unit stepped as
// fast as it does; once that reaches the budget it trains no further and waits (beating) for
// a syncer to come back and say stop. Without this, units whose syncer died near the end of
// the budget would train past it for as long as it is away.
void Learner::wait_if_budget_spent_alone(int64_t t) {
  if (!plan_.stops_on_token_budget || !sync_link_.syncer_present) return;
  if (const int64_t job = window_->control(sync::kJobTokens); job != job_tokens_seen_) {
    job_tokens_seen_ = job;
    job_tokens_step_ = t;
  }
  const int64_t estimate = job_tokens_seen_ + (t - job_tokens_step_) * job_step_tokens_;
  // Alone: no syncer, or a restarted one that has not taken our offer yet (it is recovering,
  // and cannot count the job's tokens before). A syncer that admits us meanwhile ends the wait:
  // it needs our offer (decide_crash), and so does one told to start over.
  auto alone = [&] {
    settle_offer();
    return (!sync_link_.syncer_present() || offering_) && !syncer_restarted() && !start_over_asked();
  };
  if (estimate < config_.token_budget() || !alone()) return;
  log_.write({{"event", "budget_spent_alone"}, {"unit", u_}, {"step", t}, {"job_tokens_estimate", estimate},
              {"elapsed_s", wall_.seconds()}});
  while (alone() && !stop_requested()) {
    beat();
    backoff_.idle();
  }
  backoff_.reset();
}

void Learner::broadcast(Actions& actions) {
  if (topo_.unit_size <= 1) return;
  auto words = actions.encode(P_);
  mpi::broadcast_patient(words, 0, topo_.unit_comm);
  actions = Actions::decode(words, P_);
}

// Told to stop: by the syncer (token budget, or it was interrupted) or by a signal. In one job
// a signal reaches every rank (scancel, requeue) and the job stops as one: a diloco unit that
// receives it tells the syncer, which names the round every unit ends on. In the isolated
// deployment a signal is this unit's own (its Slurm task requeued, its node drained): it
// stops alone, the syncer loses it and merges on, whatever the mode.
bool Learner::stop_requested() {
  if (stop_signal() != 0) window_->set_control(sync::kSignal, stop_signal());
  const bool alone = topo_.isolated || !plan_.stops_on_named_round;
  return window_->control(sync::kStop) != 0 || (stop_signal() != 0 && alone);
}

// Alive: only a crashed or hung process stops its heartbeat, so every wait beats too.
void Learner::beat() { window_->set_control(sync::kHeartbeat, window_->control(sync::kHeartbeat) + 1); }

}  // namespace ddiloco
