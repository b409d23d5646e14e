// A unit leader's decisions in the outer loop (docs/algorithm.md, "Learner, every inner
// step"; docs/architecture.md, "Control words"), apart from training, the unit's other ranks,
// the GPU and files: which snapshots go out, when a merged fragment is taken and when it is
// applied (τ steps after our own snapshot left), when the unit waits, stops, checkpoints,
// crashes or starts over from the syncer's Θ, and how it hands Θ to a restarted syncer.
//
// It runs over the leader's window (sync_window.hpp) and an injected job clock, and answers
// with Actions the shell (Learner, learner.hpp) carries out on every rank of the unit, so
// that tests/unit/test_learner_core.cpp drives it over the in-memory transport with a syncer
// side written by hand. Like the syncer's core (syncer_core.hpp), it expects failures: a
// crash, a diverged step, a syncer that died and came back are decisions, not exceptions.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ddiloco/chaos.hpp"
#include "ddiloco/config.hpp"
#include "ddiloco/fragments.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/outer_plan.hpp"
#include "ddiloco/sync_window.hpp"
#include "learner/learner_actions.hpp"

namespace ddiloco::learner {

/// The outer loop's protocol state of one fragment p. Versions count the syncer's merges of
/// Θ_p; sequence numbers count our snapshots of θ_p.
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

  /// Counters restored under another batch (a job resumed with a smaller train.batch_size)
  /// can claim more tokens than c_steps steps make now, which the syncer refuses (a unit can
  /// report at most c_steps × its tokens per step, `tps`): c_steps becomes the steps those
  /// tokens take at the new batch, so the snapshot is merged with the weight of its tokens.
  void fit_counters(int64_t tps) {
    if (tps > 0 && c_tok > 0 && c_tok / tps + (c_tok % tps != 0) > c_steps) c_steps = c_tok / tps + (c_tok % tps != 0);
  }
};

/// Why a unit starts over from Θ (the `cause` of its crash event).
enum class CrashCause { chaos, non_finite, syncer_restart };
std::string_view cause_name(CrashCause c);

class LearnerCore {
 public:
  /// What the core needs to know of the run, fixed for it.
  struct Settings {
    int unit = 0;
    bool carry = false;       ///< outer.apply: carry (the counters keep the steps since a send)
    bool isolated = false;    ///< the isolated deployment: a signal stops this unit alone
    int64_t max_steps = 0;    ///< train.steps; INT64_MAX where the token budget stops the job
    int64_t token_budget = 0;     ///< tokens, the whole job's (decoupled)
    int64_t job_step_tokens = 1;  ///< tokens one inner step of every unit makes
    bool checkpoint_at_stop = false;  ///< checkpoint.at_stop
    bool crash_during_read = false;   ///< debug.crash_during_read (a test hook, below)
    /// Settings from the run's config for unit `unit`.
    static Settings of(const Config& config, const OuterPlan& plan, int unit, bool isolated);
  };

  /// The world around the leader's decisions. Every function may be empty where noted.
  struct Env {
    /// Job time, seconds: the fault schedule's clock (a resumed job goes on from its
    /// checkpoint's time).
    std::function<double()> job_time;
    /// The leader's events (unit_<u>.jsonl); the shell adds unit, tokens and elapsed_s.
    std::function<void(nlohmann::json)> log;
    /// LearnerLink::reconnected: a restarted syncer admitted us; how long it was gone, s.
    std::function<std::optional<double>()> reconnected;
    /// LearnerLink::syncer_present (empty: always).
    std::function<bool()> syncer_present;
    /// cuda: publish the snapshots still on their way to host memory (may wait).
    std::function<void()> flush_snapshots;
    /// Sleeps `s` seconds of job time (empty: the thread sleeps; a test moves its clock).
    std::function<void(double s)> sleep;
    /// cuda, outer.apply overwrite: merged Θ_p was taken (`pending`); stage its upload to the
    /// device while the unit trains.
    std::function<void(int p, std::span<const float> theta)> taken;
  };

  /// `window`: the leader's (null on the unit's other ranks, which call only the every-rank
  /// functions below). `plan`, `fragments`, `window` must outlive the core.
  LearnerCore(const OuterPlan& plan, const protocol::FragmentPlan& fragments, protocol::LearnerWindow* window,
              Settings settings, chaos::UnitTimeline faults, Env env);

  const Settings& settings() const { return settings_; }
  int fragments() const { return static_cast<int>(frag_.size()); }
  FragmentState& fragment(int p) { return frag_[p]; }
  const FragmentState& fragment(int p) const { return frag_[p]; }
  protocol::LearnerWindow& window() { return *window_; }
  chaos::UnitTimeline& faults() { return faults_; }
  int64_t rejoins() const { return rejoins_; }
  int64_t publishes_skipped() const { return skipped_; }
  CrashCause crash_cause() const { return crash_cause_; }

  // ---- every rank
  /// An inner step of `tokens` tokens: every fragment's counters grow.
  void count_step(int64_t tokens);
  /// The snapshots published this step (actions.sent) now carry their counters.
  void record_sends(const Actions& actions);
  /// θ_p took the merge at `version` (outer.apply was carried out by the shell).
  void applied(int p, int64_t version);
  /// θ took the Θ fetched at a rejoin, at the versions in words[1..] (fetch_theta's). Every
  /// rank; the leader's step time starts over at go_down.
  void started_over(const std::vector<int64_t>& words);
  /// A resumed run: the state the checkpoint restored, and the rejoins counted before.
  void resumed(int64_t rejoins) { rejoins_ = rejoins; }

  // ---- the leader
  /// Heartbeat, steps, tokens and the step time the syncer reads every poll.
  void report_progress(int64_t t, int64_t tokens, double step_s);
  /// The mean training loss of the interval just logged, for the syncer's status page.
  void report_train_loss(double loss) { window_->set_control_f64(protocol::kTrainLoss, loss); }
  /// Alive: only a crashed or hung process stops its heartbeat, so every wait beats too.
  void beat();
  /// Told to stop: by the syncer, or by a stop signal (in one job, one that stops the unit
  /// alone only where the syncer names no round). Reports the signal to the syncer.
  bool stop_requested();

  /// The fragments whose snapshots are due after step t (none from poisoned parameters).
  std::vector<int> due(int64_t t, bool non_finite) const;
  /// Claims p's outbox for a snapshot after step t: its counters, or nullopt when the syncer
  /// has not read the previous one (the publish is skipped and counted; kPublishSkipped).
  /// A claimed snapshot counts as sent (actions.sent[p]) and must be published.
  std::optional<protocol::SnapshotMeta> claim_outbox(int p, int64_t t, Actions& actions);
  /// Writes a claimed snapshot (packed θ_p) into p's outbox with its counters.
  void publish(int p, std::span<const float> packed, const protocol::SnapshotMeta& meta);

  /// Takes a newer merged Θ_p out of p's inbox, if any, into fragment(p).pending. Returns the
  /// version taken (0: nothing new). Throws Error when it fails its checksum.
  int64_t take(int p);
  /// Takes what has arrived and lists in actions.apply the merges due after step t: τ steps
  /// after our snapshot left, never before (applying a merge before our snapshot left would
  /// discard the progress it carries); waits for them where the mode, or the warm-up, needs.
  /// Returns true when a crash came due while waiting.
  bool take_merges(int64_t t, Actions& actions);
  /// After step t: does the unit stop? (`ddp_agreed`: ddp's agreed stop, for plans without
  /// outer steps.) diloco stops on the round the syncer named.
  bool decide_stop(const Actions& actions, int64_t t, bool ddp_agreed);
  /// Decoupled, isolated, no syncer: waits (beating) once the unit's own estimate of the
  /// job's tokens reaches the budget, until a syncer is back or says stop.
  void wait_if_budget_spent_alone(int64_t t);
  /// The lr schedule's step on the job clock: the job's tokens ÷ job_step_tokens.
  int64_t schedule_step() const;
  /// Does the unit start over from Θ after step t, and why? Sets actions.crash (with the
  /// chaos crash's down time and lost snapshots). `loss`, `grad_norm`: the step's, logged.
  void decide_crash(Actions& actions, int64_t t, bool non_finite, bool crash_ready, double loss, double grad_norm);

  /// The checkpoint the syncer asks for (kCheckpointWant) whose file we have not written
  /// (0: none).
  int64_t requested_checkpoint() const;
  /// The checkpoint whose unit file the unit writes after this step (0: none): `requested`
  /// (requested_checkpoint(); ddp: the one the leaders agreed on) or, with checkpoint.at_stop or
  /// one requested, at the stop, the next one the syncer completes.
  int64_t decide_checkpoint(bool stop, int64_t requested) const;
  /// Our own checkpoint at a stop: the next one the syncer will complete.
  int64_t next_checkpoint_id() const;
  /// The unit file of checkpoint `id` is written (true) or could not be (false).
  void checkpoint_written(int64_t id, bool ok);
  int64_t checkpoint_done() const { return ckpt_done_; }

  // ---- a rejoin: the leader's part of a crash, then the fetch of Θ
  /// The unit is down: its outboxes turn to garbage (a chaos crash) or stay for the syncer;
  /// no heartbeat for `down_s` of job time; then it asks to rejoin and waits until the syncer
  /// serves it (ddp: no syncer to ask; back after the down time whatever happens, since the
  /// other units wait in the all-reduce). `joining`: the isolated deployment's start (nothing
  /// lost, nothing logged). Returns false when told to stop meanwhile.
  bool go_down(const Actions& actions, int64_t t, bool joining);
  /// Θ of every fragment, written by the syncer into our inboxes for the rejoin, into
  /// `pending`, and the versions fetched into words[1..]. Throws Error on a bad checksum.
  void fetch_theta(std::vector<int64_t>& words);
  /// Forget a restarted syncer's pending offer: we start over from its Θ now.
  void forget_syncer_restart();

  // ---- test hook (debug.crash_during_read)
  /// The syncer announces every read of one of our snapshots and waits until we answer;
  /// without a crash due we answer at once.
  void answer_reads();
  /// Is a crash due now, and taken (with the hook: once it lands in a read)?
  bool crash_now();

 private:
  bool wait_for_merge(int p, bool crash_ready);
  bool syncer_restarted();
  bool trains_through_syncer_restart(int64_t t) const;
  bool start_over_asked() const;
  void settle_offer();
  void offer_theta();
  void start_over_for_syncer(Actions& actions);
  void take_chaos_crash(Actions& actions);
  bool syncer_reading();
  bool any_unread() const;
  void wait_down(double down_s);
  void sleep(double s) const;
  void log(nlohmann::json event) const;

  const OuterPlan& plan_;
  const protocol::FragmentPlan& fragments_;
  protocol::LearnerWindow* const window_;
  const Settings settings_;
  chaos::UnitTimeline faults_;
  const Env env_;
  mpi::Backoff backoff_;

  std::vector<FragmentState> frag_;
  int64_t skipped_ = 0;    // publishes skipped, the syncer not having read the last one
  int64_t rejoins_ = 0;    // crashes come back from
  int64_t ckpt_done_ = 0;  // the last checkpoint whose unit file we wrote
  CrashCause crash_cause_ = CrashCause::chaos;
  double crash_late_s_ = 0;  // how long after its scheduled start the crash took effect
  // Isolated: a restarted syncer admitted us; it was gone this long (until decide_crash).
  std::optional<double> syncer_gone_s_;
  int64_t offers_ = 0;     // offers of Θ made to restarted syncers
  bool offering_ = false;  // ... the last one not taken yet (our inboxes are held)
  int64_t job_tokens_seen_ = -1;  // decoupled: kJobTokens as last seen to change ...
  int64_t job_tokens_step_ = 0;   // ... at this step
  double step_ema_ = 0;  // moving average of the step time, s (0: none since a rejoin)
};

}  // namespace ddiloco::learner
