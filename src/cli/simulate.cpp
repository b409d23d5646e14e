// `ddiloco simulate` and `ddiloco bench simulate`: the goodput simulator's front end
// (tables, JSON, the sweep grid, calibration against the paper's 150k and 1.2M columns).
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.hpp"
#include "cli/key_table.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/simulate.hpp"

namespace ddiloco::cli {

namespace {

using sim::SimConfig;
using sim::SimResult;
using sim::Strategy;

std::string percent(double x) { return fmt::format("{:.1f} %", 100 * x); }

std::string row_name(const SimResult& r) {
  switch (r.strategy) {
    case Strategy::dp: return "dp";
    case Strategy::elastic_dp: return "elastic_dp";
    case Strategy::decoupled: return fmt::format("decoupled M={} K={}", r.learners, r.quorum);
  }
  return "?";
}

std::string describe(const SimConfig& c, const std::string& source) {
  const double job_mtbf_s = c.mtbi_hours * 3600 / static_cast<double>(c.chips);
  return fmt::format(
      "{}: {} chips, {}, recovery {} {:.3g} min, step {:.3g} s, {:.3g} days × {} run{}",
      source.empty() ? "defaults" : source, c.chips,
      c.failures ? fmt::format("MTBI {:.4g} h per chip (a failure every {:.3g} s)",
                               c.mtbi_hours, job_mtbf_s)
                 : std::string("no failures"),
      c.recovery, c.recovery_minutes, c.step_seconds, c.days, c.repeats,
      c.repeats > 1 ? "s" : "");
}

void print_table(const std::vector<SimResult>& results) {
  std::printf("%-22s %9s %8s %7s %6s %6s %7s %6s %7s %9s %9s\n", "strategy", "goodput",
              "uptime", "lost", "down", "paused", "ckpt", "strag", "pending", "failures",
              "merges");
  for (const auto& r : results) {
    const double all = r.chip_time.total();
    auto share = [&](double x) { return all > 0 ? percent(x / all) : std::string("-"); };
    std::string goodput = percent(r.goodput);
    if (r.repeats > 1) goodput += fmt::format(" ±{:.1f}", 100 * r.goodput_stddev);
    std::printf("%-22s %9s %8s %7s %6s %6s %7s %6s %7s %9lld %9s\n", row_name(r).c_str(),
                goodput.c_str(), percent(r.uptime).c_str(), share(r.chip_time.lost).c_str(),
                share(r.chip_time.down).c_str(), share(r.chip_time.paused).c_str(),
                share(r.chip_time.checkpoint).c_str(), share(r.chip_time.straggler).c_str(),
                share(r.chip_time.pending).c_str(), static_cast<long long>(r.failures),
                r.strategy == Strategy::decoupled ? std::to_string(r.merges).c_str() : "-");
  }
  for (const auto& r : results) {
    if (r.checkpoints > 0)
      std::printf("%s checkpoints every %.4g s of compute%s (%lld written)\n",
                  row_name(r).c_str(), r.checkpoint_interval_s,
                  r.strategy == Strategy::dp ? "" : ", in memory",
                  static_cast<long long>(r.checkpoints));
    if (r.strategy != Strategy::decoupled || r.merges == 0) continue;
    std::string line;
    for (size_t k = 1; k < r.quorum_sizes.size(); ++k)
      if (r.quorum_sizes[k] > 0) {
        const double share =
            100.0 * static_cast<double>(r.quorum_sizes[k]) / static_cast<double>(r.merges);
        line += share < 0.05 ? fmt::format("  {}: <0.1 %", k)
                             : fmt::format("  {}: {:.1f} %", k, share);
      }
    std::printf("%s quorum sizes (share of merges):%s\n", row_name(r).c_str(), line.c_str());
  }
}

std::string chips_label(int64_t n) {
  if (n >= 1'000'000) return fmt::format("{:.3g}M", static_cast<double>(n) / 1e6);
  if (n >= 1'000) return fmt::format("{:.3g}k", static_cast<double>(n) / 1e3);
  return std::to_string(n);
}

// One grid (rows: strategies, columns: chip counts) of `value` per result.
template <typename F>
void print_grid(const SimConfig& c, const std::vector<SimResult>& results, const char* title,
                F value) {
  std::printf("%s (rows: strategy, columns: chips)\n%-14s", title, "");
  for (int64_t n : c.sweep_chips) std::printf(" %9s", chips_label(n).c_str());
  std::printf("\n");
  const size_t per_column = 2 + c.sweep_learners.size();
  for (size_t row = 0; row < per_column; ++row) {
    const SimResult& first = results[row];
    std::string name = first.strategy == Strategy::decoupled
                           ? fmt::format("decoupled M={}", first.learners)
                           : std::string(strategy_name(first.strategy));
    std::printf("%-14s", name.c_str());
    for (size_t col = 0; col < c.sweep_chips.size(); ++col)
      std::printf(" %9s", percent(value(results[col * per_column + row])).c_str());
    std::printf("\n");
  }
}

int run_calibration(SimConfig c, const std::string& source) {
  sim::check_calibration(c, source);
  std::printf("calibrating on %lld and %lld chips, %.3g days × %d runs (seed %lld)\n",
              static_cast<long long>(c.calibration_chips[0]),
              static_cast<long long>(c.calibration_chips[1]), c.days, c.repeats,
              static_cast<long long>(c.seed));
  c = sim::calibrate(c, source);
  std::printf("fitted: dp.checkpoint_seconds: %.4g   chips.recovery_minutes: %.4g\n"
              "        elastic.checkpoint_seconds: %.4g   elastic.rescale_seconds: %.4g\n",
              c.checkpoint_seconds, c.recovery_minutes, c.elastic_checkpoint_seconds,
              c.rescale_seconds);
  std::printf("%-9s %-16s %9s %9s %9s\n", "chips", "strategy", "paper", "simulated",
              "residual");
  auto line = [&](int64_t chips, Strategy s, int learners, double paper) {
    SimConfig t = c;
    t.chips = chips;
    t.learners = learners;
    t.quorum = std::min(c.quorum, learners);
    const SimResult r = sim::simulate(t, s);
    std::printf("%-9s %-16s %9s %9s %+8.1f pt\n", chips_label(chips).c_str(),
                (s == Strategy::decoupled ? fmt::format("decoupled M={}", learners)
                                          : std::string(strategy_name(s)))
                    .c_str(),
                percent(paper).c_str(), percent(r.goodput).c_str(), 100 * (r.goodput - paper));
  };
  for (size_t col = 0; col < 2; ++col) {
    const int64_t n = c.calibration_chips[col];
    line(n, Strategy::dp, 1, c.calibration_dp[col]);
    line(n, Strategy::elastic_dp, 1, c.calibration_elastic_dp[col]);
    if (col == 0)
      for (size_t i = 0; i < c.sweep_learners.size(); ++i)
        line(n, Strategy::decoupled, c.sweep_learners[i], c.calibration_decoupled[i]);
    else
      line(n, Strategy::decoupled, c.calibration_headline_learners,
           c.calibration_headline_decoupled);
  }
  return 0;
}

}  // namespace

int simulate(const SimulateOptions& o) {
  if (o.list) {
    print_key_table(sim::sim_config_keys(), o.markdown);
    return 0;
  }
  const SimConfig c = sim::load_sim_config(o.config, o.overrides);
  if (o.calibrate) {
    if (o.sweep || o.json) fail("--calibrate prints its own table: drop --sweep and --json");
    return run_calibration(c, o.config.empty() ? "defaults" : o.config);
  }
  if (o.sweep) {
    const std::vector<SimResult> grid = sim::sweep(c);
    if (o.json) {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& r : grid)
        out.push_back({{"strategy", strategy_name(r.strategy)},
                       {"chips", r.chips},
                       {"learners", r.learners},
                       {"goodput", r.goodput}});
      std::printf("%s\n", out.dump(1).c_str());
      return 0;
    }
    std::printf("%s\n", describe(c, o.config).c_str());
    print_grid(c, grid, "goodput", [](const SimResult& r) { return r.goodput; });
    print_grid(c, grid, "uptime of the global model",
               [](const SimResult& r) { return r.uptime; });
    return 0;
  }
  std::vector<SimResult> results;
  for (const auto& name : c.strategies)
    results.push_back(sim::simulate(c, sim::parse_strategy(name, "sim.strategies")));
  if (o.json) {
    nlohmann::json out = {{"config", o.config}, {"results", nlohmann::json::array()}};
    for (const auto& r : results) out["results"].push_back(sim::to_json(r));
    std::printf("%s\n", out.dump(1).c_str());
    return 0;
  }
  std::printf("%s\n", describe(c, o.config).c_str());
  print_table(results);
  return 0;
}

int bench_simulate(const BenchSimulateOptions& o) {
  SimConfig c = sim::load_sim_config(o.config, o.overrides);
  std::printf("%s\n", describe(c, o.config.empty() ? "defaults" : o.config).c_str());
  std::printf("%-22s %10s %12s %12s %10s\n", "strategy", "run_s", "events", "events/s",
              "of_budget");
  double worst = 0;
  for (const auto& name : c.strategies) {
    const SimResult r = sim::simulate(c, sim::parse_strategy(name, "sim.strategies"));
    const double per_run = r.run_seconds / r.repeats;
    worst = std::max(worst, per_run);
    std::printf("%-22s %10.3f %12lld %12.3g %9.1f%%\n", row_name(r).c_str(), per_run,
                static_cast<long long>(r.events / r.repeats),
                static_cast<double>(r.events) / r.run_seconds, 100 * per_run / o.budget_s);
  }
  std::printf("slowest_run_s=%.3f budget_s=%.3g ratio=%.3f\n", worst, o.budget_s,
              worst / o.budget_s);
  return worst <= o.budget_s ? 0 : 1;
}

}  // namespace ddiloco::cli
