// The syncer's link model (unit_links.hpp).
#include "ddiloco/unit_links.hpp"

#include "ddiloco/config.hpp"

namespace ddiloco::syncer {

UnitLinks::UnitLinks(const Config& config, int units)
    : emulated_(wan::emulated(config)), schedule_(chaos::Schedule::from_config(config.chaos, units)) {
  for (int u = 0; u < units; ++u) chaos_.emplace_back(schedule_, u);
  for (int u = 0; u < units; ++u) limited_.push_back(config.wan.bandwidth_of(u) > 0);
  for (int u = 0; u < units; ++u)
    links_.emplace_back(wan::link_spec(config, u), static_cast<uint64_t>(config.run.seed) * 1000 + u);
}

double UnitLinks::factor(int u, double now_s) const {
  return chaos_[u].link_factor_at(elapsed_before_s_ + now_s);
}

// A link wan.* leaves unlimited: how much longer a degraded transfer takes than at the nominal
// rate. The syncer does not wait it out; what crosses counts, or lands, only once it is over.
double UnitLinks::degradation_s(int u, uint64_t raw_bytes, double now_s) const {
  if (limited_[u]) return 0.0;  // its token bucket carries the degradation (its rate factor)
  const double f = factor(u, now_s);
  if (f >= 1.0) return 0.0;
  constexpr double kNominalBytesPerS = ChaosConfig::kNominalLinkMbitS * 1e6 / 8;
  return static_cast<double>(raw_bytes) * (1.0 / f - 1.0) / kNominalBytesPerS;
}

wan::Transfer UnitLinks::snapshot(int u, uint64_t wire_bytes, uint64_t raw_bytes, double now_s) {
  wan::Transfer t = links_[u].up.transfer(wire_bytes, now_s, now_s, factor(u, now_s));
  t.arrive_s += degradation_s(u, raw_bytes, now_s);
  return t;
}

double UnitLinks::merged(int u, uint64_t wire_bytes, uint64_t raw_bytes, double now_s) {
  return links_[u].down.transfer(wire_bytes, now_s, now_s, factor(u, now_s)).arrive_s +
         degradation_s(u, raw_bytes, now_s);
}

double UnitLinks::served(int u, uint64_t bytes, double now_s) { return merged(u, bytes, bytes, now_s); }

uint64_t UnitLinks::down_bytes() const {
  uint64_t b = 0;
  for (const auto& l : links_) b += l.down.bytes();
  return b;
}

}  // namespace ddiloco::syncer
