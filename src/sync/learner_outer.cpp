// The outer loop on a learner: snapshots of due fragments out to the syncer, merged fragments
// in, applied τ steps after our own snapshot left (README "Learner units and the syncer").
#include "sync/learner.hpp"

#include <algorithm>

#include "ddiloco/error.hpp"

namespace ddiloco {

void Learner::publish_due(int64_t t, bool non_finite, Actions& actions) {
  if (plan_.outer_steps) {
    if (!non_finite)  // poisoned parameters are never published
      for (int p : fragments_.due_after(t)) publish(p, t, actions);
  } else if (u_ == 0 && (t % eval_period_ == 0 || t == max_steps_)) {
    publish(0, t, actions);  // ddp: ship θ to the syncer for global evaluation
  }
}

// Leader: a snapshot of fragment p with its counters. Flow control: the outbox is written only
// once the syncer consumed the previous snapshot; otherwise the publish is skipped and counted,
// and the counters keep growing for the next one.
void Learner::publish(int p, int64_t t, Actions& actions) {
  FragmentState& f = frag_[p];
  if (gpu_ && f.snap_meta) {  // p's last snapshot, H steps ago, has not landed yet (!)
    gpu_->wait_snapshot(p);
    publish_snapshot(p);
  }
  if (!window_->outbox_free(p)) {  // the syncer has not read the previous one yet
    window_->set_control(sync::kPublishSkipped, ++skipped_);
    return;
  }
  nan_hook(t);
  const sync::SnapshotMeta meta{f.c_steps, f.c_tok, t, f.applied};
  if (gpu_) {
    gpu_->start_snapshot(p);  // published once it lands (publish_landed)
    f.snap_meta = meta;
  } else {
    const std::span<float> packed(packed_.data(), layout_.numel(p));
    fragments_.pack(p, trainer_.model().parameters(), packed);
    f.last_seq = f.seq_base + window_->publish(p, packed, meta);
  }
  f.sent_step = t;
  ++f.sends;
  actions.sent[p] = 1;
}

// cuda, leader: the snapshot of p has landed in pinned host memory.
void Learner::publish_snapshot(int p) {
  FragmentState& f = frag_[p];
  f.last_seq = f.seq_base + window_->publish(p, gpu_->snapshot(p), *f.snap_meta);
  f.snap_meta.reset();
}

// cuda, leader: at every step boundary; never waits.
void Learner::publish_landed() {
  for (int p = 0; p < P_; ++p)
    if (frag_[p].snap_meta && gpu_->snapshot_ready(p)) publish_snapshot(p);
}

// cuda, leader: before waiting for a merge, at a stop or checkpoint; may wait.
void Learner::publish_all() {
  for (int p = 0; p < P_; ++p)
    if (frag_[p].snap_meta) {
      gpu_->wait_snapshot(p);
      publish_snapshot(p);
    }
}

// Leader: takes a newer merged Θ_p out of the inbox, so that the syncer can deliver the next.
void Learner::take(int p) {
  FragmentState& f = frag_[p];
  const int64_t v = window_->inbox_version(p);
  if (v <= f.pending_version) return;
  if (!window_->take_inbox(p, f.pending))
    fail("unit {}: merged fragment {} version {} failed its checksum", u_, p, v);
  f.pending_version = v;
  f.pending_epoch = window_->control(sync::kSyncerEpoch);
  if (gpu_overwrite_) gpu_->stage_merge(p, f.pending);  // to the device while we train
}

// Leader: takes what has arrived and lists the merges due now in `actions`, waiting for them
// where the mode requires. Returns true when a crash came due while waiting (taken this step).
//
// A merged fragment is applied τ steps after this unit sent its own snapshot of it, never in
// between: applying a merge before our snapshot left would discard the local progress it
// carries. (Decoupled: the newest merge then, whether or not it includes ours; ours is merged
// later, with its staleness.)
bool Learner::take_merges(int64_t t, Actions& actions) {
  bool crash_ready = false;
  for (int p = 0; p < P_ && plan_.outer_steps; ++p) {
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

// Leader, synchronous modes, decoupled with τ = 0 and every mode in the warm-up: waits
// (beating) for the merge owed on p.
bool Learner::wait_for_merge(int p, bool crash_ready) {
  const FragmentState& f = frag_[p];
  // Synchronous modes: every merge includes every unit, so the merge of our k-th snapshot is
  // version k. Decoupled with τ = 0: any merge newer than ours.
  const int64_t want = plan_.every_merge_has_all ? f.sends : f.applied + 1;
  // The merge may need our own snapshot, still on its way to host memory.
  if (gpu_ && f.pending_version < want) publish_all();
  // A crash due meanwhile happens on time: a unit that waits can fail too. A restarted syncer
  // never sends the merge we wait for (it holds deliveries until we rejoin): we start over.
  while (f.pending_version < want && !stop_requested() && !crash_ready && !syncer_restarted()) {
    if ((crash_ready = crash_now())) break;
    backoff_.idle();
    take(p);
    beat();  // alive while waiting
  }
  backoff_.reset();
  return crash_ready;
}

// Every rank: what the snapshots just published carry, for goodput and for carry.
void Learner::record_sends(const Actions& actions) {
  for (int p = 0; p < P_ && plan_.outer_steps; ++p) {
    if (!actions.sent[p]) continue;
    FragmentState& f = frag_[p];
    f.in_flight = f.unsent;  // the work the snapshot just published carries
    f.unsent = 0;
    f.sent_c_steps = f.c_steps;
    f.sent_c_tok = f.c_tok;
    if (carry_ && gpu_)
      gpu_->download_fragment(p, f.sent_theta);
    else if (carry_)
      fragments_.pack(p, trainer_.model().parameters(), f.sent_theta);
  }
}

void Learner::apply_merges(const Actions& actions) {
  for (const auto& [p, version] : actions.apply) apply_merge(p, version);
}

// Every rank: θ_p takes the merged Θ_p at `version` as outer.apply says (README).
void Learner::apply_merge(int p, int64_t version) {
  FragmentState& f = frag_[p];
  if (gpu_overwrite_) {
    gpu_->apply_merge(p);  // the leader's staged upload, NCCL-broadcast in the unit
  } else {
    const std::span<float> theta = fragment_from_leader(p);
    if (blend_ || carry_) {
      const std::span<float> mine(packed_.data(), theta.size());
      if (gpu_)
        gpu_->download_fragment(p, mine);
      else
        fragments_.pack(p, trainer_.model().parameters(), mine);
      mix(theta, mine, f.sent_theta);
    }
    if (gpu_)
      gpu_->upload_fragment(p, theta);
    else
      fragments_.unpack(p, theta, trainer_.model().parameters());
  }
  // overwrite: the local work on this fragment since its snapshot left never reaches the
  // global model (blend keeps α of it); carry keeps it for the next snapshot, which then
  // counts the steps and tokens since this one, not since the apply.
  const double kept = carry_ ? 1.0 : blend_ ? alpha_ : 0.0;
  book_.discarded += (1.0 - kept) * f.unsent;
  f.unsent *= kept;
  f.count_from_merge(carry_, f.sent_c_steps, f.sent_c_tok);
  f.applied = version;
  f.sent_step = -1;
}

// outer.apply on the host, into `theta` (Θ_p on entry): blend θ_p ← α·θ_p + (1−α)·Θ_p; carry
// θ_p ← Θ_p + (θ_p − θ_p,sent), so the τ steps since the snapshot stay (`sent` empty: nothing
// to carry). `mine`: our θ_p.
void Learner::mix(std::span<float> theta, std::span<const float> mine, std::span<const float> sent) const {
  if (blend_)
    for (size_t i = 0; i < theta.size(); ++i) theta[i] = alpha_ * mine[i] + (1 - alpha_) * theta[i];
  if (carry_ && !sent.empty())
    for (size_t i = 0; i < theta.size(); ++i) theta[i] += mine[i] - sent[i];
}

// Fragment p of the Θ the leader took from its inbox, on every rank of the unit.
std::span<float> Learner::fragment_from_leader(int p) {
  std::span<float> buf(incoming_.data(), layout_.numel(p));
  if (topo_.leader) std::copy(frag_[p].pending.begin(), frag_[p].pending.end(), buf.begin());
  if (topo_.unit_size > 1) mpi::broadcast(buf, 0, topo_.unit_comm);
  return buf;
}

}  // namespace ddiloco
