#include "ddiloco/goodput.hpp"

#include <algorithm>

namespace ddiloco {

TimeBook& TimeBook::operator+=(const TimeBook& o) {
  compute += o.compute;
  wait += o.wait;
  down += o.down;
  other += o.other;
  discarded += o.discarded;
  allocated += o.allocated;
  return *this;
}

nlohmann::json TimeBook::to_json() const {
  return {{"compute_s", compute}, {"wait_s", wait},         {"down_s", down},
          {"other_s", other},     {"discarded_s", discarded}, {"useful_s", useful()},
          {"allocated_s", allocated}, {"booked_s", booked()}, {"goodput", goodput()}};
}

std::vector<double> TimeBook::to_vector() const {
  return {compute, wait, down, other, discarded, allocated};
}

TimeBook TimeBook::from_vector(const double* v) {
  TimeBook b;
  b.compute = v[0];
  b.wait = v[1];
  b.down = v[2];
  b.other = v[3];
  b.discarded = v[4];
  b.allocated = v[5];
  return b;
}

void GlobalDowntime::interval(double length, double nominal) {
  longest_ = std::max(longest_, length);
  if (nominal > 0 && length > factor_ * nominal) {
    downtime_ += length;
    ++episodes_;
  }
}

void GlobalDowntime::update(double now_s, double nominal_period_s) {
  if (started_) interval(now_s - last_, nominal_period_s);
  started_ = true;
  last_ = now_s;
}

double GlobalDowntime::finish(double end_s, double nominal_period_s) {
  if (started_) interval(end_s - last_, nominal_period_s);
  last_ = end_s;
  return downtime_;
}

}  // namespace ddiloco
