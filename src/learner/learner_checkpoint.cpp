// This unit's part of a checkpoint (checkpoint.hpp, docs/checkpoints.md "Checkpoints and resume"). The
// syncer coordinates: it asks every unit for checkpoint N (kCheckpointWant); each leader
// writes unit_<u>.h5 into N's directory at its next step boundary and says so
// (kCheckpointDone, or kCheckpointFailed); once every unit has (a silent one is not waited
// for: its newest file is linked in), the syncer writes its own file and the manifest.
#include <algorithm>
#include <cstdio>

#include "learner/learner.hpp"

namespace ddiloco::learner {

// Writes this unit's file of checkpoint `id` (collective over the unit: the leader gathers
// every rank's data cursor). `lost`: the unit is down after a crash and has no parameters.
// `stopping`: the unit's last file; when the syncer completed `id` without it meanwhile (it
// was silent), it goes into the next checkpoint, the one the syncer completes at the end.
void Learner::write_checkpoint(int64_t id, int64_t t, bool lost, bool stopping) {
  const DataCursor mine = trainer_.data()->cursor();
  std::vector<int64_t> cursor = {mine.epoch, mine.batch}, all(2 * static_cast<size_t>(topo_.unit_size));
  mpi::check(MPI_Gather(cursor.data(), 2, MPI_INT64_T, all.data(), 2, MPI_INT64_T, 0, topo_.unit_comm),
             "Gather(data cursor)");
  // AdamW's state, gathered from every rank's shard with units.zero = 1 (collective).
  UnitTrainer::Moments moments = lost ? UnitTrainer::Moments{} : trainer_.gather_moments();
  if (!topo_.leader) return;
  Stopwatch clock;
  checkpoint::UnitState st = unit_state(t, lost, std::move(moments));
  for (int r = 0; r < topo_.unit_size; ++r) st.cursors.push_back({all[2 * r], all[2 * r + 1]});
  bool written = false;
  try {
    for (int attempt = 0; attempt < (stopping ? 2 : 1) && !written; ++attempt, ++id) {
      st.id = id;
      const std::filesystem::path dir = checkpoint::directory(set_.ckpt_root, id);
      std::filesystem::create_directories(dir);
      // False: too late, the syncer completed this checkpoint with our previous file.
      written = checkpoint::write_unit(dir, st);
    }
    id = st.id;
  } catch (const std::exception& e) {
    // A checkpoint that cannot be written (disk full, ...) is abandoned, not the job.
    std::fprintf(stderr, "ddiloco: warning: unit %d: checkpoint %lld not written: %s\n", set_.unit,
                 static_cast<long long>(st.id), e.what());
    log_event({{"event", "checkpoint_failed"}, {"id", st.id}, {"error", e.what()}, {"step", t}});
    core_->checkpoint_written(st.id, false);
    return;
  }
  core_->checkpoint_written(id, true);
  log_event({{"event", "checkpoint"}, {"id", id}, {"step", t}, {"lost", lost}, {"written", written},
             {"write_s", clock.seconds()}});
}

// Leader: what the unit's file holds, but for its id and the data cursors.
checkpoint::UnitState Learner::unit_state(int64_t t, bool lost, UnitTrainer::Moments moments) {
  checkpoint::UnitState st;
  st.unit = set_.unit;
  st.model = config_.model;
  st.lost = lost;
  st.step = t;
  st.tokens = tokens_;
  st.schedule_step = trainer_.schedule_step();
  st.rejoins = core_->rejoins();
  st.run_seed = config_.run.seed;
  // The losses since the last train event: a resumed unit logs the same means. At a log step
  // the step's train event closes the interval (after this file, in after_step): a unit
  // resumed from here starts a new one, as the straight run does.
  const bool logs_now = config_.run.log_every > 0 && t % config_.run.log_every == 0;
  st.log_loss_sum = logs_now ? 0.0 : since_log_.loss;
  st.log_steps = logs_now ? 0 : since_log_.steps;
  if (!lost) {
    // (gather_moments downloaded the device's parameters and moments with cuda)
    const auto params = trainer_.model().parameters();
    st.params.assign(params.begin(), params.end());
    st.adam_m = std::move(moments.m);
    st.adam_v = std::move(moments.v);
    st.adam_step = moments.step;
  }
  for (int p = 0; p < fragments_.size(); ++p) {
    const FragmentState& f = core_->fragment(p);
    st.c_steps.push_back(f.c_steps);
    st.c_tok.push_back(f.c_tok);
    st.sent_step.push_back(f.sent_step);
    st.last_seq.push_back(f.last_seq);
    st.sent_c_steps.push_back(f.sent_c_steps);
    st.sent_c_tok.push_back(f.sent_c_tok);
    if (core_->settings().carry) st.sent_theta.push_back(work_[p].sent_theta);
  }
  if (layout_.format() != wire::Format::fp32)
    for (int p = 0; p < fragments_.size(); ++p) {
      st.wire_ref_version.push_back(window_->reference_version(p));
      const auto r = window_->reference(p);
      st.wire_ref.emplace_back(r.begin(), r.end());
      const auto e = window_->residual(p);
      st.wire_residual.emplace_back(e.begin(), e.end());
    }
  return st;
}

// Stopped while down after a crash: the unit's file says it is lost, and a resumed unit starts
// from Θ (collective over the unit, like write_checkpoint); ddp's holds the replica it kept.
void Learner::checkpoint_while_down() {
  int64_t id = 0;
  if (topo_.leader) id = core_->decide_checkpoint(true, core_->requested_checkpoint());
  if (topo_.unit_size > 1) mpi::check(MPI_Bcast(&id, 1, MPI_INT64_T, 0, topo_.unit_comm), "Bcast(checkpoint)");
  // ddp keeps its replica while down (learner_faults.cpp): its file holds it.
  if (id > 0) write_checkpoint(id, trainer_.steps_done(), /*lost=*/plan_.outer_steps, true);
}

}  // namespace ddiloco::learner
