// A learner rank in a multi-unit job: inner steps as in a single unit, plus the outer loop —
// counters per fragment, publishing snapshots when due, applying merged fragments τ steps
// after sending (paper_notes.md, "Learner m, every inner step").
#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <thread>

#include <omp.h>

#include "ddiloco/error.hpp"
#include "ddiloco/fragments.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/runtime.hpp"
#include "ddiloco/signals.hpp"
#include "ddiloco/sync_window.hpp"
#include "ddiloco/trainer.hpp"

namespace ddiloco {

namespace {

// ddp: the unit's gradients are summed to its leader, summed across leaders over the WAN
// (the leaders' communicator), averaged over every learner rank, and broadcast in the unit.
UnitTrainer::GradientReducer hierarchical_reducer(const Topology& topo, int total_ranks) {
  return [&topo, total_ranks](std::span<float> grads, double loss) {
    mpi::reduce_sum(grads, 0, topo.unit_comm);
    double loss_sum = loss;
    if (topo.unit_size > 1)
      mpi::check(MPI_Allreduce(MPI_IN_PLACE, &loss_sum, 1, MPI_DOUBLE, MPI_SUM, topo.unit_comm),
                 "Allreduce(loss)");
    if (topo.leader) {
      mpi::allreduce_sum_patient(grads, topo.leaders_comm);
      loss_sum = mpi::allreduce_sum_patient(loss_sum, topo.leaders_comm);
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
  std::vector<std::pair<int, int64_t>> apply;  // (fragment, version)
  int64_t schedule_step = -1;                  // the lr schedule's step for the next step

  std::vector<int64_t> encode(int fragments) const {
    std::vector<int64_t> w(3 + 2 * static_cast<size_t>(fragments), 0);
    w[0] = stop;
    w[1] = static_cast<int64_t>(apply.size());
    w.back() = schedule_step;
    for (size_t i = 0; i < apply.size(); ++i) {
      w[2 + 2 * i] = apply[i].first;
      w[3 + 2 * i] = apply[i].second;
    }
    return w;
  }
  static Actions decode(const std::vector<int64_t>& w) {
    Actions a;
    a.stop = w[0] != 0;
    a.schedule_step = w.back();
    for (int64_t i = 0; i < w[1]; ++i) a.apply.emplace_back(static_cast<int>(w[2 + 2 * i]), w[3 + 2 * i]);
    return a;
  }
};

}  // namespace

void run_learner(const Config& config, const OuterPlan& plan, const Topology& topo,
                 UnitTrainer& trainer) {
  const int threads = omp_get_max_threads();  // set by run_job
  if (plan.mode == Mode::ddp) trainer.set_gradient_reducer(hierarchical_reducer(topo, topo.stream_count));

  const FragmentPlan fragments(trainer.model().layout(), plan.fragments, plan.h);
  const sync::WindowLayout layout(fragments);
  std::optional<sync::LearnerWindow> window;
  if (topo.leader) window.emplace(topo.sync_comm, layout);

  const int P = fragments.size();
  const int u = topo.unit;
  const double slowdown = config.units.slowdown.empty() ? 1.0 : config.units.slowdown[u];
  const bool blend = config.outer.apply == "blend";
  const float alpha = static_cast<float>(config.outer.blend_alpha);
  const int64_t eval_period = static_cast<int64_t>(plan.h) * config.syncer.eval_every;
  // Decoupled: the lr schedule runs on the job's mean inner step, job tokens ÷ the tokens one
  // step of every unit makes (units of different speed warm up and anneal together).
  int64_t job_step_tokens = 0;
  for (int m = 0; m < topo.units; ++m) job_step_tokens += config.unit_tokens_per_step(m);

  std::vector<int64_t> c_steps(P, 0), c_tok(P, 0), base_version(P, 0), applied(P, 0),
      sent_step(P, -1), sends(P, 0), pending_version(P, 0);
  size_t largest = 0;
  for (const auto& f : fragments.fragments()) largest = std::max(largest, f.numel);
  std::vector<float> packed(largest), incoming(largest);
  // The leader takes each merged fragment out of its inbox as soon as it arrives (so that the
  // syncer can deliver the next one) and keeps the newest here until it is due to be applied.
  std::vector<std::vector<float>> pending(topo.leader ? P : 0);
  for (int p = 0; p < static_cast<int>(pending.size()); ++p) pending[p].resize(layout.numel(p));

  JsonlWriter log;
  if (topo.leader) {
    log = JsonlWriter(std::filesystem::path(config.run.dir) / fmt::format("unit_{}.jsonl", u), true);
    log.write({{"event", "start"}, {"step", 0}, {"tokens", 0}, {"elapsed_s", 0.0},
               {"unit", u}, {"ranks", topo.unit_size}, {"threads_per_rank", threads},
               {"slowdown", slowdown}, {"mode", mode_name(plan.mode)}});
    window->set_control(sync::kState, sync::kRunning);
  }

  Stopwatch wall;
  int64_t tokens = 0, skipped = 0;
  double step_ema = 0, window_compute = 0, window_wait = 0, window_loss = 0, window_wall = 0;
  int64_t window_steps = 0;
  const int64_t max_steps = plan.mode == Mode::decoupled ? INT64_MAX : config.train.steps;
  mpi::Backoff backoff;

  for (int64_t t = 1;; ++t) {
    Stopwatch step_clock;
    const StepStats s = trainer.step();
    if (!std::isfinite(s.loss)) fail("unit {}: training diverged: loss {} at step {}", u, s.loss, t);
    const double busy = step_clock.seconds();
    if (slowdown > 1.0)  // straggler emulation: this unit's steps take `slowdown` times longer
      std::this_thread::sleep_for(std::chrono::duration<double>((slowdown - 1.0) * busy));
    const double step_s = step_clock.seconds();
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
    Stopwatch wait_clock;
    if (topo.leader) {
      step_ema = step_ema == 0 ? step_s : 0.9 * step_ema + 0.1 * step_s;
      window->set_control(sync::kHeartbeat, t);
      window->set_control(sync::kStepsDone, t);
      window->set_control(sync::kTokensDone, tokens);
      window->set_control(sync::kStepTimeNs, static_cast<int64_t>(step_ema * 1e9));
      // Told to stop: by the syncer (token budget, or it was interrupted) or by a signal.
      auto stop_requested = [&] { return window->control(sync::kStop) != 0 || stop_signal() != 0; };
      if (config.debug.stall_unit == u && t == config.debug.stall_at_step) {
        // Test hook: hold this unit until the others have moved the syncer on.
        while (window->control(sync::kGlobalVersion) < config.debug.stall_until_merges &&
               !stop_requested())
          backoff.idle();
        backoff.reset();
      }
      auto publish = [&](int p) {
        if (!window->outbox_free(p)) {  // the syncer has not read the previous one yet
          window->set_control(sync::kPublishSkipped, ++skipped);
          return;
        }
        fragments.pack(p, trainer.model().parameters(), std::span<float>(packed.data(), layout.numel(p)));
        window->publish(p, std::span<const float>(packed.data(), layout.numel(p)),
                        {c_steps[p], c_tok[p], t, base_version[p]});
        sent_step[p] = t;
        ++sends[p];
      };
      if (plan.outer_steps) {
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
      };
      for (int p = 0; p < P && plan.outer_steps; ++p) {
        take(p);
        const bool owed = sent_step[p] >= 0 && t >= sent_step[p] + plan.overlap;
        if (owed && plan.learners_wait) {
          // Synchronous modes: every merge includes every unit, so the merge of our k-th
          // snapshot is version k. Decoupled with τ = 0: any merge newer than ours.
          const int64_t want = plan.mode == Mode::decoupled ? applied[p] + 1 : sends[p];
          while (pending_version[p] < want && !stop_requested()) {
            backoff.idle();
            take(p);
          }
          backoff.reset();
        }
        if (owed && pending_version[p] > applied[p]) actions.apply.emplace_back(p, pending_version[p]);
      }
      actions.stop = stop_requested() || t >= max_steps;
      if (plan.mode == Mode::decoupled)
        actions.schedule_step = window->control(sync::kJobTokens) / job_step_tokens;
    }
    if (topo.unit_size > 1) {
      auto words = actions.encode(P);
      mpi::broadcast_patient(words, 0, topo.unit_comm);
      actions = Actions::decode(words);
    }
    if (actions.schedule_step >= 0) trainer.set_schedule_step(actions.schedule_step);
    for (const auto& [p, version] : actions.apply) {
      std::span<float> buf(incoming.data(), layout.numel(p));
      if (topo.leader) std::copy(pending[p].begin(), pending[p].end(), buf.begin());
      if (topo.unit_size > 1) mpi::broadcast(buf, 0, topo.unit_comm);
      if (blend) {
        fragments.pack(p, trainer.model().parameters(), std::span<float>(packed.data(), buf.size()));
        for (size_t i = 0; i < buf.size(); ++i) buf[i] = alpha * packed[i] + (1 - alpha) * buf[i];
      }
      fragments.unpack(p, buf, trainer.model().parameters());
      c_steps[p] = c_tok[p] = 0;
      base_version[p] = applied[p] = version;
      sent_step[p] = -1;
    }
    window_wait += wait_clock.seconds();
    window_wall += step_clock.seconds();

    if (topo.leader && (t % config.run.log_every == 0 || actions.stop)) {
      log.write({{"event", "train"},
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
                 {"publish_skipped", skipped}});
      window_compute = window_wait = window_loss = window_wall = 0;
      window_steps = 0;
    }
    if (actions.stop) break;
  }

  if (topo.leader) {
    window->set_control(sync::kState, sync::kDone);
    log.write({{"event", "done"}, {"unit", u}, {"step", trainer.steps_done()}, {"tokens", tokens},
               {"elapsed_s", wall.seconds()}, {"cpu_s", process_cpu_seconds()}});
    // The syncer may still read our last snapshot: free the window only once it is done.
    mpi::barrier_patient(topo.sync_comm);
    window->close();
  }
}

}  // namespace ddiloco
