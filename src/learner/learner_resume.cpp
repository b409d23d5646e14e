// A learner resumed from a checkpoint (checkpoint.hpp), and the wire format's references
// (sync_window.hpp) both sides must start from.
#include <algorithm>

#include "learner/learner.hpp"

namespace ddiloco::learner {

// The syncer's part of a checkpoint is newer than every unit's: for each fragment, the
// syncer's merged_seq says whether Θ_p already holds our last snapshot (or a later one, sent
// after our file was written). Then Θ_p is applied as the merge of that snapshot would have
// been; otherwise our θ_p and its counters are kept, and the next snapshot carries that
// progress (decoupled and streaming send it at once, in place of a snapshot never merged).
// Snapshots and merges in flight at the checkpoint are thereby accounted for, and every unit
// resumes holding Θ at the syncer's versions.
void Learner::resume_from_checkpoint() {
  const checkpoint::UnitState& st = resume_->unit;
  const checkpoint::SyncerState& sy = resume_->syncer;
  auto params = trainer_.model().parameters();
  if (st.lost) {
    std::copy(sy.theta.begin(), sy.theta.end(), params.begin());
    trainer_.optimizer().reset();
  } else {
    std::copy(st.params.begin(), st.params.end(), params.begin());
    trainer_.set_moments(st.adam_m, st.adam_v, st.adam_step);  // units.zero = 1: this rank's shard
  }
  trainer_.set_steps_done(st.step);
  if (plan_.lr_on_job_clock) trainer_.set_schedule_step(st.schedule_step);
  trainer_.data()->seek(st.cursors[topo_.unit_rank]);
  tokens_ = st.tokens;
  since_log_.loss = st.log_loss_sum;
  since_log_.steps = st.log_steps;
  core_->resumed(st.rejoins);
  first_step_ = st.step + 1;
  for (int p = 0; p < fragments_.size(); ++p) resume_fragment(p, params);
  trainer_.upload_state();  // cuda: the device trains from the resumed state
  if (topo_.leader) {
    window_->set_control(protocol::kStepsDone, st.step);
    window_->set_control(protocol::kTokensDone, tokens_);
    log_.write({{"event", "resume"}, {"unit", set_.unit}, {"step", st.step}, {"tokens", tokens_},
                {"path", resume_->dir.string()}, {"lost", st.lost}, {"elapsed_s", 0.0}});
  }
}

// Fragment p of `params` and its state, as the comment above says.
void Learner::resume_fragment(int p, std::span<float> params) {
  const checkpoint::UnitState& st = resume_->unit;
  const checkpoint::SyncerState& sy = resume_->syncer;
  FragmentState& f = core_->fragment(p);
  const int64_t merged = sy.merged_seq[static_cast<size_t>(set_.unit) * fragments_.size() + p];
  const bool was_sent = st.sent_step[p] >= 0;
  std::span<float> theta(incoming_.data(), layout_.numel(p));
  fragments_.pack(p, sy.theta, theta);
  f.c_steps = st.c_steps[p];
  f.c_tok = st.c_tok[p];
  if (st.lost || merged > st.last_seq[p]) {
    fragments_.unpack(p, theta, params);  // Θ_p holds all of our progress
    f.c_steps = f.c_tok = 0;
  } else if (was_sent && merged == st.last_seq[p]) {
    std::span<float> mine(packed_.data(), theta.size());
    fragments_.pack(p, params, mine);
    const bool has_sent_theta = st.sent_theta.size() == static_cast<size_t>(fragments_.size());
    mix(theta, mine, has_sent_theta ? std::span<const float>(st.sent_theta[p]) : std::span<const float>());
    fragments_.unpack(p, theta, params);
    f.count_from_merge(core_->settings().carry, st.sent_c_steps[p], st.sent_c_tok[p]);
  } else if (was_sent && !plan_.stops_on_named_round) {
    // Stopped by a signal with this snapshot short of a quorum (SyncerCore::set_stopping;
    // diloco stops on a round every unit ends, with nothing in flight): a unit that resumes
    // behind us will wait for a merge that needs it.
    work_[p].resend = true;
  }
  f.fit_counters(config_.unit_tokens_per_step(set_.unit));
  f.applied = f.pending_version = f.sends = sy.versions[p];
  // The leader holds Θ_p at that version, as if taken from its inbox (what it offers a
  // restarted syncer).
  if (topo_.leader) fragments_.pack(p, sy.theta, f.pending);
  // Above every number either side has used (the syncer computes the same).
  f.last_seq = f.seq_base = std::max(st.last_seq[p], merged);
  if (topo_.leader) window_->set_inbox_taken(p, sy.versions[p]);
}

// The wire format's references (sync_window.hpp): Θ₀, the common initialisation; or, on
// resume, the one in our file when it is at the checkpoint's version, else the checkpoint's
// Θ (checkpoint::has_reference; the syncer applies the same rule to the same file).
// The isolated deployment shares none: a unit process joins by taking Θ raw (join()).
void Learner::set_wire_references() {
  if (!topo_.leader || !plan_.outer_steps || topo_.isolated) return;
  for (int p = 0; p < fragments_.size(); ++p) {
    std::span<float> theta(incoming_.data(), layout_.numel(p));
    if (resume_ && checkpoint::has_reference(resume_->unit, p, resume_->syncer.versions[p])) {
      window_->set_reference(p, resume_->syncer.versions[p], resume_->unit.wire_ref[p]);
      if (static_cast<size_t>(p) < resume_->unit.wire_residual.size())
        window_->set_residual(p, resume_->unit.wire_residual[p]);
      continue;
    }
    fragments_.pack(p, resume_ ? std::span<const float>(resume_->syncer.theta) : trainer_.model().parameters(),
                    theta);
    window_->set_reference(p, resume_ ? resume_->syncer.versions[p] : 0, theta);
  }
}

}  // namespace ddiloco::learner
