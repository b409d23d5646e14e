// What a unit's leader decides after each inner step — the core's decisions (learner_core.hpp)
// with the GPU's and the goodput books' part — and how the unit hears it. The leader alone
// reads and writes the window (sync_window.hpp), with local loads and stores that never block
// on the network; the rest of the unit follows its Actions.
#include "learner/learner.hpp"

namespace ddiloco::learner {

// The order matters: the leader publishes before it takes merges (a synchronous merge may
// need this step's snapshot), and decides the stop before the checkpoint it writes at a stop.
Actions Learner::decide(int64_t t, const StepStats& s, double step_s, bool non_finite) {
  LearnerCore& core = *core_;
  Actions actions(fragments_.size());
  core.report_progress(t, tokens_, step_s);
  if (topo_.isolated) publish_running_book();
  if (!core.faults().crash_pending(clock_.job_time())) core.answer_reads();  // a due crash answers when it lands
  if (gpu_) publish_landed();
  if (hooks_) hooks_->stall(core, t);
  publish_due(t, non_finite, actions);
  const bool crash_ready = core.take_merges(t, actions);  // a crash came due while waiting
  actions.stop = core.decide_stop(actions, t, ddp_.stop->agreed);
  if (!actions.stop) core.wait_if_budget_spent_alone(t);
  if (set_.checkpoints) {
    // ddp: the checkpoint the leaders agreed on (ddp_reducer.hpp), unless we wrote it already
    // (a unit that voted for it again after a crash; none should, see below).
    const int64_t agreed = ddp_.stop->agreed_want > core.checkpoint_done() ? ddp_.stop->agreed_want : 0;
    actions.checkpoint = core.decide_checkpoint(actions.stop, plan_.outer_steps ? core.requested_checkpoint() : agreed);
  }
  if (plan_.lr_on_job_clock) actions.schedule_step = core.schedule_step();
  core.decide_crash(actions, t, non_finite, crash_ready, s.loss, s.grad_norm);
  if (actions.crash) {
    if (core.crash_cause() == CrashCause::chaos) lose_unlanded(actions);
    actions.apply.clear();  // the unit starts over from Θ
    // ... and writes its file once it is back. ddp keeps its replica through the crash and
    // writes it now, at the step the leaders agreed on: the other units' files are of this
    // step, and a later one would make the checkpoint's units a step apart.
    if (plan_.outer_steps) actions.checkpoint = 0;
  } else if (gpu_ && (actions.stop || actions.checkpoint > 0)) {
    publish_all();  // the last snapshots reach the syncer; the checkpoint counts them sent
  }
  return actions;
}

// cuda: a chaos crash takes the snapshots still on their way to host memory with it.
void Learner::lose_unlanded(Actions& actions) {
  for (int p = 0; p < fragments_.size() && gpu_; ++p)
    if (work_[p].snap_meta) {  // never published: it dies with the unit
      actions.lost[p] = 1;
      work_[p].snap_meta.reset();
    }
}

// Isolated: the unit's time book as it would stand if this process died now, so that the
// syncer can book a killed process's time (its final book, written at the end, replaces it).
// The work no snapshot has carried to the syncer yet would die with it: discarded. The
// leader's book stands for every rank of the unit, which step together.
void Learner::publish_running_book() {
  TimeBook b = book_;
  for (int p = 0; p < fragments_.size() && set_.tracks_fragments; ++p)
    b.discarded += work_[p].unsent + (window_->outbox_free(p) ? 0.0 : work_[p].in_flight);
  b.allocated = clock_.startup_s + clock_.wall.seconds();
  const std::vector<double> v = b.to_vector();
  for (int i = 0; i < TimeBook::kFields; ++i)
    window_->set_control_f64(protocol::kTimeBook + i, v[i] * topo_.unit_size);
}

void Learner::broadcast(Actions& actions) {
  if (topo_.unit_size <= 1) return;
  auto words = actions.encode(fragments_.size());
  mpi::broadcast_patient(words, 0, topo_.unit_comm);
  actions = Actions::decode(words, fragments_.size());
}

}  // namespace ddiloco::learner
