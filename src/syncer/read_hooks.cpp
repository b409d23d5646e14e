#include "syncer/read_hooks.hpp"

#include <chrono>
#include <thread>

#include "ddiloco/mpi.hpp"

namespace ddiloco::syncer {

ReadHooks::ReadHooks(const Config& config, const OuterPlan& plan, protocol::SyncerWindow& window, int units)
    : window_(&window),
      crash_during_read_(config.debug.crash_during_read && plan.outer_steps),
      delay_ms_(config.debug.syncer_read_delay_ms),
      reads_started_(units, 0) {}

void ReadHooks::before_read(int u) {
  if (crash_during_read_) await_read_answer(u);
  if (delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
}

// Every read of a unit's snapshot is announced, and waits until the unit has answered it at a
// step boundary; a unit with a crash due takes it before it answers, so the read finds its
// memory gone, whatever the machine's load. A unit that has finished or is gone answers
// nothing and is not waited for.
void ReadHooks::await_read_answer(int u) {
  const int64_t n = ++reads_started_[u];
  window_->set_control(u, protocol::kReadsStarted, n);
  mpi::Backoff backoff(1000);
  for (int64_t seen = 0, state = 0;;) {
    if (!window_->fetch_control(u, protocol::kReadSeen, seen) || seen >= n) return;
    if (!window_->fetch_control(u, protocol::kState, state) || state == protocol::kDone) return;
    backoff.idle();
  }
}

}  // namespace ddiloco::syncer
