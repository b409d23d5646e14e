// Recovery of Θ from the units' copies (recovery.hpp).
#include "ddiloco/recovery.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ddiloco/error.hpp"

namespace ddiloco::syncer {

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double max_abs_diff(const std::vector<const Offer*>& copies) {
  double worst = 0;
  for (size_t i = 0; i < copies.front()->values.size(); ++i) {
    float lo = copies.front()->values[i], hi = lo;
    for (const Offer* o : copies) {
      lo = std::min(lo, o->values[i]);
      hi = std::max(hi, o->values[i]);
    }
    worst = std::max(worst, static_cast<double>(hi) - static_cast<double>(lo));
  }
  return worst;
}

// Exact copies: the largest group of bit-identical ones (ties: the group of the lowest unit;
// `copies` is in ascending unit order).
void take_majority(const std::vector<const Offer*>& copies, Recovered& r) {
  size_t best = 0, best_count = 0;
  for (size_t i = 0; i < copies.size(); ++i) {
    size_t n = 0;
    for (const Offer* o : copies) n += same_bits(o->values, copies[i]->values);
    if (n > best_count) {
      best = i;
      best_count = n;
    }
  }
  r.values = copies[best]->values;
  for (const Offer* o : copies)
    if (!same_bits(o->values, r.values)) r.outvoted.push_back(o->unit);
}

// Lossy copies: the element-wise mean, accumulated in double.
void take_mean(const std::vector<const Offer*>& copies, Recovered& r) {
  std::vector<double> sum(copies.front()->values.size(), 0.0);
  for (const Offer* o : copies)
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += o->values[i];
  r.values.resize(sum.size());
  for (size_t i = 0; i < sum.size(); ++i) r.values[i] = static_cast<float>(sum[i] / static_cast<double>(copies.size()));
}

}  // namespace

Recovered choose_copy(std::span<const Offer> offers, bool exact) {
  Recovered r;
  for (const Offer& o : offers) r.version = std::max(r.version, o.version);
  if (r.version <= 0) return Recovered{};
  std::vector<const Offer*> copies;
  for (const Offer& o : offers)
    if (o.version == r.version) copies.push_back(&o);
  std::sort(copies.begin(), copies.end(), [](const Offer* a, const Offer* b) { return a->unit < b->unit; });
  for (const Offer* o : copies) {
    if (o->values.size() != copies.front()->values.size())
      fail("recovery: unit {}'s copy at version {} has {} values, unit {}'s has {}", o->unit, r.version,
           o->values.size(), copies.front()->unit, copies.front()->values.size());
    r.from.push_back(o->unit);
  }
  r.max_diff = max_abs_diff(copies);
  if (exact)
    take_majority(copies, r);
  else
    take_mean(copies, r);
  return r;
}

Recovery::Recovery(int units, int quorum, double started_s, double timeout_s, double patience_s)
    : offered_(static_cast<size_t>(std::max(units, 0)), false),
      quorum_(std::min(quorum, units)),
      started_s_(started_s),
      timeout_s_(timeout_s),
      patience_s_(patience_s) {
  if (units < 1 || quorum < 1) fail("recovery: needs ≥ 1 unit and a quorum ≥ 1, got {} and {}", units, quorum);
  if (timeout_s < 0 || patience_s < 0) fail("recovery: times must be ≥ 0, got {} and {}", timeout_s, patience_s);
}

void Recovery::offered(int u, double now_s, bool copies) {
  if (offered_[static_cast<size_t>(u)]) return;
  offered_[static_cast<size_t>(u)] = true;
  ++count_;
  if (copies && ++holders_ == quorum_) quorum_at_s_ = now_s;
}

bool Recovery::complete(double now_s) const {
  if (count_ == static_cast<int>(offered_.size()) || now_s >= started_s_ + timeout_s_) return true;
  return holders_ >= quorum_ && now_s >= quorum_at_s_ + patience_s_;
}

bool Recovery::timed_out(double now_s) const {
  return holders_ < quorum_ && count_ < static_cast<int>(offered_.size()) && now_s >= started_s_ + timeout_s_;
}

}  // namespace ddiloco::syncer
