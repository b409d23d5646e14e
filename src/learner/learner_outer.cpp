// The outer loop on a learner, carried out: snapshots of due fragments out to the syncer,
// merged fragments applied on every rank (docs/training.md "Learner units and the syncer"). What is due
// and when a merge applies is the core's (learner_core.hpp).
#include <algorithm>
#include <utility>

#include "learner/learner.hpp"

namespace ddiloco::learner {

void Learner::publish_due(int64_t t, bool non_finite, Actions& actions) {
  if (plan_.outer_steps) {
    for (int p : core_->due(t, non_finite)) publish(p, t, actions);
    for (int p = 0; p < fragments_.size(); ++p)
      if (std::exchange(work_[p].resend, false) && !actions.sent[p] && !non_finite) publish(p, t, actions);
  } else if (set_.unit == 0 && (t % set_.eval_period == 0 || t == core_->settings().max_steps)) {
    publish(0, t, actions);  // ddp: ship θ to the syncer for global evaluation
  }
}

// Leader: a snapshot of fragment p with its counters, when the core finds its outbox free.
void Learner::publish(int p, int64_t t, Actions& actions) {
  FragmentWork& w = work_[p];
  if (gpu_ && w.snap_meta) {  // p's last snapshot, H steps ago, has not landed yet (!)
    gpu_->wait_snapshot(p);
    publish_snapshot(p);
  }
  const std::optional<protocol::SnapshotMeta> meta = core_->claim_outbox(p, t, actions);
  if (!meta) return;
  if (hooks_ && hooks_->poison(trainer_.model().parameters(), t))
    trainer_.upload_state(false);  // cuda: the device's parameters turn NaN
  if (gpu_) {
    gpu_->start_snapshot(p);  // published once it lands (publish_landed)
    w.snap_meta = meta;
  } else {
    const std::span<float> packed(packed_.data(), layout_.numel(p));
    fragments_.pack(p, trainer_.model().parameters(), packed);
    core_->publish(p, packed, *meta);
  }
}

// cuda, leader: the snapshot of p has landed in pinned host memory.
void Learner::publish_snapshot(int p) {
  core_->publish(p, gpu_->snapshot(p), *work_[p].snap_meta);
  work_[p].snap_meta.reset();
}

// cuda, leader: at every step boundary; never waits.
void Learner::publish_landed() {
  for (int p = 0; p < fragments_.size(); ++p)
    if (work_[p].snap_meta && gpu_->snapshot_ready(p)) publish_snapshot(p);
}

// cuda, leader: before waiting for a merge, at a stop or checkpoint; may wait.
void Learner::publish_all() {
  for (int p = 0; p < fragments_.size(); ++p)
    if (work_[p].snap_meta) {
      gpu_->wait_snapshot(p);
      publish_snapshot(p);
    }
}

// Every rank: what the snapshots just published carry, for goodput and for carry.
void Learner::record_sends(const Actions& actions) {
  core_->record_sends(actions);
  for (int p = 0; p < fragments_.size() && plan_.outer_steps; ++p) {
    if (!actions.sent[p]) continue;
    FragmentWork& w = work_[p];
    w.in_flight = w.unsent;  // the work the snapshot just published carries
    w.unsent = 0;
    if (core_->settings().carry && gpu_)
      gpu_->download_fragment(p, w.sent_theta);
    else if (core_->settings().carry)
      fragments_.pack(p, trainer_.model().parameters(), w.sent_theta);
  }
}

// Every rank: θ_p takes the merged Θ_p at `version` as outer.apply says (docs/training.md).
void Learner::apply_merge(int p, int64_t version) {
  FragmentWork& w = work_[p];
  if (gpu_ && !set_.blend && !core_->settings().carry) {
    // overwrite: the leader staged the upload as it took the merge; NCCL-broadcast in the unit
    gpu_->apply_merge(p);
  } else {
    const std::span<float> theta = fragment_from_leader(p);
    if (set_.blend || core_->settings().carry) {
      const std::span<float> mine(packed_.data(), theta.size());
      if (gpu_)
        gpu_->download_fragment(p, mine);
      else
        fragments_.pack(p, trainer_.model().parameters(), mine);
      mix(theta, mine, w.sent_theta);
    }
    if (gpu_)
      gpu_->upload_fragment(p, theta);
    else
      fragments_.unpack(p, theta, trainer_.model().parameters());
  }
  // overwrite: the local work on this fragment since its snapshot left never reaches the
  // global model (blend keeps α of it); carry keeps it for the next snapshot.
  const double kept = core_->settings().carry ? 1.0 : set_.blend ? set_.alpha : 0.0;
  book_.discarded += (1.0 - kept) * w.unsent;
  w.unsent *= kept;
  core_->applied(p, version);
}

// outer.apply on the host, into `theta` (Θ_p on entry): blend θ_p ← α·θ_p + (1−α)·Θ_p; carry
// θ_p ← Θ_p + (θ_p − θ_p,sent), so the τ steps since the snapshot stay (`sent` empty: nothing
// to carry). `mine`: our θ_p.
void Learner::mix(std::span<float> theta, std::span<const float> mine, std::span<const float> sent) const {
  if (set_.blend)
    for (size_t i = 0; i < theta.size(); ++i) theta[i] = set_.alpha * mine[i] + (1 - set_.alpha) * theta[i];
  if (core_->settings().carry && !sent.empty())
    for (size_t i = 0; i < theta.size(); ++i) theta[i] += mine[i] - sent[i];
}

// Fragment p of the Θ the leader took from its inbox, on every rank of the unit.
std::span<float> Learner::fragment_from_leader(int p) {
  std::span<float> buf(incoming_.data(), layout_.numel(p));
  if (topo_.leader) std::ranges::copy(core_->fragment(p).pending, buf.begin());
  if (topo_.unit_size > 1) mpi::broadcast(buf, 0, topo_.unit_comm);
  return buf;
}

}  // namespace ddiloco::learner
