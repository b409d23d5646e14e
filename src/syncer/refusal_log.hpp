// Refused connections, logged so that a flood cannot flood the log: the first few reasons of an
// interval are printed at once, the rest counted and summed up once per interval. Nothing is
// lost from the counts: every refusal is in exactly one printed line or one summary.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace ddiloco::syncer {

class RefusalLog {
 public:
  /// interval_s > 0: the length of one summary's interval, seconds; at most `lines` refusals
  /// are printed one by one in each interval.
  explicit RefusalLog(double interval_s = 10, int lines = 5) : interval_s_(interval_s), lines_(lines) {}

  /// `n` refusals for `reason` at `now_s` (seconds on the caller's clock). True when the
  /// caller should print this one line now; false when it is counted for the summary.
  bool add(const std::string& reason, int64_t n, double now_s);

  /// Refusals counted, not printed, in an interval that has ended.
  struct Summary {
    double from_s = 0, to_s = 0;
    int64_t total = 0;
    std::map<std::string, int64_t> by_reason;
  };
  /// The summary of the interval if it has ended by `now_s` and counted any; it then starts a
  /// new interval. With `force`, whatever is counted now (at the end of the run).
  std::optional<Summary> take(double now_s, bool force = false);
  /// Every refusal so far, printed or summed up.
  int64_t total() const { return total_; }

 private:
  void roll(double now_s);
  double interval_s_;
  int lines_;
  double start_s_ = -1;
  int printed_ = 0;
  Summary counted_;
  int64_t total_ = 0;
};

}  // namespace ddiloco::syncer
