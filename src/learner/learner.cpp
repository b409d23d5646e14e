// The learner's construction, its step loop and the end of its run (learner.hpp says where
// the rest lives).
#include "learner/learner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <thread>

#include <omp.h>
#include <unistd.h>

#include "ddiloco/error.hpp"
#include "ddiloco/train_loop.hpp"

namespace ddiloco::learner {

namespace {

bool diverged(const StepStats& s) { return !std::isfinite(s.loss) || !std::isfinite(s.grad_norm); }

}  // namespace

TimeBook run_learner(const Config& config, const OuterPlan& plan, const Topology& topo,
                     UnitTrainer& trainer, const LearnerResume* resume, wan::LinkCounters* link,
                     const LearnerLink& sync_link) {
  Learner learner(config, plan, topo, trainer, resume, sync_link);
  TimeBook book = learner.run();
  if (link) *link = learner.link_counters();
  return book;
}

Learner::Settings Learner::Settings::of(const Config& config, const OuterPlan& plan, int unit) {
  Settings s;
  s.unit = unit;
  s.threads = omp_get_max_threads();
  s.base_slowdown = config.units.slowdown.empty() ? 1.0 : config.units.slowdown[unit];
  s.blend = config.outer.apply == "blend";
  s.alpha = static_cast<float>(config.outer.blend_alpha);
  s.tracks_fragments = plan.outer_steps;
  s.checkpoints = config.checkpoint.enabled();
  s.ckpt_root = config.checkpoint.directory(config.run.dir);
  s.eval_period = static_cast<int64_t>(plan.h) * config.syncer.eval_every;
  return s;
}

Learner::Learner(const Config& config, const OuterPlan& plan, const Topology& topo, UnitTrainer& trainer,
                 const LearnerResume* resume, const LearnerLink& sync_link)
    : config_(config),
      plan_(plan),
      topo_(topo),
      trainer_(trainer),
      resume_(resume),
      sync_link_(sync_link),
      set_(Settings::of(config, plan, topo.unit)),
      fragments_(trainer.model().layout(), plan.fragments, plan.h, plan.warmup),
      // In ddp the window only ships θ to the syncer for evaluation, not across the WAN: fp32.
      layout_(fragments_, plan.outer_steps ? wan::wire_codec(config) : wire::Codec{}, config.wan.ef_decay,
              static_cast<size_t>(config.wan.down_topk)),
      gpu_(trainer.gpu()) {
  if (!plan.outer_steps) {  // ddp: the leaders' ring all-reduces the gradients
    if (topo.leader) ddp_.ring = std::make_shared<wan::WanRing>(topo.leaders_comm, config);
    trainer.set_gradient_reducer(hierarchical_reducer(topo, topo.stream_count, ddp_.ring, ddp_.stop));
  }
  if (topo.leader) {
    memory_ = sync_link.expose(layout_.bytes());
    window_.emplace(*memory_, layout_);
  }
  // cuda: the leader's snapshots go device → pinned host asynchronously and are published when
  // they land; merged fragments are scattered on the GPU and NCCL-broadcast in the unit.
  if (gpu_ && plan.outer_steps) gpu_->attach_fragments(fragments_, topo.leader);
  make_core();
  if (topo.leader && LearnerTestHooks::wanted(config.debug, set_.unit))
    hooks_ = std::make_unique<LearnerTestHooks>(config.debug, set_.unit);
  size_t largest = 0;
  for (const auto& f : fragments_.fragments()) largest = std::max(largest, f.numel);
  packed_.resize(largest);
  incoming_.resize(largest);
  work_.resize(fragments_.size());
  for (int p = 0; p < fragments_.size(); ++p) {
    if (core_->settings().carry) work_[p].sent_theta.resize(layout_.numel(p));
    work_[p].share = static_cast<double>(layout_.numel(p)) / trainer.model().layout().size();
  }
}

void Learner::make_core() {
  LearnerCore::Env env;
  env.job_time = [this] { return clock_.job_time(); };
  env.log = [this](nlohmann::json e) { log_event(std::move(e)); };
  env.reconnected = sync_link_.reconnected;
  env.syncer_present = sync_link_.syncer_present;
  if (gpu_) env.flush_snapshots = [this] { publish_all(); };
  if (gpu_ && !set_.blend && !core_->settings().carry)  // overwrite: scattered on the GPU when due
    env.taken = [this](int p, std::span<const float> theta) { gpu_->stage_merge(p, theta); };
  core_.emplace(plan_, fragments_, window_ ? &*window_ : nullptr,
                LearnerCore::Settings::of(config_, plan_, set_.unit, topo_.isolated),
                chaos::UnitTimeline(chaos::Schedule::from_config(config_.chaos, config_.units.count), set_.unit),
                std::move(env));
}

wan::LinkCounters Learner::link_counters() const {
  return ddp_.ring ? wan::LinkCounters::of(set_.unit, ddp_.ring->link()) : wan::LinkCounters{};
}

TimeBook Learner::run() {
  log_start();
  if (resume_) resume_from_checkpoint();
  set_wire_references();
  start_clock();
  join();
  if (!nothing_left()) run_steps(trainer_, first_step_, *this);
  finish();
  return book_;
}

bool Learner::before_step(int64_t) {
  if (!plan_.outer_steps && topo_.leader) {
    ddp_.stop->vote = core_->stop_requested();
    ddp_.stop->want = set_.checkpoints ? core_->requested_checkpoint() : 0;
  }
  return true;
}

// The leader publishes, decides what to apply and whether to stop; the unit follows.
bool Learner::after_step(int64_t& t, const StepStats& s, const Stopwatch& step_clock) {
  const bool non_finite = diverged(s);
  check_diverged(t, s);
  emulate_straggler(step_clock, s);
  const double step_s = step_clock.seconds();
  book_step(s, step_s);

  Stopwatch wait_clock;
  Actions actions = topo_.leader ? decide(t, s, step_s, non_finite) : Actions(fragments_.size());
  broadcast(actions);
  record_sends(actions);
  if (actions.schedule_step >= 0) trainer_.set_schedule_step(actions.schedule_step);
  for (const auto& [p, version] : actions.apply) apply_merge(p, version);
  since_log_.wait += wait_clock.seconds();
  book_.wait += wait_clock.seconds();
  since_log_.wall += step_clock.seconds();

  if (actions.checkpoint > 0) {
    Stopwatch write_clock;
    write_checkpoint(actions.checkpoint, t, false, actions.stop);
    book_.other += write_clock.seconds();
  }
  Stopwatch other_clock;
  log_train(t, s, actions.stop);
  book_.other += other_clock.seconds();
  if (actions.stop) return false;
  return !actions.crash || crash(actions, t);
}

void Learner::log_start() {
  if (!topo_.leader) return;
  // A restarted unit process appends to its predecessors' log.
  log_ = JsonlWriter(std::filesystem::path(config_.run.dir) / fmt::format("unit_{}.jsonl", set_.unit),
                     resume_ == nullptr && sync_link_.restart == 0);
  log_.write({{"event", "start"}, {"step", 0}, {"tokens", 0}, {"elapsed_s", 0.0},
              {"unit", set_.unit}, {"ranks", topo_.unit_size}, {"threads_per_rank", set_.threads},
              {"host", host_name()}, {"pid", static_cast<int64_t>(::getpid())},
              {"restart", sync_link_.restart}, {"processes", sync_link_.processes},
              {"slowdown", set_.base_slowdown}, {"mode", mode_name(plan_.mode)}});
  if (gpu_) {
    // Printed too, so that a run's console says which attention path ran.
    const std::string device = gpu_->describe();
    log_.write({{"event", "device"}, {"unit", set_.unit}, {"step", 0}, {"tokens", 0},
                {"elapsed_s", 0.0}, {"device", device}});
    std::printf("unit %d device: %s\n", set_.unit, device.c_str());
  }
  window_->set_control(protocol::kState, protocol::kRunning);
}

void Learner::start_clock() {
  // Every rank starts its clock when all leave this barrier: the fault schedule's time zero.
  mpi::barrier_patient(topo_.world);
  if (sync_link_.started) sync_link_.started();
  clock_.wall.restart();
  // The fault schedule runs on the job's time: a resumed job goes on where its checkpoint was.
  clock_.resumed_s = resume_ ? resume_->syncer.elapsed_s : 0.0;
  core_->faults().skip_crashes_before(clock_.resumed_s);
  if (ddp_.ring) ddp_.ring->set_rate_factor([this] { return core_->faults().link_factor_at(clock_.job_time()); });
  // A restarted process of the isolated deployment books everything since it began
  // (start-up, MPI, data, the Θ it pulls in join()) as down time.
  clock_.startup_s = topo_.isolated && sync_link_.restart > 0 ? process_age_s() - clock_.wall.seconds() : 0.0;
  book_.down += clock_.startup_s;
}

// A resumed job that had already finished has nothing left to do; nor has a process told to
// stop while it joined.
bool Learner::nothing_left() const {
  return stopped_down_ || (resume_ && (plan_.stops_on_token_budget
                                           ? resume_->syncer.tokens >= config_.token_budget()
                                           : resume_->unit.step >= core_->settings().max_steps));
}

// A non-finite loss or gradient norm (the same on every rank of the unit: both are
// all-reduced) has poisoned the parameters. Where a crashed unit can rejoin from Θ (diloco,
// decoupled) the unit starts over from it like a crash without down-time, and the syncer never
// sees the poison; elsewhere the job cannot go on.
void Learner::check_diverged(int64_t t, const StepStats& s) const {
  if (diverged(s) && !plan_.can_rejoin)
    fail("unit {}: training diverged: loss {}, gradient norm {} at step {}", set_.unit, s.loss, s.grad_norm, t);
}

// Straggler emulation: this unit's computation takes `slowdown` times longer.
void Learner::emulate_straggler(const Stopwatch& step_clock, const StepStats& s) {
  const double busy = step_clock.seconds() - s.allreduce_s;
  const double slowdown = std::max(set_.base_slowdown, core_->faults().slowdown_at(clock_.job_time()));
  if (slowdown > 1.0)
    std::this_thread::sleep_for(std::chrono::duration<double>((slowdown - 1.0) * busy));
}

// The step's time into the book and its work into every fragment's counters.
void Learner::book_step(const StepStats& s, double step_s) {
  const double compute = step_s - s.allreduce_s;
  book_.compute += compute;
  book_.wait += s.allreduce_s;
  if (set_.tracks_fragments)
    for (FragmentWork& w : work_) w.unsent += compute * w.share;
  tokens_ += s.tokens;
  core_->count_step(s.tokens);
  since_log_.compute += s.compute_s;
  since_log_.loss += s.loss;
  ++since_log_.steps;
  ++since_log_.timed;
}

// An event of the core's: the unit's usual fields added.
void Learner::log_event(nlohmann::json event) {
  event.update({{"unit", set_.unit}, {"tokens", tokens_}, {"elapsed_s", clock_.wall.seconds()}});
  log_.write(event);
}

void Learner::log_train(int64_t t, const StepStats& s, bool stop) {
  if (!topo_.leader || (t % config_.run.log_every != 0 && !stop)) return;
  const DataCursor cursor = trainer_.data()->cursor();
  nlohmann::json e = {{"event", "train"},
                      {"unit", set_.unit},
                      {"step", t},
                      {"tokens", tokens_},
                      {"elapsed_s", clock_.wall.seconds()},
                      {"train_loss", since_log_.loss / since_log_.steps},
                      {"lr", s.lr},
                      {"tokens_per_s", since_log_.timed * trainer_.tokens_per_step() / since_log_.compute},
                      {"sync_wait_s", since_log_.wait},
                      // Wall time per inner step, everything included (compute, straggler
                      // emulation, publishing, applying, waiting for merges).
                      {"step_s", since_log_.wall / since_log_.timed},
                      {"publish_skipped", core_->publishes_skipped()},
                      // Where this rank's training stream stands (the leader's): what a
                      // resumed run must reproduce.
                      {"data_cursor", {cursor.epoch, cursor.batch}}};
  core_->report_train_loss(since_log_.loss / since_log_.steps);
  if (ddp_.ring)
    e.update({{"wan_up_bytes", ddp_.ring->link().up.bytes()}, {"wan_down_bytes", ddp_.ring->link().down.bytes()}});
  log_.write(e);
  since_log_ = {};
}

void Learner::finish() {
  // Stopped while down: the file says so, and the unit restarts from Θ when resumed.
  if (stopped_down_ && set_.checkpoints) checkpoint_while_down();
  // Work never sent: it does not reach the global model.
  if (set_.tracks_fragments)
    for (const FragmentWork& w : work_) book_.discarded += w.unsent;
  sign_off();
  if (topo_.leader) log_done();
}

// Tells the syncer this unit is done and closes the window once the syncer no longer needs it;
// the book gets its allocated time.
void Learner::sign_off() {
  if (topo_.isolated) {
    // Isolated: the unit's book travels in its window (there is no MPI world with the syncer
    // to gather it in); then the leader waits until the syncer has read everything.
    book_.allocated = clock_.startup_s + clock_.wall.seconds();
    const std::vector<double> mine = book_.to_vector();
    std::vector<double> sum(mine.size());
    mpi::check(MPI_Reduce(mine.data(), sum.data(), static_cast<int>(mine.size()), MPI_DOUBLE, MPI_SUM, 0,
                          topo_.unit_comm),
               "Reduce(time books)");
    if (topo_.leader) {
      for (int i = 0; i < TimeBook::kFields; ++i) window_->set_control_f64(protocol::kTimeBook + i, sum[i]);
      window_->set_control(protocol::kState, protocol::kDone);
      sync_link_.wait_released(*window_);
      window_->close();
    }
  } else if (topo_.leader) {
    window_->set_control(protocol::kState, protocol::kDone);
    // The syncer may still read our last snapshot: free the window only once it is done.
    Stopwatch wait_clock;
    mpi::barrier_patient(topo_.sync_comm);
    window_->close();
    book_.wait += wait_clock.seconds();
  }
  if (!topo_.isolated) book_.allocated = clock_.wall.seconds();
}

void Learner::log_done() {
  nlohmann::json done = {{"event", "done"}, {"unit", set_.unit}, {"step", trainer_.steps_done()}, {"tokens", tokens_},
                         {"elapsed_s", clock_.wall.seconds()}, {"cpu_s", process_cpu_seconds()},
                         {"rejoins", core_->rejoins()}, {"time", book_.to_json()}};
  if (ddp_.ring)
    done.update({{"wan_up_bytes", ddp_.ring->link().up.bytes()}, {"wan_down_bytes", ddp_.ring->link().down.bytes()},
                 {"wan_wait_s", ddp_.ring->wait_s()}});
  log_.write(done);
}

}  // namespace ddiloco::learner
