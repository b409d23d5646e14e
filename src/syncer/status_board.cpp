// The status page's history and its renderings (status_board.hpp).
#include "syncer/status_board.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace ddiloco::syncer {

StatusBoard::StatusBoard(int units)
    : last_merge_(units, -1.0),
      last_loss_(units, std::numeric_limits<double>::quiet_NaN()),
      val_(std::make_shared<std::vector<std::array<double, 3>>>()),
      train_(std::make_shared<std::vector<std::array<double, 4>>>()),
      events_shared_(std::make_shared<std::vector<nlohmann::json>>()) {}

namespace {

double number(const nlohmann::json& e, const char* key) {
  const auto it = e.find(key);
  return it != e.end() && it->is_number() ? it->get<double>() : 0.0;
}

// A copy of `v` with `x` appended, the oldest dropped beyond `cap`: readers hold the old one.
template <class T>
std::shared_ptr<const std::vector<T>> appended(const std::vector<T>& v, T x, size_t cap) {
  auto out = std::make_shared<std::vector<T>>();
  const size_t skip = v.size() + 1 > cap ? v.size() + 1 - cap : 0;
  out->reserve(v.size() + 1 - skip);
  out->insert(out->end(), v.begin() + static_cast<std::ptrdiff_t>(skip), v.end());
  out->push_back(std::move(x));
  return out;
}

}  // namespace

void StatusBoard::event(const nlohmann::json& e) {
  const std::string name = e.value("event", std::string());
  const double at = number(e, "elapsed_s");
  if (name == "merge") {
    if (first_merge_ < 0) first_merge_ = at;
    merge_times_.push_back(at);
    if (const auto units = e.find("units"); units != e.end() && units->is_array())
      for (const auto& u : *units)
        if (u.is_number_integer() && u.get<int64_t>() >= 0 && u.get<size_t>() < last_merge_.size())
          last_merge_[u.get<size_t>()] = at;
    return;
  }
  if (name == "global_eval") {
    if (const auto loss = e.find("val_loss"); loss != e.end() && loss->is_number())
      val_ = appended(*val_, {number(e, "tokens"), at, loss->get<double>()},
                      std::numeric_limits<size_t>::max());
    return;
  }
  // Copied for readers at the next publication, not here: a unit that makes the syncer log
  // many events costs the merge loop a push each.
  events_.push_back(e);
  if (events_.size() > kEvents) events_.pop_front();
  events_dirty_ = true;
}

void StatusBoard::train_loss(int u, double loss, int64_t tokens, double now_s) {
  // 0 until the unit's first log interval; the same bits until its next.
  if (loss == 0 || loss == last_loss_[u] || (std::isnan(loss) && std::isnan(last_loss_[u]))) return;
  last_loss_[u] = loss;
  train_ = appended(*train_, {static_cast<double>(u), static_cast<double>(tokens), now_s, loss}, kTrainSamples);
}

double StatusBoard::merge_rate(double now_s) {
  while (!merge_times_.empty() && merge_times_.front() < now_s - kRateWindowS) merge_times_.pop_front();
  if (merge_times_.empty()) return 0;
  const double span = std::min(kRateWindowS, now_s - first_merge_);
  return span > 0 ? static_cast<double>(merge_times_.size()) / span : 0;
}

void StatusBoard::attach_history(StatusSnapshot& s) {
  if (events_dirty_) {
    events_shared_ = std::make_shared<const std::vector<nlohmann::json>>(events_.begin(), events_.end());
    events_dirty_ = false;
  }
  s.val_loss = val_;
  s.train_loss = train_;
  s.events = events_shared_;
}

void StatusBoard::publish(std::shared_ptr<const StatusSnapshot> s) {
  const std::lock_guard lock(mutex_);
  latest_ = std::move(s);
}

std::shared_ptr<const StatusSnapshot> StatusBoard::latest() const {
  const std::lock_guard lock(mutex_);
  return latest_;
}

// ---------------------------------------------------------------- renderings

namespace {

// JSON has no NaN or infinity: a unit's claimed loss may be either.
nlohmann::json finite_or_null(std::optional<double> x) {
  return x && std::isfinite(*x) ? nlohmann::json(*x) : nlohmann::json();
}

nlohmann::json unit_json(const UnitStatus& u) {
  return {{"unit", u.unit},
          {"state", u.state},
          {"pid", u.pid > 0 ? nlohmann::json(u.pid) : nlohmann::json()},
          {"host", u.host.empty() ? nlohmann::json() : nlohmann::json(u.host)},
          {"restarts", u.restarts},
          {"steps", u.steps},
          {"tokens", u.tokens},
          {"staleness", u.staleness},
          {"last_merge_s", u.last_merge_s >= 0 ? nlohmann::json(u.last_merge_s) : nlohmann::json()},
          {"bytes_up", u.bytes_up},
          {"bytes_down", u.bytes_down},
          {"train_loss", finite_or_null(u.train_loss)},
          {"step_time_s", u.step_time_s}};
}

template <size_t N>
nlohmann::json curve_json(const std::vector<std::array<double, N>>& points) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& p : points) {
    if (!std::isfinite(p[N - 1])) continue;
    nlohmann::json row = nlohmann::json::array();
    for (double x : p) row.push_back(x);
    out.push_back(std::move(row));
  }
  return out;
}

}  // namespace

nlohmann::json to_json(const StatusSnapshot& s) {
  nlohmann::json units = nlohmann::json::array();
  for (const UnitStatus& u : s.units) units.push_back(unit_json(u));
  return {{"schema", "ddiloco.status/1"},
          {"elapsed_s", s.elapsed_s},
          {"run", s.run},
          {"progress",
           {{"tokens", s.tokens}, {"merges", s.merges}, {"versions", s.versions},
            {"merge_rate_per_s", s.merge_rate}, {"stopping", s.stopping},
            {"checkpoint_wanted", s.checkpoint_wanted}, {"recovering", s.recovering}}},
          {"units", std::move(units)},
          {"val_loss", s.val_loss ? curve_json(*s.val_loss) : nlohmann::json::array()},
          {"train_loss", s.train_loss ? curve_json(*s.train_loss) : nlohmann::json::array()},
          {"goodput",
           {{"ratio", finite_or_null(s.goodput)}, {"useful_s", s.useful_s}, {"allocated_s", s.allocated_s},
            {"global_downtime_s", s.global_downtime_s}}},
          {"config", s.config_yaml ? *s.config_yaml : std::string()},
          {"events", s.events ? nlohmann::json(*s.events) : nlohmann::json::array()},
          {"actions", {{"kill", s.actions.kill}, {"checkpoint", s.actions.checkpoint}, {"stop", s.actions.stop}}}};
}

namespace {

// A sample value as the exposition format spells it: Go's float syntax, with NaN, +Inf, -Inf.
std::string prom_value(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", x);
}

struct PromWriter {
  std::string out;
  void family(const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(const char* name, double value, const std::string& labels = "") {
    if (labels.empty())
      out += fmt::format("{} {}\n", name, prom_value(value));
    else
      out += fmt::format("{}{{{}}} {}\n", name, labels, prom_value(value));
  }
};

std::string unit_label(int u) { return fmt::format("unit=\"{}\"", u); }

void unit_families(PromWriter& w, const std::vector<UnitStatus>& units) {
  auto each = [&](const char* name, const char* type, const char* help, auto value) {
    w.family(name, type, help);
    for (const UnitStatus& u : units) w.sample(name, value(u), unit_label(u.unit));
  };
  each("ddiloco_unit_up", "gauge", "1 while the unit trains and is heard from, else 0.",
       [](const UnitStatus& u) { return u.state == "training" ? 1.0 : 0.0; });
  each("ddiloco_unit_steps_total", "counter", "Inner steps the unit reports, its earlier processes' included.",
       [](const UnitStatus& u) { return static_cast<double>(u.steps); });
  each("ddiloco_unit_tokens_total", "counter", "Tokens the unit reports, its earlier processes' included.",
       [](const UnitStatus& u) { return static_cast<double>(u.tokens); });
  each("ddiloco_unit_staleness", "gauge", "Merges of a fragment of the global model the unit has not taken yet.",
       [](const UnitStatus& u) { return static_cast<double>(u.staleness); });
  each("ddiloco_unit_restarts_total", "counter", "Processes of the unit that joined after its first.",
       [](const UnitStatus& u) { return static_cast<double>(u.restarts); });
  each("ddiloco_unit_step_seconds", "gauge", "The unit's moving average of its inner-step time.",
       [](const UnitStatus& u) { return u.step_time_s; });
  w.family("ddiloco_unit_train_loss", "gauge", "The unit's mean training loss over its last log interval.");
  for (const UnitStatus& u : units)
    if (u.train_loss) w.sample("ddiloco_unit_train_loss", *u.train_loss, unit_label(u.unit));
  w.family("ddiloco_link_bytes_total", "counter",
           "Bytes on the unit's link since this syncer started: up (unit to syncer), down.");
  for (const UnitStatus& u : units) {
    w.sample("ddiloco_link_bytes_total", static_cast<double>(u.bytes_up), unit_label(u.unit) + ",direction=\"up\"");
    w.sample("ddiloco_link_bytes_total", static_cast<double>(u.bytes_down),
             unit_label(u.unit) + ",direction=\"down\"");
  }
  w.family("ddiloco_units", "gauge", "Units by state.");
  for (const char* state : {"starting", "training", "silent", "lost", "rejoining", "done"}) {
    double n = 0;
    for (const UnitStatus& u : units) n += u.state == state ? 1 : 0;
    w.sample("ddiloco_units", n, fmt::format("state=\"{}\"", state));
  }
}

}  // namespace

std::string to_prometheus(const StatusSnapshot& s) {
  PromWriter w;
  w.family("ddiloco_merges_total", "counter", "Merges of fragments of the global model, over all fragments.");
  w.sample("ddiloco_merges_total", static_cast<double>(s.merges));
  w.family("ddiloco_tokens_total", "counter", "Tokens trained by all units.");
  w.sample("ddiloco_tokens_total", static_cast<double>(s.tokens));
  w.family("ddiloco_fragment_version", "gauge", "Merges of each fragment.");
  for (size_t p = 0; p < s.versions.size(); ++p)
    w.sample("ddiloco_fragment_version", static_cast<double>(s.versions[p]), fmt::format("fragment=\"{}\"", p));
  unit_families(w, s.units);
  w.family("ddiloco_val_loss", "gauge", "The global model's validation loss at its last evaluation.");
  if (s.val_loss && !s.val_loss->empty()) w.sample("ddiloco_val_loss", s.val_loss->back()[2]);
  w.family("ddiloco_goodput_ratio", "gauge", "Useful compute time over allocated time, all units so far.");
  if (s.goodput) w.sample("ddiloco_goodput_ratio", *s.goodput);
  w.family("ddiloco_global_downtime_seconds_total", "counter",
           "Time without merges beyond twice the fragment period, seconds.");
  w.sample("ddiloco_global_downtime_seconds_total", s.global_downtime_s);
  w.family("ddiloco_elapsed_seconds", "gauge", "Seconds since this syncer process started.");
  w.sample("ddiloco_elapsed_seconds", s.elapsed_s);
  w.family("ddiloco_stopping", "gauge", "1 once the job is ending.");
  w.sample("ddiloco_stopping", s.stopping ? 1 : 0);
  return std::move(w.out);
}

}  // namespace ddiloco::syncer
