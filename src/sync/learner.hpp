// A learner rank in a multi-unit job (run_learner in runtime.hpp is its public entry point):
// inner steps as in a single unit, plus the outer loop — counters per fragment, publishing
// snapshots when due, applying merged fragments τ steps after sending (docs/algorithm.md,
// "Learner, every inner step").
//
// Every rank of a unit runs one Learner. The unit's leader (local rank 0) alone talks to the
// syncer through its window (sync_window.hpp); after each inner step it decides what the
// unit does (Actions) and broadcasts it, so that every rank's replica stays identical. Each
// rank's wall time is booked by category for goodput (goodput.hpp).
//
// The member functions live in one file per concern:
//   learner.cpp             construction, the step loop, the end of the run
//   learner_leader.cpp      what the leader decides after each step
//   learner_outer.cpp       publishing snapshots, taking and applying merged fragments
//   learner_faults.cpp      crashes, rejoins, the isolated deployment's join, test hooks
//   learner_checkpoint.cpp  this unit's part of a checkpoint
//   learner_resume.cpp      resuming from a checkpoint, the wire format's references
// and, apart: learner_actions.{hpp,cpp} (the leader's instructions and their encoding) and
// ddp_reducer.{hpp,cpp} (ddp's gradient all-reduce across units).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "ddiloco/chaos.hpp"
#include "ddiloco/checkpoint.hpp"
#include "ddiloco/config.hpp"
#include "ddiloco/fragments.hpp"
#include "ddiloco/goodput.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/runtime.hpp"
#include "ddiloco/sync_window.hpp"
#include "ddiloco/topology.hpp"
#include "ddiloco/trainer.hpp"
#include "ddiloco/wan.hpp"
#include "sync/ddp_reducer.hpp"
#include "sync/learner_actions.hpp"

namespace ddiloco {

/// The outer loop's state of one fragment p on one learner rank. Versions count the syncer's
/// merges of Θ_p; sequence numbers count our snapshots of θ_p.
struct FragmentState {
  // Counters (docs/algorithm.md): what our next snapshot of p reports, from which the syncer
  // weighs it (token weight c_tok²/c_steps).
  /// Inner steps since θ_p last took a merge (carry: since the snapshot that merge answered).
  int64_t c_steps = 0;
  int64_t c_tok = 0;  ///< tokens over the same steps
  /// The counters the snapshot in flight carried: carry subtracts them when its merge is
  /// applied, so that the next snapshot counts only the steps since that one.
  int64_t sent_c_steps = 0, sent_c_tok = 0;

  /// The version of Θ_p our θ_p last took (applied, fetched at a rejoin, or resumed): the base
  /// version each snapshot names (outer.anchor: base measures Δ against it), and what
  /// decoupled with τ = 0 must exceed before it goes on.
  int64_t applied = 0;
  /// The version the merge of our newest snapshot gets in the synchronous modes, where every
  /// merge includes every unit: the k-th snapshot's is version k.
  int64_t sends = 0;
  /// The step our snapshot in flight was sent; −1: none. Its merge is applied τ steps later.
  int64_t sent_step = -1;

  /// Our newest snapshot's sequence number, as the syncer knows it (a checkpoint's merged_seq
  /// says whether Θ_p holds that snapshot). Numbers go on across resumed jobs: the window's
  /// count from 0 in this process plus `seq_base`, the highest number either side used before.
  int64_t last_seq = 0;
  int64_t seq_base = 0;

  /// Leader: the newest merged Θ_p, taken out of the inbox as soon as it arrives (so that the
  /// syncer can deliver the next one) and kept until it is due to be applied; numel(p) floats.
  std::vector<float> pending;
  int64_t pending_version = 0;  ///< leader: the version in `pending` (0: none yet)
  int64_t pending_epoch = 0;    ///< leader: kSyncerEpoch of the syncer that sent it (0: unknown)
  /// outer.apply: carry, every rank: θ_p as last sent (numel(p) floats); a merge then keeps
  /// the steps made since, θ_p ← Θ_p + (θ_p − sent_theta). Empty otherwise.
  std::vector<float> sent_theta;

  // Goodput: a step's compute is split over the fragments by their share of the parameters.
  double share = 0;      ///< numel(p) ÷ all parameters
  double unsent = 0;     ///< compute seconds on p that no snapshot has carried to the syncer yet
  /// Compute seconds carried by the snapshot in p's outbox: discarded if a crash kills it unread.
  double in_flight = 0;

  /// cuda, leader: a snapshot started on the GPU but not yet published, with the counters of
  /// the step boundary where it was taken (what the syncer must see, whenever it lands).
  std::optional<sync::SnapshotMeta> snap_meta;

  /// θ_p took a merge: the counters start over, except that carry keeps the steps made since
  /// the snapshot that carried (`sent_steps`, `sent_tok`), for the next snapshot to report.
  void count_from_merge(bool carry, int64_t sent_steps, int64_t sent_tok) {
    if (carry) {
      c_steps -= sent_steps;
      c_tok -= sent_tok;
    } else {
      c_steps = c_tok = 0;
    }
  }
};

class Learner {
 public:
  /// Exposes the leader's window to the syncer (blocking until admitted in the isolated
  /// deployment) and installs ddp's gradient reducer. `resume`, `link`: as run_learner's.
  Learner(const Config& config, const OuterPlan& plan, const Topology& topo, UnitTrainer& trainer,
          const LearnerResume* resume, wan::LinkCounters* link, const LearnerLink& sync_link);
  // The window keeps a pointer to layout_: a Learner stays where it was built.
  Learner(const Learner&) = delete;
  Learner& operator=(const Learner&) = delete;

  /// Trains to the end of the job; returns where this rank's wall time went.
  TimeBook run();

 private:
  // What `train` events average over: the steps since the last one.
  struct LogInterval {
    double compute = 0, wait = 0, loss = 0, wall = 0;
    int64_t steps = 0;
  };

  // learner.cpp: the run's start, one step's own work, its end.
  void log_start();
  void start_clock();
  bool nothing_left() const;
  StepStats train_step(int64_t t);
  void emulate_straggler(const Stopwatch& step_clock, const StepStats& s);
  void book_step(const StepStats& s, double step_s);
  void log_train(int64_t t, const StepStats& s, bool stop);
  void finish();
  void sign_off();
  void log_done();
  double job_time() const { return resumed_s_ + wall_.seconds(); }

  // learner_leader.cpp: the leader's decisions after a step, and its heartbeat.
  Actions decide(int64_t t, const StepStats& s, double step_s, bool non_finite);
  void report_progress(int64_t t, double step_s);
  void publish_running_book();
  bool decide_stop(const Actions& actions, int64_t t);
  void broadcast(Actions& actions);
  bool stop_requested();
  void wait_if_budget_spent_alone(int64_t t);
  void beat();

  // learner_outer.cpp: snapshots out, merges in.
  void publish_due(int64_t t, bool non_finite, Actions& actions);
  void publish(int p, int64_t t, Actions& actions);
  void publish_snapshot(int p);
  void publish_landed();
  void publish_all();
  void take(int p);
  bool take_merges(int64_t t, Actions& actions);
  bool wait_for_merge(int p, bool crash_ready);
  void record_sends(const Actions& actions);
  void apply_merges(const Actions& actions);
  void apply_merge(int p, int64_t version);
  void mix(std::span<float> theta, std::span<const float> mine, std::span<const float> sent) const;
  std::span<float> fragment_from_leader(int p);

  // learner_faults.cpp: crashes and rejoins, and the test hooks that emulate faults.
  void decide_crash(Actions& actions, int64_t t, const StepStats& s, bool non_finite, bool crash_ready);
  void take_chaos_crash(Actions& actions);
  bool crash_now();
  bool syncer_restarted();
  bool syncer_reading();
  void answer_reads();
  bool any_unread() const;
  bool crash(const Actions& actions, int64_t& t);
  bool crash_and_rejoin(const Actions& actions, int64_t& t, bool joining = false);
  void drop_unsent_work(const Actions& actions);
  void go_down(const Actions& actions, int64_t t, bool joining);
  bool stop_while_down();
  void offer_theta();
  void start_over_for_syncer(Actions& actions);
  bool trains_through_syncer_restart(int64_t t) const;
  void settle_offer();
  bool start_over_asked() const;
  void fetch_theta(std::vector<int64_t>& words);
  void start_over_from(const std::vector<int64_t>& words);
  void join();
  void stall_hook(int64_t t);
  void nan_hook(int64_t t);

  // learner_checkpoint.cpp
  int64_t decide_checkpoint(bool stop);
  int64_t next_checkpoint_id() const;
  void write_checkpoint(int64_t id, int64_t t, bool lost, bool stopping);
  checkpoint::UnitState unit_state(int64_t t, bool lost);
  void checkpoint_while_down();

  // learner_resume.cpp
  void resume_from_checkpoint();
  void resume_fragment(int p, std::span<float> params);
  void set_wire_references();

  // The inputs (run_learner's arguments).
  const Config& config_;
  const OuterPlan& plan_;
  const Topology& topo_;
  UnitTrainer& trainer_;
  const LearnerResume* const resume_;     // null: a fresh start
  wan::LinkCounters* const link_counters_;  // ddp leader: what crossed its WAN link
  const LearnerLink& sync_link_;

  // Settings, fixed for the run.
  const int u_;                         // this unit
  const int threads_;                   // OpenMP threads per rank (set by the deployment)
  const double base_slowdown_;          // units.slowdown[u]: this unit's straggler factor
  const bool blend_, carry_;            // outer.apply (neither: overwrite)
  const float alpha_;                   // outer.blend_alpha
  const bool tracks_fragments_;         // goodput per fragment (ddp: every step reaches the global model)
  const bool checkpoints_;              // this mode writes checkpoints and they are enabled
  const std::filesystem::path ckpt_root_;  // checkpoint.dir (default run.dir/checkpoints)
  const int64_t max_steps_;             // decoupled stops on the token budget instead
  const int64_t eval_period_;           // ddp: steps between the θ shipped for global evaluation
  // Decoupled: the lr schedule runs on the job's mean inner step, job tokens ÷ the tokens one
  // step of every unit makes (units of different speed warm up and anneal together).
  const int64_t job_step_tokens_;

  // ddp: the leaders' ring and the agreed stop (see ddp_reducer.hpp).
  std::shared_ptr<wan::WanRing> ring_;
  std::shared_ptr<StopVote> ddp_stop_ = std::make_shared<StopVote>();

  // The fragments, the window's layout and (leader) the window itself.
  const FragmentPlan fragments_;
  const sync::WindowLayout layout_;
  const int P_;
  std::unique_ptr<comm::ExposedMemory> memory_;  // before window_: it outlives it
  std::optional<sync::LearnerWindow> window_;
  // run.device: cuda (unit_backend.hpp), else null: the parameters and AdamW state live on
  // the GPU and the host model is a mirror, synchronised where host code reads or writes it.
  gpu::UnitBackend* const gpu_;
  // cuda with outer.apply overwrite: merged fragments are uploaded as soon as they are taken
  // and scattered on the GPU when due; blend and carry mix on the host.
  const bool gpu_overwrite_;
  std::vector<FragmentState> frag_;
  std::vector<float> packed_, incoming_;  // scratch, the largest fragment's size

  // Progress and accounting.
  TimeBook book_;
  int64_t tokens_ = 0;      // processed by this unit (across its resumed and restarted processes)
  int64_t skipped_ = 0;     // leader: publishes skipped, the syncer not having read the last one
  int64_t rejoins_ = 0;     // leader: crashes come back from
  int64_t first_step_ = 1;
  int64_t ckpt_done_ = 0;   // leader: the last checkpoint whose unit file we wrote
  double step_ema_ = 0;     // leader: moving average of the step time, s (0: none since a rejoin)
  LogInterval since_log_;
  JsonlWriter log_;         // leader: unit_<u>.jsonl

  // Clocks: every rank starts wall_ as its unit leaves the start barrier.
  Stopwatch wall_;
  double resumed_s_ = 0;  // the job time the checkpoint we resumed from was taken at
  double startup_s_ = 0;  // isolated, restarted process: its start-up, booked as down time

  // Faults (chaos.hpp).
  chaos::UnitTimeline faults_;
  mpi::Backoff backoff_;
  double crash_late_s_ = 0;  // leader: how long after its scheduled start the crash took effect
  std::string_view crash_cause_ = "chaos";  // leader: ... or "non_finite" or "syncer_restart"
  std::optional<double> syncer_gone_s_;  // leader, isolated: a restarted syncer admitted us; it was gone this long
  int64_t job_tokens_seen_ = -1;  // leader, decoupled: kJobTokens as last seen to change ...
  int64_t job_tokens_step_ = 0;   // ... at this step
  int64_t offers_ = 0;         // leader, isolated: offers of Θ made to restarted syncers
  bool offering_ = false;      // ... the last one not taken yet (our inboxes are held)
  bool nan_injected_ = false;  // leader: debug.nan_unit has struck
  bool stalled_ = false;       // leader: debug.stall_unit has stalled
  bool stopped_down_ = false;  // told to stop while down after a crash
};

}  // namespace ddiloco
