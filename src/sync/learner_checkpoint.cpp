// This unit's part of a checkpoint (checkpoint.hpp, README "Checkpoints and resume"). The
// syncer coordinates: it asks every unit for checkpoint N (kCheckpointWant); each leader
// writes unit_<u>.h5 into N's directory at its next step boundary and says so
// (kCheckpointDone, or kCheckpointFailed); once every unit has (a silent one is not waited
// for: its newest file is linked in), the syncer writes its own file and the manifest.
#include <algorithm>
#include <cstdio>

#include "sync/learner.hpp"

namespace ddiloco {

// Leader: the checkpoint whose unit file the unit writes after this step (0: none). When asked
// for, and when the job stops (the syncer then completes that checkpoint once every unit has
// stopped).
int64_t Learner::decide_checkpoint(bool stop) {
  const int64_t want = window_->control(sync::kCheckpointWant);
  if (stop && (config_.checkpoint.at_stop || want > ckpt_done_)) return next_checkpoint_id();
  return want > ckpt_done_ ? want : 0;
}

// Leader: a checkpoint of our own at a stop: the next the syncer will complete.
int64_t Learner::next_checkpoint_id() const {
  return std::max(window_->control(sync::kCheckpointNext), ckpt_done_ + 1);
}

// Writes this unit's file of checkpoint `id` (collective over the unit: the leader gathers
// every rank's data cursor). `lost`: the unit is down after a crash and has no parameters.
// `stopping`: the unit's last file; when the syncer completed `id` without it meanwhile (it
// was silent), it goes into the next checkpoint, the one the syncer completes at the end.
void Learner::write_checkpoint(int64_t id, int64_t t, bool lost, bool stopping) {
  const DataCursor mine = trainer_.data()->cursor();
  std::vector<int64_t> cursor = {mine.epoch, mine.batch}, all(2 * static_cast<size_t>(topo_.unit_size));
  mpi::check(MPI_Gather(cursor.data(), 2, MPI_INT64_T, all.data(), 2, MPI_INT64_T, 0, topo_.unit_comm),
             "Gather(data cursor)");
  if (!topo_.leader) return;
  Stopwatch clock;
  checkpoint::UnitState st = unit_state(t, lost);
  for (int r = 0; r < topo_.unit_size; ++r) st.cursors.push_back({all[2 * r], all[2 * r + 1]});
  bool written = false;
  try {
    for (int attempt = 0; attempt < (stopping ? 2 : 1) && !written; ++attempt, ++id) {
      st.id = id;
      ckpt_done_ = id;
      const std::filesystem::path dir = checkpoint::directory(ckpt_root_, id);
      std::filesystem::create_directories(dir);
      // False: too late, the syncer completed this checkpoint with our previous file.
      written = checkpoint::write_unit(dir, st);
    }
    id = ckpt_done_;
  } catch (const std::exception& e) {
    // A checkpoint that cannot be written (disk full, ...) is abandoned, not the job: the
    // syncer hears of it, and the next one is tried at its time.
    std::fprintf(stderr, "ddiloco: warning: unit %d: checkpoint %lld not written: %s\n", u_,
                 static_cast<long long>(id), e.what());
    log_.write({{"event", "checkpoint_failed"}, {"unit", u_}, {"id", id}, {"error", e.what()},
                {"step", t}, {"tokens", tokens_}, {"elapsed_s", wall_.seconds()}});
    window_->set_control(sync::kCheckpointFailed, id);
    return;
  }
  window_->set_control(sync::kCheckpointDone, id);
  log_.write({{"event", "checkpoint"}, {"unit", u_}, {"id", id}, {"step", t}, {"tokens", tokens_},
              {"lost", lost}, {"written", written}, {"write_s", clock.seconds()},
              {"elapsed_s", wall_.seconds()}});
}

// Leader: what the unit's file holds, but for its id and the data cursors.
checkpoint::UnitState Learner::unit_state(int64_t t, bool lost) {
  checkpoint::UnitState st;
  st.unit = u_;
  st.model = config_.model;
  st.lost = lost;
  st.step = t;
  st.tokens = tokens_;
  st.schedule_step = trainer_.schedule_step();
  st.rejoins = rejoins_;
  st.run_seed = config_.run.seed;
  if (!lost) {
    trainer_.download_state();  // cuda: the device's parameters and AdamW moments
    auto copy = [](std::span<const float> x) { return std::vector<float>(x.begin(), x.end()); };
    st.params = copy(trainer_.model().parameters());
    st.adam_m = copy(trainer_.optimizer().first_moment());
    st.adam_v = copy(trainer_.optimizer().second_moment());
    st.adam_step = trainer_.optimizer().step_count();
  }
  for (const FragmentState& f : frag_) {
    st.c_steps.push_back(f.c_steps);
    st.c_tok.push_back(f.c_tok);
    st.sent_step.push_back(f.sent_step);
    st.last_seq.push_back(f.last_seq);
    st.sent_c_steps.push_back(f.sent_c_steps);
    st.sent_c_tok.push_back(f.sent_c_tok);
    if (carry_) st.sent_theta.push_back(f.sent_theta);
  }
  if (layout_.format() != wire::Format::fp32)
    for (int p = 0; p < P_; ++p) {
      st.wire_ref_version.push_back(window_->reference_version(p));
      const auto r = window_->reference(p);
      st.wire_ref.emplace_back(r.begin(), r.end());
      const auto e = window_->residual(p);
      st.wire_residual.emplace_back(e.begin(), e.end());
    }
  return st;
}

// Stopped while down after a crash: the unit's file says it is lost, and a resumed unit starts
// from Θ (collective over the unit, like write_checkpoint).
void Learner::checkpoint_while_down() {
  int64_t id = 0;
  if (topo_.leader && (config_.checkpoint.at_stop || window_->control(sync::kCheckpointWant) > ckpt_done_))
    id = next_checkpoint_id();
  if (topo_.unit_size > 1) mpi::check(MPI_Bcast(&id, 1, MPI_INT64_T, 0, topo_.unit_comm), "Bcast(checkpoint)");
  if (id > 0) write_checkpoint(id, trainer_.steps_done(), true, true);
}

}  // namespace ddiloco
