// Test hooks on the syncer's snapshot reads, installed into SyncerCore by the syncer process so
// that the core itself neither sleeps nor waits for them:
//   debug.crash_during_read   before each read of unit u's snapshot, raise kReadsStarted and
//                             wait (sleeping) until the unit has answered it in kReadSeen, is
//                             done, or is gone: the unit's crash hook then fires mid-read
//   debug.syncer_read_delay_ms  sleep that long before each read: a syncer slower than learners
#pragma once

#include <cstdint>
#include <vector>

#include "ddiloco/config.hpp"
#include "ddiloco/outer_plan.hpp"
#include "ddiloco/sync_window.hpp"

namespace ddiloco::syncer {

class ReadHooks {
 public:
  ReadHooks(const Config& config, const OuterPlan& plan, protocol::SyncerWindow& window, int units);
  bool any() const { return crash_during_read_ || delay_ms_ > 0; }
  void before_read(int u);
  /// A new process of unit u: its window's count starts again from 0.
  void unit_connected(int u) { reads_started_[u] = 0; }

 private:
  void await_read_answer(int u);
  protocol::SyncerWindow* window_;
  bool crash_during_read_;
  int delay_ms_;
  std::vector<int64_t> reads_started_;
};

}  // namespace ddiloco::syncer
