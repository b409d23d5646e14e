// `ddiloco launch`: the syncer and every unit's MPI job as separate, supervised processes
// (include/ddiloco/launch.hpp; the supervision itself is src/launch/supervisor.cpp).
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <climits>
#include <cstdlib>
#include <csignal>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "ddiloco/chaos.hpp"
#include "ddiloco/config.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/launch.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/run_dir.hpp"

namespace ddiloco::launch {

namespace fs = std::filesystem;

namespace {

// Stop signals as counts, so that a second one is seen as such (signals.hpp keeps the first).
volatile std::sig_atomic_t g_received[3] = {0, 0, 0};
constexpr std::array<int, 3> kStopSignals = {SIGINT, SIGTERM, SIGUSR1};

extern "C" void count_signal(int sig) {
  for (size_t i = 0; i < kStopSignals.size(); ++i)
    if (kStopSignals[i] == sig) g_received[i] = g_received[i] + 1;
}

void install_counting_handlers() {
  struct sigaction action {};
  action.sa_handler = count_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int sig : kStopSignals) ::sigaction(sig, &action, nullptr);
}

// A stop signal received since the last call, 0 if none.
int next_counted_signal() {
  static std::sig_atomic_t seen[3] = {0, 0, 0};
  for (size_t i = 0; i < kStopSignals.size(); ++i)
    if (g_received[i] != seen[i]) {
      ++seen[i];
      return kStopSignals[i];
    }
  return 0;
}

std::string self_exe() {
  std::array<char, PATH_MAX> buf{};
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) fail("launch: cannot read /proc/self/exe, the path of this binary");
  return std::string(buf.data(), static_cast<size_t>(n));
}

}  // namespace

LaunchPlan plan_launch(const Config& config, const LaunchArgs& args) {
  const ModeTraits& mode = mode_traits(config.mode);
  if (!mode.has_syncer)
    fail("launch: mode single is one unit without a syncer: run it with `mpirun -np R ddiloco "
         "train`");
  if (mode.gradient_ring)
    fail("launch: mode ddp needs one MPI world (its gradient all-reduce spans every unit): run "
         "it with `mpirun -np N ddiloco train` (N: `ddiloco config --ranks`)");
  const std::string self = args.self.empty() ? self_exe() : args.self;
  std::vector<std::string> overrides = args.overrides;
  // run.threads: 0 means the cores this process may use ÷ the ranks on its node. A unit job
  // sees only its own ranks, so on this one machine every job would take every core and
  // oversubscribe it (measured: the 4-unit demo ran ~10× slower). Share them as one job
  // would: cores ÷ (the syncer + every unit's ranks), at least 1.
  if (config.run.threads == 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    int cores = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (cores <= 0) cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    int ranks = 1;
    for (int u = 0; u < config.units.count; ++u) ranks += config.unit_ranks(u);
    overrides.push_back(fmt::format("run.threads={}", std::max(1, cores / ranks)));
  }
  std::vector<std::string> common = {"--config", args.config_path};
  for (const std::string& o : overrides) {
    common.push_back("--set");
    common.push_back(o);
  }
  LaunchPlan plan;
  plan.syncer.role = Role::syncer;
  plan.syncer.unit = -1;
  plan.syncer.argv = {self, "syncer"};
  plan.syncer.argv.insert(plan.syncer.argv.end(), common.begin(), common.end());
  // The status page (docs/status_page.md): on, at loopback, unless the config says where or off.
  if (config.syncer.http.empty()) {
    plan.syncer.argv.push_back("--set");
    plan.syncer.argv.push_back("syncer.http=127.0.0.1:0");
  }
  plan.syncer.restart_argv = plan.syncer.argv;
  if (!args.resume.empty()) {
    plan.syncer.argv.push_back("--resume");
    plan.syncer.argv.push_back(args.resume);
  }
  if (args.overwrite) plan.syncer.argv.push_back("--overwrite");
  // A restarted syncer replaces the dead one: its newest checkpoint and the units' copies of
  // Θ (docs/deployments.md "The syncer dying"); with --resume never it starts a fresh run.
  plan.syncer.restart_argv.push_back("--resume");
  plan.syncer.restart_argv.push_back(args.resume == "never" ? "never" : "auto");
  for (int u = 0; u < config.units.count; ++u) {
    ChildSpec unit;
    unit.role = Role::unit;
    unit.unit = u;
    unit.argv = {config.launch.mpirun, "-q", "--oversubscribe", "--bind-to", "none"};
    unit.argv.insert(unit.argv.end(), config.launch.mpirun_args.begin(),
                     config.launch.mpirun_args.end());
    for (const std::string& a : {std::string("-np"), std::to_string(config.unit_ranks(u)), self,
                                 std::string("unit"), std::string("--config"), args.config_path,
                                 std::string("--unit"), std::to_string(u)})
      unit.argv.push_back(a);
    for (const std::string& o : overrides) {
      unit.argv.push_back("--set");
      unit.argv.push_back(o);
    }
    // Everything runs on this machine: a unit's UCX context stays on the loopback device
    // like the syncer's (ucx_link.hpp), instead of opening every interface of the host.
    if (std::getenv("UCX_NET_DEVICES") == nullptr && config.syncer.listen.starts_with("127."))
      unit.env.push_back("UCX_NET_DEVICES=lo");
    plan.units.push_back(std::move(unit));
  }
  return plan;
}

std::vector<ScheduledKill> scheduled_kills(const Config& config) {
  std::vector<ScheduledKill> kills;
  if (!config.chaos.enabled()) return kills;
  std::vector<int> ranks;
  for (int u = 0; u < config.units.count; ++u) ranks.push_back(config.unit_ranks(u));
  const chaos::Schedule schedule =
      chaos::Schedule::from_config(config.chaos, config.units.count, ranks);
  for (const chaos::Fault& f : schedule.launcher_faults()) {
    ScheduledKill k;
    k.at_s = f.start_s;
    k.role = f.kind == chaos::FaultKind::kill_syncer ? Role::syncer : Role::unit;
    k.unit = f.kind == chaos::FaultKind::kill_syncer ? -1 : f.unit;
    k.rank = f.rank;
    kills.push_back(k);
  }
  return kills;
}

// Did a syncer of the run in `metrics`, past byte `from` (where this launch began), say that Θ
// was re-initialised mid-run?
static bool theta_reinitialised(const fs::path& metrics, std::uintmax_t from) {
  for (const auto& e : read_events(metrics, "syncer_recovered", from))
    if (e.value("theta_reinitialised", false)) return true;
  return false;
}

int run_launch(const LaunchArgs& args) {
  // From the start: a signal during set-up is forwarded as soon as the children exist.
  install_counting_handlers();
  const Config config = load_config(args.config_path, args.overrides);
  const LaunchPlan plan = plan_launch(config, args);
  const fs::path dir = config.run.dir;
  // What the syncer will check, checked once here: a refused run.dir would otherwise be a
  // syncer exiting 2 and restarted launch.max_restarts times.
  check_run_dir(dir, args.overwrite || !args.resume.empty());
  if (!args.resume.empty() && args.resume != "auto" && args.resume != "never" && !fs::is_directory(args.resume))
    fail("--resume: '{}' is not a checkpoint directory (give auto, never or a ckpt_<id> directory)",
         args.resume);
  // Pid files of an earlier launch name processes that are gone (or, worse, reused).
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(pid_dir(dir), ec))
    if (e.path().extension() == ".pid") fs::remove(e.path(), ec);

  SupervisorOptions options;
  options.restart.max_restarts = config.launch.max_restarts;
  options.restart.backoff_s = config.launch.backoff_s;
  options.restart.backoff_max_s = config.launch.backoff_max_s;
  options.drain_s = config.launch.drain_s;
  options.log_path = dir / "launch.jsonl";
  options.truncate_log = args.resume.empty();
  options.pid_dir = pid_dir(dir);
  options.run_dir = dir;
  options.kills = scheduled_kills(config);
  options.next_signal = next_counted_signal;
  std::printf("launch: mode %s, the syncer and %d unit job(s) (%s), restarts ≤ %d each; log %s\n",
              mode_name(config.mode), config.units.count, config.launch.mpirun.c_str(),
              config.launch.max_restarts, options.log_path.c_str());
  if (!options.kills.empty())
    std::printf("launch: chaos: %zu kill(s) scheduled\n", options.kills.size());
  std::fflush(stdout);
  std::error_code size_ec;
  const std::uintmax_t metrics_from =
      args.resume.empty() || args.resume == "never" ? 0 : fs::file_size(dir / "metrics.jsonl", size_ec);
  Supervisor supervisor(options);
  const int status = supervisor.run(plan.syncer, plan.units).status;
  // A run whose restarted syncer could recover nothing of Θ ended with a model that is not
  // its budget's: a failure, unless the user asked for fresh restarts (--resume never).
  if (args.resume != "never" && theta_reinitialised(dir / "metrics.jsonl", size_ec ? 0 : metrics_from)) {
    std::fprintf(stderr, "ddiloco: error: launch: the syncer was restarted with no checkpoint and no unit "
                 "holding Θ: the run's Θ was re-initialised mid-run (see the syncer_recovered event in %s); "
                 "exit status %d\n", (dir / "metrics.jsonl").c_str(), kThetaLostStatus);
    return status == 0 ? kThetaLostStatus : status;
  }
  return status;
}

}  // namespace ddiloco::launch
