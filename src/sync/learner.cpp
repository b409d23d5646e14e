// A learner rank in a multi-unit job: inner steps as in a single unit, plus the outer loop —
// counters per fragment, publishing snapshots when due, applying merged fragments τ steps
// after sending (paper_notes.md, "Learner m, every inner step").
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <thread>

#include <omp.h>
#include <unistd.h>

#include "ddiloco/chaos.hpp"
#include "ddiloco/checkpoint.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/fragments.hpp"
#include "ddiloco/goodput.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/runtime.hpp"
#include "ddiloco/signals.hpp"
#include "ddiloco/sync_window.hpp"
#include "ddiloco/trainer.hpp"
#include "ddiloco/wan.hpp"

namespace ddiloco {

namespace {

// ddp's stop must be agreed: units in lock-step that stopped at different steps would leave
// one waiting in the ring forever. Each leader votes (told to stop, by the syncer or a signal)
// with its step's loss; every unit stops after the step in which any leader voted.
struct StopVote {
  bool vote = false;    // leader: this unit wants to stop
  bool agreed = false;  // leader: some unit wanted to, at the step just made
};

// ddp: the unit's gradients are summed to its leader, summed across leaders over the WAN
// links (the leaders' ring, wan.hpp), averaged over every learner rank, and broadcast in the
// unit.

UnitTrainer::GradientReducer hierarchical_reducer(const Topology& topo, int total_ranks,
                                                  std::shared_ptr<wan::WanRing> ring,
                                                  std::shared_ptr<StopVote> stop) {
  return [&topo, total_ranks, ring, stop](std::span<float> grads, double loss) {
    mpi::reduce_sum(grads, 0, topo.unit_comm);
    double loss_sum = loss;
    if (topo.unit_size > 1)
      mpi::check(MPI_Allreduce(MPI_IN_PLACE, &loss_sum, 1, MPI_DOUBLE, MPI_SUM, topo.unit_comm),
                 "Allreduce(loss)");
    if (topo.leader) {
      // The loss first, NaN from a leader whose gradients are not finite: every leader then
      // knows whether the gradients can travel in the wire format (which refuses non-finite
      // values) or must go raw, and the step fails as diverged on every unit.
      const bool finite = std::all_of(grads.begin(), grads.end(), [](float g) { return std::isfinite(g); });
      double words[2] = {finite ? loss_sum : std::numeric_limits<double>::quiet_NaN(), stop->vote ? 1.0 : 0.0};
      mpi::allreduce_sum_patient(std::span<double>(words), topo.leaders_comm);
      loss_sum = words[0];
      stop->agreed = words[1] > 0;
      ring->allreduce_sum(grads, !std::isfinite(loss_sum));
      const float inv = 1.0f / static_cast<float>(total_ranks);
      const long n = static_cast<long>(grads.size());
#pragma omp parallel for schedule(static)
      for (long i = 0; i < n; ++i) grads[i] *= inv;
    }
    if (topo.unit_size > 1) {
      mpi::broadcast(grads, 0, topo.unit_comm);
      mpi::check(MPI_Bcast(&loss_sum, 1, MPI_DOUBLE, 0, topo.unit_comm), "Bcast(loss)");
    }
    return loss_sum / total_ranks;
  };
}

// Per-step instructions from the leader to the rest of its unit.
struct Actions {
  bool stop = false;
  bool crash = false;          // the unit crashes now (chaos) ...
  int64_t down_ms = 0;         // ... and stays down this long
  std::vector<int64_t> lost;   // per fragment: 1 = its unread snapshot dies with the crash
  std::vector<int64_t> sent;   // per fragment: 1 = a snapshot was published this step
  std::vector<std::pair<int, int64_t>> apply;  // (fragment, version)
  int64_t schedule_step = -1;                  // the lr schedule's step for the next step
  int64_t checkpoint = 0;                      // write this checkpoint's unit file now

  std::vector<int64_t> encode(int fragments) const {
    std::vector<int64_t> w(6 + 4 * static_cast<size_t>(fragments), 0);
    w[0] = stop;
    w[1] = crash;
    w[2] = down_ms;
    w[3] = static_cast<int64_t>(apply.size());
    for (size_t p = 0; p < lost.size(); ++p) w[4 + p] = lost[p];
    for (size_t p = 0; p < sent.size(); ++p) w[4 + fragments + p] = sent[p];
    w.back() = schedule_step;
    w[w.size() - 2] = checkpoint;
    for (size_t i = 0; i < apply.size(); ++i) {
      w[4 + 2 * fragments + 2 * i] = apply[i].first;
      w[5 + 2 * fragments + 2 * i] = apply[i].second;
    }
    return w;
  }
  static Actions decode(const std::vector<int64_t>& w, int fragments) {
    Actions a;
    a.stop = w[0] != 0;
    a.schedule_step = w.back();
    a.checkpoint = w[w.size() - 2];
    a.crash = w[1] != 0;
    a.down_ms = w[2];
    a.lost.assign(w.begin() + 4, w.begin() + 4 + fragments);
    a.sent.assign(w.begin() + 4 + fragments, w.begin() + 4 + 2 * fragments);
    for (int64_t i = 0; i < w[3]; ++i)
      a.apply.emplace_back(static_cast<int>(w[4 + 2 * fragments + 2 * i]),
                           w[5 + 2 * fragments + 2 * i]);
    return a;
  }
};

}  // namespace

TimeBook run_learner(const Config& config, const OuterPlan& plan, const Topology& topo,
                     UnitTrainer& trainer, const LearnerResume* resume, wan::LinkCounters* link,
                     const LearnerLink& sync_link) {
  const bool isolated = topo.isolated;
  const int threads = omp_get_max_threads();  // set by run_job
  std::shared_ptr<wan::WanRing> ring;
  auto ddp_stop = std::make_shared<StopVote>();
  if (plan.mode == Mode::ddp) {
    if (topo.leader) ring = std::make_shared<wan::WanRing>(topo.leaders_comm, config);
    trainer.set_gradient_reducer(hierarchical_reducer(topo, topo.stream_count, ring, ddp_stop));
  }

  const FragmentPlan fragments(trainer.model().layout(), plan.fragments, plan.h);
  // In ddp the window only ships θ to the syncer for evaluation, not across the WAN: fp32.
  const sync::WindowLayout layout(fragments, plan.outer_steps ? wire::parse_format(config.wan.format)
                                                              : wire::Format::fp32,
                                  static_cast<size_t>(config.wan.block));
  std::unique_ptr<comm::ExposedMemory> memory;
  std::optional<sync::LearnerWindow> window;
  if (topo.leader) {
    memory = sync_link.expose(layout.bytes());
    window.emplace(*memory, layout);
  }

  const int P = fragments.size();
  const int u = topo.unit;
  // run.device: cuda (gpu/unit_backend.hpp): the parameters and AdamW state live on the GPU and
  // the host model is a mirror, synchronised where host code below reads or writes it. The
  // leader's snapshots go device → pinned host asynchronously and are published when they
  // land; merged fragments (apply: overwrite) are uploaded as soon as they are taken and
  // scattered on the GPU when due, then NCCL-broadcast in the unit. blend and carry take the
  // host path: the fragment is downloaded, mixed on the CPU as below, and uploaded.
  gpu::UnitBackend* const gpu = trainer.gpu();
  if (gpu && plan.outer_steps) gpu->attach_fragments(fragments, topo.leader);
  const double base_slowdown = config.units.slowdown.empty() ? 1.0 : config.units.slowdown[u];
  chaos::UnitTimeline faults(chaos::Schedule::from_config(config.chaos, config.units.count), u);
  const bool blend = config.outer.apply == "blend";
  const bool carry = config.outer.apply == "carry";
  const bool gpu_overwrite = gpu != nullptr && !blend && !carry;  // the asynchronous path
  const float alpha = static_cast<float>(config.outer.blend_alpha);
  const int64_t eval_period = static_cast<int64_t>(plan.h) * config.syncer.eval_every;
  // Decoupled: the lr schedule runs on the job's mean inner step, job tokens ÷ the tokens one
  // step of every unit makes (units of different speed warm up and anneal together).
  const int64_t job_step_tokens = config.job_tokens_per_step();

  std::vector<int64_t> c_steps(P, 0), c_tok(P, 0), base_version(P, 0), applied(P, 0),
      sent_step(P, -1), sends(P, 0), pending_version(P, 0), last_seq(P, 0),
      seq_base(P, 0);  // snapshot numbers go on across resumed jobs: base + the window's
  size_t largest = 0;
  for (const auto& f : fragments.fragments()) largest = std::max(largest, f.numel);
  std::vector<float> packed(largest), incoming(largest);
  // carry: each fragment as last sent, and the counters it carried, on every rank of the unit.
  std::vector<std::vector<float>> sent_theta(carry ? P : 0);
  for (int p = 0; p < static_cast<int>(sent_theta.size()); ++p) sent_theta[p].resize(layout.numel(p));
  std::vector<int64_t> sent_c_steps(P, 0), sent_c_tok(P, 0);
  // The leader takes each merged fragment out of its inbox as soon as it arrives (so that the
  // syncer can deliver the next one) and keeps the newest here until it is due to be applied.
  std::vector<std::vector<float>> pending(topo.leader ? P : 0);
  for (int p = 0; p < static_cast<int>(pending.size()); ++p) pending[p].resize(layout.numel(p));

  // Goodput: compute time not yet carried to the syncer by a snapshot, per fragment (a step's
  // work is split over the fragments by their share of the parameters), and the work carried
  // by the snapshot in each outbox.
  TimeBook book;
  std::vector<double> share(P), unsent(P, 0.0), in_flight(P, 0.0);
  for (int p = 0; p < P; ++p)
    share[p] = static_cast<double>(layout.numel(p)) / trainer.model().layout().size();
  const bool tracks_fragments = plan.outer_steps;  // ddp: every step reaches the global model

  JsonlWriter log;
  const int64_t restart = sync_link.restart;
  if (topo.leader) {
    // A restarted unit process appends to its predecessors' log.
    log = JsonlWriter(std::filesystem::path(config.run.dir) / fmt::format("unit_{}.jsonl", u),
                      resume == nullptr && restart == 0);
    log.write({{"event", "start"}, {"step", 0}, {"tokens", 0}, {"elapsed_s", 0.0},
               {"unit", u}, {"ranks", topo.unit_size}, {"threads_per_rank", threads},
               {"host", host_name()}, {"pid", static_cast<int64_t>(::getpid())}, {"restart", restart},
               {"processes", sync_link.processes},
               {"slowdown", base_slowdown}, {"mode", mode_name(plan.mode)}});
    if (gpu) log.write({{"event", "device"}, {"unit", u}, {"step", 0}, {"tokens", 0},
                        {"elapsed_s", 0.0}, {"device", gpu->describe()}});
    window->set_control(sync::kState, sync::kRunning);
  }

  int64_t tokens = 0, skipped = 0, rejoins = 0, first_step = 1;
  const bool checkpoints = plan.outer_steps && config.checkpoint.enabled();
  const std::filesystem::path ckpt_root = config.checkpoint.directory(config.run.dir);
  int64_t ckpt_done = 0;  // leader: the last checkpoint whose unit file we wrote

  // Resume (checkpoint.hpp). The syncer's part of a checkpoint is newer than every unit's:
  // for each fragment, the syncer's merged_seq says whether Θ_p already holds our last
  // snapshot (or a later one, sent after our file was written). Then Θ_p is applied as the
  // merge of that snapshot would have been; otherwise our θ_p and its counters are kept, and
  // the next snapshot carries that progress. Snapshots and merges in flight at the checkpoint
  // are thereby accounted for, and every unit resumes holding Θ at the syncer's versions.
  if (resume) {
    const checkpoint::UnitState& st = resume->unit;
    const checkpoint::SyncerState& sy = resume->syncer;
    auto params = trainer.model().parameters();
    if (st.lost) {
      std::copy(sy.theta.begin(), sy.theta.end(), params.begin());
      trainer.optimizer().reset();
    } else {
      std::copy(st.params.begin(), st.params.end(), params.begin());
      std::copy(st.adam_m.begin(), st.adam_m.end(), trainer.optimizer().first_moment().begin());
      std::copy(st.adam_v.begin(), st.adam_v.end(), trainer.optimizer().second_moment().begin());
      trainer.optimizer().set_step_count(st.adam_step);
    }
    trainer.set_steps_done(st.step);
    if (plan.mode == Mode::decoupled) trainer.set_schedule_step(st.schedule_step);
    trainer.data()->seek(st.cursors[topo.unit_rank]);
    tokens = st.tokens;
    rejoins = st.rejoins;
    first_step = st.step + 1;
    for (int p = 0; p < P; ++p) {
      const int64_t merged = sy.merged_seq[static_cast<size_t>(u) * P + p];
      const bool was_sent = st.sent_step[p] >= 0;
      std::span<float> theta(incoming.data(), layout.numel(p));
      fragments.pack(p, sy.theta, theta);
      c_steps[p] = st.c_steps[p];
      c_tok[p] = st.c_tok[p];
      if (st.lost || merged > st.last_seq[p]) {
        fragments.unpack(p, theta, params);  // Θ_p holds all of our progress
        c_steps[p] = c_tok[p] = 0;
      } else if (was_sent && merged == st.last_seq[p]) {
        std::span<float> mine(packed.data(), theta.size());
        fragments.pack(p, params, mine);
        if (blend)
          for (size_t i = 0; i < theta.size(); ++i) theta[i] = alpha * mine[i] + (1 - alpha) * theta[i];
        if (carry && st.sent_theta.size() == static_cast<size_t>(P))
          for (size_t i = 0; i < theta.size(); ++i) theta[i] += mine[i] - st.sent_theta[p][i];
        fragments.unpack(p, theta, params);
        if (carry) {
          c_steps[p] -= st.sent_c_steps[p];
          c_tok[p] -= st.sent_c_tok[p];
        } else {
          c_steps[p] = c_tok[p] = 0;
        }
      }
      base_version[p] = applied[p] = pending_version[p] = sends[p] = sy.versions[p];
      // Above every number either side has used (the syncer computes the same).
      last_seq[p] = seq_base[p] = std::max(st.last_seq[p], merged);
      if (topo.leader) window->set_inbox_taken(p, sy.versions[p]);
    }
    trainer.upload_state();  // cuda: the device trains from the resumed state
    if (topo.leader) {
      window->set_control(sync::kStepsDone, st.step);
      window->set_control(sync::kTokensDone, tokens);
      log.write({{"event", "resume"}, {"unit", u}, {"step", st.step}, {"tokens", tokens},
                 {"path", resume->dir.string()}, {"lost", st.lost}, {"elapsed_s", 0.0}});
    }
  }

  // The wire format's references (sync_window.hpp): Θ₀, the common initialisation; or, on
  // resume, the one in our file when it is at the checkpoint's version, else the checkpoint's
  // Θ (checkpoint::has_reference; the syncer applies the same rule to the same file).
  // The isolated deployment shares none: a unit process joins by taking Θ raw (below).
  if (topo.leader && plan.outer_steps && !isolated)
    for (int p = 0; p < P; ++p) {
      std::span<float> theta(incoming.data(), layout.numel(p));
      if (resume && checkpoint::has_reference(resume->unit, p, resume->syncer.versions[p])) {
        window->set_reference(p, resume->syncer.versions[p], resume->unit.wire_ref[p]);
        if (static_cast<size_t>(p) < resume->unit.wire_residual.size())
          window->set_residual(p, resume->unit.wire_residual[p]);
        continue;
      }
      fragments.pack(p, resume ? std::span<const float>(resume->syncer.theta) : trainer.model().parameters(), theta);
      window->set_reference(p, resume ? resume->syncer.versions[p] : 0, theta);
    }

  // Every rank starts its clock when all leave this barrier: the fault schedule's time zero.
  mpi::barrier_patient(topo.world);
  if (sync_link.started) sync_link.started();
  Stopwatch wall;
  // The fault schedule runs on the job's time: a resumed job goes on where its checkpoint was.
  const double resumed_s = resume ? resume->syncer.elapsed_s : 0.0;
  auto job_time = [&] { return resumed_s + wall.seconds(); };
  faults.skip_crashes_before(resumed_s);
  if (ring) ring->set_rate_factor([&] { return faults.link_factor_at(job_time()); });

  // Writes this unit's file of checkpoint `id` (collective over the unit: the leader gathers
  // every rank's data cursor). `lost`: the unit is down after a crash and has no parameters.
  // `stopping`: the unit's last file; when the syncer completed `id` without it meanwhile (it
  // was silent), it goes into the next checkpoint, the one the syncer completes at the end.
  auto write_checkpoint = [&](int64_t id, int64_t t, bool lost, bool stopping) {
    const DataCursor mine = trainer.data()->cursor();
    std::vector<int64_t> cursor = {mine.epoch, mine.batch}, all(2 * static_cast<size_t>(topo.unit_size));
    mpi::check(MPI_Gather(cursor.data(), 2, MPI_INT64_T, all.data(), 2, MPI_INT64_T, 0, topo.unit_comm),
               "Gather(data cursor)");
    if (!topo.leader) return;
    Stopwatch clock;
    checkpoint::UnitState st;
    st.id = id;
    st.unit = u;
    st.model = config.model;
    st.lost = lost;
    st.step = t;
    st.tokens = tokens;
    st.schedule_step = trainer.schedule_step();
    st.rejoins = rejoins;
    st.run_seed = config.run.seed;
    if (!lost) {
      trainer.download_state();  // cuda: the device's parameters and AdamW moments
      auto copy = [](std::span<const float> x) { return std::vector<float>(x.begin(), x.end()); };
      st.params = copy(trainer.model().parameters());
      st.adam_m = copy(trainer.optimizer().first_moment());
      st.adam_v = copy(trainer.optimizer().second_moment());
      st.adam_step = trainer.optimizer().step_count();
    }
    st.c_steps = c_steps;
    st.c_tok = c_tok;
    st.sent_step = sent_step;
    st.last_seq = last_seq;
    st.sent_c_steps = sent_c_steps;
    st.sent_c_tok = sent_c_tok;
    st.sent_theta = sent_theta;
    if (layout.format() != wire::Format::fp32)
      for (int p = 0; p < P; ++p) {
        st.wire_ref_version.push_back(window->reference_version(p));
        const auto r = window->reference(p);
        st.wire_ref.emplace_back(r.begin(), r.end());
        const auto e = window->residual(p);
        st.wire_residual.emplace_back(e.begin(), e.end());
      }
    for (int r = 0; r < topo.unit_size; ++r) st.cursors.push_back({all[2 * r], all[2 * r + 1]});
    bool written = false;
    try {
      for (int attempt = 0; attempt < (stopping ? 2 : 1) && !written; ++attempt, ++id) {
        st.id = id;
        ckpt_done = id;
        const std::filesystem::path dir = checkpoint::directory(ckpt_root, id);
        std::filesystem::create_directories(dir);
        // False: too late, the syncer completed this checkpoint with our previous file.
        written = checkpoint::write_unit(dir, st);
      }
      id = ckpt_done;
    } catch (const std::exception& e) {
      // A checkpoint that cannot be written (disk full, ...) is abandoned, not the job: the
      // syncer hears of it, and the next one is tried at its time.
      std::fprintf(stderr, "ddiloco: warning: unit %d: checkpoint %lld not written: %s\n", u,
                   static_cast<long long>(id), e.what());
      log.write({{"event", "checkpoint_failed"}, {"unit", u}, {"id", id}, {"error", e.what()},
                 {"step", t}, {"tokens", tokens}, {"elapsed_s", wall.seconds()}});
      window->set_control(sync::kCheckpointFailed, id);
      return;
    }
    window->set_control(sync::kCheckpointDone, id);
    log.write({{"event", "checkpoint"}, {"unit", u}, {"id", id}, {"step", t}, {"tokens", tokens},
               {"lost", lost}, {"written", written}, {"write_s", clock.seconds()},
               {"elapsed_s", wall.seconds()}});
  };

  double step_ema = 0, window_compute = 0, window_wait = 0, window_loss = 0, window_wall = 0;
  int64_t window_steps = 0;
  const int64_t max_steps = plan.mode == Mode::decoupled ? INT64_MAX : config.train.steps;
  mpi::Backoff backoff;
  // Told to stop: by the syncer (token budget, or it was interrupted) or by a signal. A diloco
  // unit that receives a signal tells the syncer, which names the round every unit ends on.
  auto stop_requested = [&] {
    if (stop_signal() != 0) window->set_control(sync::kSignal, stop_signal());
    return window->control(sync::kStop) != 0 || (stop_signal() != 0 && plan.mode != Mode::diloco);
  };

  // A crashed unit: its ranks lose parameters and optimizer state, stay down, then fetch Θ of
  // every fragment from the syncer and start over from it with fresh counters and moments,
  // on their own data streams from where they were. Returns false when told to stop while
  // down. ddp keeps the replica: on a synchronous job a returning replica is copied from a
  // peer's identical one, which we do not move; everyone waits for it all the same.
  double crash_late_s = 0;  // leader: how long after its scheduled start the crash took effect
  std::string_view crash_cause = "chaos";  // leader: ... or "non_finite" (a diverged step)
  bool nan_injected = false;          // leader: debug.nan_unit has struck
  bool stalled = false;               // leader: debug.stall_unit has stalled
  // Leader: alive (only a crashed or hung process stops its heartbeat).
  auto beat = [&] { window->set_control(sync::kHeartbeat, window->control(sync::kHeartbeat) + 1); };
  auto any_unread = [&] {
    for (int p = 0; p < P; ++p)
      if (!window->outbox_free(p)) return true;
    return false;
  };
  // Test hook: hold a due crash until the syncer begins to read one of our snapshots (it then
  // pauses syncer_read_delay_ms before the data), so the crash lands mid-read. False when no
  // snapshot is left unread: the crash then waits for a later step.
  auto syncer_reading = [&] {
    const int64_t reads = window->control(sync::kReadsStarted);
    while (any_unread() && !stop_requested()) {
      if (window->control(sync::kReadsStarted) != reads) return true;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      beat();
    }
    return false;
  };
  // A crash is due and is taken now (debug.crash_during_read: once it lands in a read).
  auto crash_now = [&] {
    if (!faults.crash_pending(job_time())) return false;
    return !config.debug.crash_during_read || !plan.outer_steps || syncer_reading();
  };
  // Fragment p of the Θ the leader took from its inbox, on every rank of the unit.
  auto fragment_from_leader = [&](int p) {
    std::span<float> buf(incoming.data(), layout.numel(p));
    if (topo.leader) std::copy(pending[p].begin(), pending[p].end(), buf.begin());
    if (topo.unit_size > 1) mpi::broadcast(buf, 0, topo.unit_comm);
    return buf;
  };
  auto poison = [](std::span<float> xs) {
    std::fill(xs.begin(), xs.end(), std::numeric_limits<float>::quiet_NaN());
  };
  // joining: the isolated deployment's start, where a new unit process takes Θ from the
  // syncer like a unit back from a crash (with nothing lost, nothing to wait out).
  auto crash_and_rejoin = [&](const Actions& a, int64_t& t, bool joining = false) {
    for (int p = 0; p < P && tracks_fragments; ++p) {
      book.discarded += unsent[p] + (a.lost[p] ? in_flight[p] : 0.0);
      unsent[p] = in_flight[p] = 0;
    }
    if (plan.outer_steps) {
      poison(trainer.model().parameters());
      trainer.optimizer().reset();
    }
    std::vector<int64_t> words(1 + P, 0);  // [stop, versions fetched...]
    if (topo.leader) {
      if (plan.outer_steps && crash_cause == "chaos" && !joining) window->lose_outboxes();
      else if (plan.outer_steps) window->hold_inboxes();
      if (!joining)
        log.write({{"event", "crash"}, {"unit", u}, {"step", t}, {"tokens", tokens},
                 {"elapsed_s", wall.seconds()}, {"down_s", a.down_ms / 1e3}, {"late_s", crash_late_s},
                 {"cause", crash_cause},
                 {"lost_snapshots", std::count(a.lost.begin(), a.lost.end(), 1)}});
      const double back_at = wall.seconds() + a.down_ms / 1e3;
      // ddp: the other units sit inside the gradient all-reduce waiting for this one, so it
      // comes back whatever happens and stops with them after that step.
      auto may_stop = [&] { return plan.outer_steps && stop_requested(); };
      while (wall.seconds() < back_at && !may_stop())  // down: no heartbeat
        std::this_thread::sleep_for(std::chrono::duration<double>(
            std::min(0.05, std::max(0.0, back_at - wall.seconds()))));
      if (plan.outer_steps && !stop_requested()) {
        window->set_control(sync::kRejoinRequest, ++rejoins);
        while (window->control(sync::kRejoinServed) < rejoins && !stop_requested()) backoff.idle();
        backoff.reset();
      }
      words[0] = may_stop();
      if (plan.outer_steps && !words[0])
        for (int p = 0; p < P; ++p) {
          words[1 + p] = window->inbox_version(p);
          if (!window->take_inbox(p, pending[p]))
            fail("unit {}: rejoin: Θ of fragment {} failed its checksum", u, p);
        }
    }
    if (topo.unit_size > 1) mpi::broadcast_patient(words, 0, topo.unit_comm);
    if (words[0]) return false;
    if (plan.outer_steps) {
      for (int p = 0; p < P; ++p) {
        fragments.unpack(p, fragment_from_leader(p), trainer.model().parameters());
        // The next outer gradient is against what was fetched; the token weight restarts.
        c_steps[p] = c_tok[p] = 0;
        base_version[p] = applied[p] = pending_version[p] = sends[p] = words[1 + p];
        sent_step[p] = -1;
      }
      trainer.upload_state();  // cuda: Θ and the fresh (zero) moments to the device
    }
    // diloco counts rounds in steps: every unit's k-th snapshot is its step k·H (P = 1). A
    // unit back from a crash redoes, from the Θ it fetched (round words[1]), the steps of the
    // round it lost, so that its snapshots and its last step stay in line with the others'.
    const int64_t crashed_at = t;
    if (plan.mode == Mode::diloco && !words[0]) {
      t = words[1] * plan.h;
      trainer.set_steps_done(t);  // the learning rate follows the round too
    }
    if (topo.leader) {
      step_ema = 0;
      nlohmann::json versions(std::vector<int64_t>(words.begin() + 1, words.end()));
      log.write({{"event", joining ? "join" : "rejoin"}, {"unit", u}, {"step", t}, {"tokens", tokens},
                 {"elapsed_s", wall.seconds()}, {"versions", versions},
                 {"steps_redone", crashed_at - t}});
    }
    return true;
  };

  // cuda, leader: snapshots started on the GPU but not yet published, with the counters of the
  // step boundary where they were taken (what the syncer must see, whenever they land).
  std::vector<std::optional<sync::SnapshotMeta>> snap_meta(P);
  auto publish_snapshot = [&](int p) {  // its copy has landed in pinned host memory
    last_seq[p] = seq_base[p] + window->publish(p, gpu->snapshot(p), *snap_meta[p]);
    snap_meta[p].reset();
  };
  auto publish_landed = [&] {  // at every step boundary: never waits
    for (int p = 0; p < P; ++p)
      if (snap_meta[p] && gpu->snapshot_ready(p)) publish_snapshot(p);
  };
  auto publish_all = [&] {  // before waiting for a merge, at a stop or checkpoint: may wait
    for (int p = 0; p < P; ++p)
      if (snap_meta[p]) {
        gpu->wait_snapshot(p);
        publish_snapshot(p);
      }
  };

  bool stopped_down = false;  // told to stop while down after a crash
  // The isolated deployment: this process starts from the syncer's Θ. A restarted one books
  // everything since its process began (start-up, MPI, data, this pull) as down time.
  const double startup_s = isolated && restart > 0 ? process_age_s() - wall.seconds() : 0.0;
  book.down += startup_s;
  if (isolated && plan.outer_steps && !resume) {
    Stopwatch join_clock;
    int64_t t0 = first_step - 1;
    Actions none;
    none.lost.assign(P, 0);
    stopped_down = !crash_and_rejoin(none, t0, /*joining=*/true);
    first_step = t0 + 1;
    (restart > 0 ? book.down : book.other) += join_clock.seconds();
  }
  // A resumed job that had already finished has nothing left to do.
  const bool finished = stopped_down || (resume && (plan.mode == Mode::decoupled ? resume->syncer.tokens >= config.token_budget()
                                                                : resume->unit.step >= max_steps));
  for (int64_t t = first_step; !finished; ++t) {
    Stopwatch step_clock;
    if (plan.mode == Mode::ddp && topo.leader) ddp_stop->vote = stop_requested();
    const StepStats s = trainer.step();
    // A non-finite loss or gradient norm (the same on every rank of the unit: both are
    // all-reduced) has poisoned the parameters. Where a crashed unit can rejoin from Θ
    // (diloco, decoupled) the unit starts over from it like a crash without down-time, and
    // the syncer never sees the poison; elsewhere the job cannot go on.
    const bool non_finite = !std::isfinite(s.loss) || !std::isfinite(s.grad_norm);
    if (non_finite && plan.mode != Mode::diloco && plan.mode != Mode::decoupled)
      fail("unit {}: training diverged: loss {}, gradient norm {} at step {}", u, s.loss,
           s.grad_norm, t);
    const double busy = step_clock.seconds() - s.allreduce_s;
    // Straggler emulation: this unit's computation takes `slowdown` times longer.
    const double slowdown = std::max(base_slowdown, faults.slowdown_at(job_time()));
    if (slowdown > 1.0)
      std::this_thread::sleep_for(std::chrono::duration<double>((slowdown - 1.0) * busy));
    const double step_s = step_clock.seconds();
    const double compute = step_s - s.allreduce_s;
    book.compute += compute;
    book.wait += s.allreduce_s;
    if (tracks_fragments)
      for (int p = 0; p < P; ++p) unsent[p] += compute * share[p];
    tokens += s.tokens;
    for (int p = 0; p < P; ++p) {
      ++c_steps[p];
      c_tok[p] += s.tokens;
    }
    window_compute += s.compute_s;
    window_loss += s.loss;
    ++window_steps;

    // The leader publishes, decides what to apply and whether to stop; the unit follows.
    Actions actions;
    actions.lost.assign(P, 0);
    actions.sent.assign(P, 0);
    Stopwatch wait_clock;
    if (topo.leader) {
      step_ema = step_ema == 0 ? step_s : 0.9 * step_ema + 0.1 * step_s;
      beat();
      window->set_control(sync::kStepsDone, t);
      window->set_control(sync::kTokensDone, tokens);
      window->set_control(sync::kStepTimeNs, static_cast<int64_t>(step_ema * 1e9));
      if (gpu) publish_landed();
      if (config.debug.stall_unit == u && !stalled && t >= config.debug.stall_at_step &&
          ckpt_done >= config.debug.stall_after_checkpoints) {
        // Test hook: hold this unit, silent, until the others have moved the syncer on.
        stalled = true;
        while (window->control(sync::kGlobalVersion) < config.debug.stall_until_merges &&
               !stop_requested())
          backoff.idle();
        backoff.reset();
      }
      auto publish = [&](int p) {
        if (gpu && snap_meta[p]) {  // p's last snapshot, H steps ago, has not landed yet (!)
          gpu->wait_snapshot(p);
          publish_snapshot(p);
        }
        if (!window->outbox_free(p)) {  // the syncer has not read the previous one yet
          window->set_control(sync::kPublishSkipped, ++skipped);
          return;
        }
        if (config.debug.nan_unit == u && t >= config.debug.nan_at_step && !nan_injected) {
          // Test hook: the leader's parameters turn NaN just before a snapshot that is
          // published (the syncer must refuse it); its next loss, all-reduced, is NaN on
          // every rank of the unit.
          poison(trainer.model().parameters());
          trainer.upload_state(false);  // cuda: the device's parameters turn NaN
          nan_injected = true;
        }
        const sync::SnapshotMeta meta{c_steps[p], c_tok[p], t, base_version[p]};
        if (gpu) {
          gpu->start_snapshot(p);  // published once it lands (publish_landed)
          snap_meta[p] = meta;
        } else {
          fragments.pack(p, trainer.model().parameters(), std::span<float>(packed.data(), layout.numel(p)));
          last_seq[p] = seq_base[p] + window->publish(p, std::span<const float>(packed.data(), layout.numel(p)), meta);
        }
        sent_step[p] = t;
        ++sends[p];
        actions.sent[p] = 1;
      };
      if (plan.outer_steps) {
        if (!non_finite)  // poisoned parameters are never published
          for (int p : fragments.due_after(t)) publish(p);
      } else if (u == 0 && (t % eval_period == 0 || t == max_steps)) {
        publish(0);  // ddp: ship θ to the syncer for global evaluation
      }
      // A merged fragment is applied τ steps after this unit sent its own snapshot of it, never
      // in between: applying a merge before our snapshot left would discard the local progress
      // it carries. (Decoupled: the newest merge then, whether or not it includes ours; ours
      // is merged later, with its staleness.)
      auto take = [&](int p) {
        const int64_t v = window->inbox_version(p);
        if (v <= pending_version[p]) return;
        if (!window->take_inbox(p, pending[p]))
          fail("unit {}: merged fragment {} version {} failed its checksum", u, p, v);
        pending_version[p] = v;
        if (gpu_overwrite) gpu->stage_merge(p, pending[p]);  // to the device while we train
      };
      bool crash_ready = false;  // a crash came due while waiting: take it at this step
      for (int p = 0; p < P && plan.outer_steps; ++p) {
        take(p);
        const bool owed = sent_step[p] >= 0 && t >= sent_step[p] + plan.overlap;
        if (owed && plan.learners_wait) {
          // Synchronous modes: every merge includes every unit, so the merge of our k-th
          // snapshot is version k. Decoupled with τ = 0: any merge newer than ours.
          const int64_t want = plan.mode == Mode::decoupled ? applied[p] + 1 : sends[p];
          // The merge may need our own snapshot, still on its way to host memory.
          if (gpu && pending_version[p] < want) publish_all();
          // A crash due meanwhile happens on time: a unit that waits can fail too.
          while (pending_version[p] < want && !stop_requested() && !crash_ready) {
            if ((crash_ready = crash_now())) break;
            backoff.idle();
            take(p);
            beat();  // alive while waiting
          }
          backoff.reset();
        }
        if (owed && pending_version[p] > applied[p]) actions.apply.emplace_back(p, pending_version[p]);
      }
      actions.stop = (plan.mode == Mode::ddp ? ddp_stop->agreed : stop_requested()) || t >= max_steps;
      if (const int64_t last_round = window->control(sync::kStopAfterVersion); last_round > 0) {
        int64_t round = applied[0];  // diloco (P = 1): the round this step ends on
        for (const auto& [p, version] : actions.apply) round = std::max(round, version);
        actions.stop |= round >= last_round;
      }
      // A checkpoint's unit file: when asked for, and when the job stops (the syncer then
      // completes that checkpoint once every unit has stopped).
      if (checkpoints) {
        const int64_t want = window->control(sync::kCheckpointWant);
        if (actions.stop && (config.checkpoint.at_stop || want > ckpt_done))
          actions.checkpoint = std::max(window->control(sync::kCheckpointNext), ckpt_done + 1);
        else if (want > ckpt_done)
          actions.checkpoint = want;
      }
      if (plan.mode == Mode::decoupled)
        actions.schedule_step = window->control(sync::kJobTokens) / job_step_tokens;
      if (non_finite && !actions.stop) {
        log.write({{"event", "non_finite"}, {"unit", u}, {"step", t}, {"tokens", tokens},
                   {"elapsed_s", wall.seconds()}, {"train_loss", s.loss},
                   {"grad_norm", s.grad_norm}});
        // Down for no time: straight back from Θ. The snapshots already published were taken
        // before the parameters went bad: they stay for the syncer, nothing is lost.
        actions.crash = true;
        crash_cause = "non_finite";
        crash_late_s = 0;
        if (gpu) publish_all();  // taken before the parameters went bad, as on the CPU path
      } else if (const auto gone_s = !actions.stop && sync_link.reconnected ? sync_link.reconnected()
                                                                            : std::nullopt) {
        // A restarted syncer (from its checkpoint) admitted us again: what we sent the old
        // one since is not in its Θ. Start over from its Θ, down for no time, like a rejoin.
        log.write({{"event", "syncer_back"}, {"unit", u}, {"step", t}, {"tokens", tokens},
                   {"no_syncer_s", *gone_s}, {"elapsed_s", wall.seconds()}});
        actions.crash = true;
        crash_cause = "syncer_restart";
        crash_late_s = 0;
      } else if (!actions.stop && (crash_ready || crash_now())) {
        const chaos::Fault* crash = faults.crash_due(job_time());
        crash_cause = "chaos";
        actions.crash = true;
        // Steps and waits are not interrupted: in ddp a crash due inside the all-reduce takes
        // effect after it, with the down-time it has left (logged as late_s).
        crash_late_s = job_time() - crash->start_s;
        actions.down_ms = static_cast<int64_t>(1e3 * std::max(0.0, crash->end_s() - job_time()));
        for (int p = 0; p < P; ++p) actions.lost[p] = !window->outbox_free(p);
        for (int p = 0; p < P && gpu; ++p)
          if (snap_meta[p]) {  // never published: it dies with the unit
            actions.lost[p] = 1;
            snap_meta[p].reset();
          }
      }
      if (actions.crash) {
        actions.apply.clear();  // the unit starts over from Θ
        actions.checkpoint = 0;  // ... and writes its file once it is back
      } else if (gpu && (actions.stop || actions.checkpoint > 0)) {
        publish_all();  // the last snapshots reach the syncer; the checkpoint counts them sent
      }
    }
    if (topo.unit_size > 1) {
      auto words = actions.encode(P);
      mpi::broadcast_patient(words, 0, topo.unit_comm);
      actions = Actions::decode(words, P);
    }
    for (int p = 0; p < P && plan.outer_steps; ++p)
      if (actions.sent[p]) {
        in_flight[p] = unsent[p];  // the work the snapshot just published carries
        unsent[p] = 0;
        sent_c_steps[p] = c_steps[p];
        sent_c_tok[p] = c_tok[p];
        if (carry && gpu)
          gpu->download_fragment(p, sent_theta[p]);
        else if (carry)
          fragments.pack(p, trainer.model().parameters(), sent_theta[p]);
      }
    if (actions.schedule_step >= 0) trainer.set_schedule_step(actions.schedule_step);
    for (const auto& [p, version] : actions.apply) {
      if (gpu_overwrite) {
        gpu->apply_merge(p);  // the leader's staged upload, NCCL-broadcast in the unit
      } else {
        const std::span<float> buf = fragment_from_leader(p);
        const std::span<float> mine(packed.data(), buf.size());
        if ((blend || carry) && gpu)
          gpu->download_fragment(p, mine);
        else if (blend || carry)
          fragments.pack(p, trainer.model().parameters(), mine);
        if (blend)
          for (size_t i = 0; i < buf.size(); ++i) buf[i] = alpha * packed[i] + (1 - alpha) * buf[i];
        if (carry)  // θ ← Θ + (θ − θ_sent): the τ steps since the snapshot stay
          for (size_t i = 0; i < buf.size(); ++i) buf[i] += packed[i] - sent_theta[p][i];
        if (gpu)
          gpu->upload_fragment(p, buf);
        else
          fragments.unpack(p, buf, trainer.model().parameters());
      }
      // overwrite: the local work on this fragment since its snapshot left never reaches the
      // global model (blend keeps α of it); carry keeps it for the next snapshot, which then
      // counts the steps and tokens since this one, not since the apply.
      const double kept = carry ? 1.0 : blend ? alpha : 0.0;
      book.discarded += (1.0 - kept) * unsent[p];
      unsent[p] *= kept;
      if (carry) {
        c_steps[p] -= sent_c_steps[p];
        c_tok[p] -= sent_c_tok[p];
      } else {
        c_steps[p] = c_tok[p] = 0;
      }
      base_version[p] = applied[p] = version;
      sent_step[p] = -1;
    }
    window_wait += wait_clock.seconds();
    book.wait += wait_clock.seconds();
    window_wall += step_clock.seconds();
    if (actions.checkpoint > 0) {
      Stopwatch write_clock;
      write_checkpoint(actions.checkpoint, t, false, actions.stop);
      book.other += write_clock.seconds();
    }

    Stopwatch other_clock;
    if (topo.leader && (t % config.run.log_every == 0 || actions.stop)) {
      nlohmann::json e = {{"event", "train"},
                 {"unit", u},
                 {"step", t},
                 {"tokens", tokens},
                 {"elapsed_s", wall.seconds()},
                 {"train_loss", window_loss / window_steps},
                 {"lr", s.lr},
                 {"tokens_per_s", window_steps * trainer.tokens_per_step() / window_compute},
                 {"sync_wait_s", window_wait},
                 // Wall time per inner step, everything included (compute, straggler
                 // emulation, publishing, applying, waiting for merges).
                 {"step_s", window_wall / window_steps},
                 {"publish_skipped", skipped},
                 // Where this rank's training stream stands (the leader's): what a resumed
                 // run must reproduce.
                 {"data_cursor", {trainer.data()->cursor().epoch, trainer.data()->cursor().batch}}};
      if (ring) e.update({{"wan_up_bytes", ring->link().up.bytes()}, {"wan_down_bytes", ring->link().down.bytes()}});
      log.write(e);
      window_compute = window_wait = window_loss = window_wall = 0;
      window_steps = 0;
    }
    book.other += other_clock.seconds();
    if (actions.stop) break;
    if (actions.crash) {
      Stopwatch down_clock;
      const bool back = crash_and_rejoin(actions, t);
      book.down += down_clock.seconds();
      if (!back) {
        stopped_down = true;
        break;
      }
    }
  }

  // Stopped while down: the file says so, and the unit restarts from Θ when resumed.
  if (stopped_down && checkpoints) {
    int64_t id = 0;
    if (topo.leader && (config.checkpoint.at_stop || window->control(sync::kCheckpointWant) > ckpt_done))
      id = std::max(window->control(sync::kCheckpointNext), ckpt_done + 1);
    if (topo.unit_size > 1) mpi::check(MPI_Bcast(&id, 1, MPI_INT64_T, 0, topo.unit_comm), "Bcast(checkpoint)");
    if (id > 0) write_checkpoint(id, trainer.steps_done(), true, true);
  }
  // Work never sent: it does not reach the global model.
  for (int p = 0; p < P && tracks_fragments; ++p) book.discarded += unsent[p];
  if (isolated) {
    // Isolated: the unit's book travels in its window (there is no MPI world with the syncer
    // to gather it in); then the leader waits until the syncer has read everything.
    book.allocated = startup_s + wall.seconds();
    const std::vector<double> mine = book.to_vector();
    std::vector<double> sum(mine.size());
    mpi::check(MPI_Reduce(mine.data(), sum.data(), static_cast<int>(mine.size()), MPI_DOUBLE, MPI_SUM, 0,
                          topo.unit_comm),
               "Reduce(time books)");
    if (topo.leader) {
      for (int i = 0; i < TimeBook::kFields; ++i) window->set_control_f64(sync::kTimeBook + i, sum[i]);
      window->set_control(sync::kState, sync::kDone);
      sync_link.wait_released(*window);
      window->close();
    }
  } else if (topo.leader) {
    window->set_control(sync::kState, sync::kDone);
    // The syncer may still read our last snapshot: free the window only once it is done.
    Stopwatch wait_clock;
    mpi::barrier_patient(topo.sync_comm);
    window->close();
    book.wait += wait_clock.seconds();
  }
  if (!isolated) book.allocated = wall.seconds();
  if (ring && link) *link = wan::LinkCounters::of(u, ring->link());
  if (topo.leader) {
    nlohmann::json done = {{"event", "done"}, {"unit", u}, {"step", trainer.steps_done()}, {"tokens", tokens},
                           {"elapsed_s", wall.seconds()}, {"cpu_s", process_cpu_seconds()},
                           {"rejoins", rejoins}, {"time", book.to_json()}};
    if (ring)
      done.update({{"wan_up_bytes", ring->link().up.bytes()}, {"wan_down_bytes", ring->link().down.bytes()},
                   {"wan_wait_s", ring->wait_s()}});
    log.write(done);
  }
  return book;
}

}  // namespace ddiloco
