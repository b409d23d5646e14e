// Faults on a learner, carried out on every rank (docs/faults.md "Faults, rejoin and goodput"): a
// crash the core decided (chaos, a diverged step, a restarted syncer) ends in a rejoin from
// the syncer's Θ; the isolated deployment's join is a rejoin with nothing lost.
#include <algorithm>
#include <limits>

#include "learner/learner.hpp"

namespace ddiloco::learner {

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
  std::vector<int64_t> words(1 + fragments_.size(), 0);  // [stop, versions fetched...]
  if (topo_.leader) {
    core_->forget_syncer_restart();
    words[0] = !core_->go_down(a, t, joining);
    if (plan_.outer_steps && !words[0]) core_->fetch_theta(words);
  }
  if (topo_.unit_size > 1) mpi::broadcast_patient(words, 0, topo_.unit_comm);
  if (words[0]) return false;
  if (plan_.outer_steps) start_over_from(words);
  // diloco counts rounds in steps: every unit's k-th snapshot is its step k·H (P = 1; after a
  // warm-up of W steps synchronised every step, W + (k − W)·H). A unit back from a crash
  // redoes, from the Θ it fetched (round words[1]), the steps of the round it lost, so that
  // its snapshots and its last step stay in line with the others'.
  const int64_t crashed_at = t;
  if (plan_.redoes_lost_round) {
    t = fragments_.step_of_sync(0, words[1]);
    trainer_.set_steps_done(t);  // the learning rate follows the round too
  }
  if (topo_.leader) {
    nlohmann::json versions(std::vector<int64_t>(words.begin() + 1, words.end()));
    log_event({{"event", joining ? "join" : "rejoin"}, {"step", t}, {"versions", versions},
               {"steps_redone", crashed_at - t}});
  }
  return true;
}

// The work no snapshot carried away dies with the crash, and so does the work in a snapshot
// the syncer had not read; then the parameters and optimizer state are gone.
void Learner::drop_unsent_work(const Actions& a) {
  for (int p = 0; p < fragments_.size() && set_.tracks_fragments; ++p) {
    FragmentWork& w = work_[p];
    book_.discarded += w.unsent + (a.lost[p] ? w.in_flight : 0.0);
    w.unsent = w.in_flight = 0;
  }
  // A restarted syncer took nothing of our memory: θ is replaced by its Θ when we start over,
  // and the moments stay, as over any merge (on a GPU the host holds no current copy of them).
  // (Every rank hears it in the actions, so that the unit's replicas keep the same moments.)
  const bool memory_intact = a.keep_memory && !gpu_;
  if (plan_.outer_steps && !memory_intact) {
    const auto params = trainer_.model().parameters();
    std::fill(params.begin(), params.end(), std::numeric_limits<float>::quiet_NaN());
    trainer_.optimizer().reset();
  }
}

// Every rank: θ ← the Θ fetched, at the versions in words[1..].
void Learner::start_over_from(const std::vector<int64_t>& words) {
  for (int p = 0; p < fragments_.size(); ++p)
    fragments_.unpack(p, fragment_from_leader(p), trainer_.model().parameters());
  core_->started_over(words);
  trainer_.upload_state();  // cuda: Θ and the fresh (zero) moments to the device
}

// The isolated deployment: a new process of the unit (not resumed from a checkpoint) starts
// from the syncer's Θ.
void Learner::join() {
  if (!topo_.isolated || !plan_.outer_steps || resume_) return;
  Stopwatch join_clock;
  int64_t t0 = first_step_ - 1;
  stopped_down_ = !crash_and_rejoin(Actions(fragments_.size()), t0, /*joining=*/true);
  first_step_ = t0 + 1;
  (sync_link_.restart > 0 ? book_.down : book_.other) += join_clock.seconds();
}

}  // namespace ddiloco::learner
