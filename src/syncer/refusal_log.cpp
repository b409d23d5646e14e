#include "syncer/refusal_log.hpp"

namespace ddiloco::syncer {

void RefusalLog::roll(double now_s) {
  if (start_s_ < 0) start_s_ = now_s;
}

bool RefusalLog::add(const std::string& reason, int64_t n, double now_s) {
  roll(now_s);
  total_ += n;
  if (n == 1 && printed_ < lines_ && now_s - start_s_ < interval_s_) {
    ++printed_;
    return true;
  }
  if (counted_.total == 0) counted_.from_s = now_s;
  counted_.total += n;
  counted_.by_reason[reason] += n;
  return false;
}

std::optional<RefusalLog::Summary> RefusalLog::take(double now_s, bool force) {
  roll(now_s);
  if (!force && now_s - start_s_ < interval_s_) return std::nullopt;
  // A new interval: its first refusals are printed again.
  start_s_ = now_s;
  printed_ = 0;
  if (counted_.total == 0) return std::nullopt;
  Summary out = std::move(counted_);
  out.to_s = now_s;
  counted_ = Summary{};
  return out;
}

}  // namespace ddiloco::syncer
