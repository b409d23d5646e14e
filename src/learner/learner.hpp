// A learner rank in a multi-unit job (run_learner in ddiloco/learner.hpp is its public entry
// point): the shell around a unit's outer loop. Its leader's decisions — what is published,
// taken, applied, when the unit waits, stops, checkpoints or starts over — are LearnerCore's
// (learner_core.hpp), over the leader's window; the Learner carries them out on every rank:
// the trainer's steps, the unit's broadcast, the GPU, checkpoint files, logs and the goodput
// books (goodput.hpp).
//
// Every rank of a unit runs one Learner. The unit's leader (local rank 0) alone talks to the
// syncer through its window (sync_window.hpp); after each inner step it decides what the
// unit does (Actions) and broadcasts it, so that every rank's replica stays identical.
//
// The member functions live in one file per concern:
//   learner.cpp             construction, the step loop, the end of the run
//   learner_leader.cpp      the leader's decisions after each step, through the core
//   learner_outer.cpp       publishing snapshots, applying merged fragments
//   learner_faults.cpp      crashes, rejoins, the isolated deployment's join
//   learner_checkpoint.cpp  this unit's part of a checkpoint
//   learner_resume.cpp      resuming from a checkpoint, the wire format's references
// and, apart: learner_core.hpp (the decisions), learner_hooks.hpp (debug.* test hooks),
// learner_actions.hpp (the leader's instructions and their encoding) and ddp_reducer.hpp
// (ddp's gradient all-reduce across units).
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
#include "ddiloco/learner.hpp"
#include "ddiloco/sync_window.hpp"
#include "ddiloco/topology.hpp"
#include "ddiloco/train_loop.hpp"
#include "ddiloco/trainer.hpp"
#include "ddiloco/wan.hpp"
#include "learner/ddp_reducer.hpp"
#include "learner/learner_actions.hpp"
#include "learner/learner_core.hpp"
#include "learner/learner_hooks.hpp"

namespace ddiloco::learner {

class Learner : private StepPolicy {
 public:
  /// Exposes the leader's window to the syncer (blocking until admitted in the isolated
  /// deployment) and installs ddp's gradient reducer. `resume`: as run_learner's.
  Learner(const Config& config, const OuterPlan& plan, const Topology& topo, UnitTrainer& trainer,
          const LearnerResume* resume, const LearnerLink& sync_link);
  // The window keeps a pointer to layout_: a Learner stays where it was built.
  Learner(const Learner&) = delete;
  Learner& operator=(const Learner&) = delete;

  /// Trains to the end of the job; returns where this rank's wall time went.
  TimeBook run();
  /// ddp leader: what crossed its WAN link (unit −1 elsewhere).
  wan::LinkCounters link_counters() const;

 private:
  // Fixed for the run.
  struct Settings {
    int unit = 0;
    int threads = 1;             // OpenMP threads per rank (set by the deployment)
    double base_slowdown = 1;    // units.slowdown[u]: this unit's straggler factor
    bool blend = false;          // outer.apply: blend (carry: the core's settings; neither: overwrite)
    float alpha = 0;             // outer.blend_alpha
    bool tracks_fragments = false;  // goodput per fragment (ddp: every step reaches the global model)
    bool checkpoints = false;    // this mode writes checkpoints and they are enabled
    std::filesystem::path ckpt_root;  // checkpoint.dir (default run.dir/checkpoints)
    int64_t eval_period = 0;     // ddp: steps between the θ shipped for global evaluation
    static Settings of(const Config& config, const OuterPlan& plan, int unit);
  };
  // What the unit does with fragment p beside the protocol (LearnerCore's FragmentState).
  struct FragmentWork {
    // Goodput: a step's compute is split over the fragments by their share of the parameters.
    double share = 0;      // numel(p) ÷ all parameters
    double unsent = 0;     // compute seconds on p that no snapshot has carried to the syncer yet
    double in_flight = 0;  // ... carried by the snapshot in p's outbox (lost if a crash kills it unread)
    // outer.apply carry, every rank: θ_p as last sent; a merge then keeps the steps made
    // since, θ_p ← Θ_p + (θ_p − sent_theta). Empty otherwise.
    std::vector<float> sent_theta;
    // cuda, leader: a snapshot started on the GPU but not yet published, with the counters
    // of the step boundary where it was taken (what the syncer must see, whenever it lands).
    std::optional<protocol::SnapshotMeta> snap_meta;
    // Resumed (streaming, decoupled): the snapshot in flight when the checkpoint was taken was never
    // merged; it is sent again, with the work since, at the first step (learner_resume.cpp).
    bool resend = false;
  };
  // ddp: the leaders' ring and the agreed stop (see ddp_reducer.hpp).
  struct Ddp {
    std::shared_ptr<wan::WanRing> ring;
    std::shared_ptr<StopVote> stop = std::make_shared<StopVote>();
  };
  // What `train` events average over: the steps since the last one.
  struct LogInterval {
    double compute = 0, wait = 0, loss = 0, wall = 0;
    int64_t steps = 0;  // whose losses `loss` sums (a resumed unit's include the checkpoint's)
    int64_t timed = 0;  // whose times compute and wall sum (this process's)
  };
  // Every rank starts `wall` as its unit leaves the start barrier.
  struct JobClock {
    Stopwatch wall;
    double resumed_s = 0;  // the job time the checkpoint we resumed from was taken at
    double startup_s = 0;  // isolated, restarted process: its start-up, booked as down time
    double job_time() const { return resumed_s + wall.seconds(); }
  };

  // learner.cpp: the run's start, one step's own work, its end.
  void make_core();
  void log_start();
  void start_clock();
  bool nothing_left() const;
  bool before_step(int64_t t) override;
  bool after_step(int64_t& t, const StepStats& s, const Stopwatch& step_clock) override;
  void check_diverged(int64_t t, const StepStats& s) const;
  void emulate_straggler(const Stopwatch& step_clock, const StepStats& s);
  void book_step(const StepStats& s, double step_s);
  void log_event(nlohmann::json event);
  void log_train(int64_t t, const StepStats& s, bool stop);
  void finish();
  void sign_off();
  void log_done();

  // learner_leader.cpp: the leader's decisions after a step.
  Actions decide(int64_t t, const StepStats& s, double step_s, bool non_finite);
  void publish_running_book();
  void broadcast(Actions& actions);
  void lose_unlanded(Actions& actions);

  // learner_outer.cpp: snapshots out, merges in.
  void publish_due(int64_t t, bool non_finite, Actions& actions);
  void publish(int p, int64_t t, Actions& actions);
  void publish_snapshot(int p);
  void publish_landed();
  void publish_all();
  void record_sends(const Actions& actions);
  void apply_merge(int p, int64_t version);
  void mix(std::span<float> theta, std::span<const float> mine, std::span<const float> sent) const;
  std::span<float> fragment_from_leader(int p);

  // learner_faults.cpp: crashes and rejoins.
  bool crash(const Actions& actions, int64_t& t);
  bool crash_and_rejoin(const Actions& actions, int64_t& t, bool joining = false);
  void drop_unsent_work(const Actions& actions);
  void start_over_from(const std::vector<int64_t>& words);
  void join();

  // learner_checkpoint.cpp
  void write_checkpoint(int64_t id, int64_t t, bool lost, bool stopping);
  checkpoint::UnitState unit_state(int64_t t, bool lost, UnitTrainer::Moments moments);
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
  const LearnerResume* const resume_;  // null: a fresh start
  const LearnerLink& sync_link_;
  const Settings set_;
  Ddp ddp_;

  // The fragments, the window's layout, (leader) the window itself, and the decisions over it.
  const protocol::FragmentPlan fragments_;
  const protocol::WindowLayout layout_;
  std::unique_ptr<comm::ExposedMemory> memory_;  // before window_: it outlives it
  std::optional<protocol::LearnerWindow> window_;
  std::optional<LearnerCore> core_;
  std::unique_ptr<LearnerTestHooks> hooks_;  // null unless debug.* names this unit
  // run.device: cuda (unit_backend.hpp), else null: the parameters and AdamW state live on
  // the GPU and the host model is a mirror, synchronised where host code reads or writes it.
  gpu::UnitBackend* const gpu_;
  std::vector<FragmentWork> work_;
  std::vector<float> packed_, incoming_;  // scratch, the largest fragment's size

  // Progress and accounting.
  TimeBook book_;
  int64_t tokens_ = 0;  // processed by this unit (across its resumed and restarted processes)
  int64_t first_step_ = 1;
  LogInterval since_log_;
  JsonlWriter log_;  // leader: unit_<u>.jsonl
  JobClock clock_;
  bool stopped_down_ = false;  // told to stop while down after a crash
};

}  // namespace ddiloco::learner
