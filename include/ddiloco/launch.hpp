// `ddiloco launch`: the isolated deployment on one machine. The syncer runs as its own process
// (`ddiloco syncer`) and every learner unit u as its own MPI job (`mpirun -np R ddiloco unit
// --unit u`), so that a unit's failure (even kill -9 of one of its ranks) ends that job only.
// The launcher supervises them:
//
//   start     the syncer first, then every unit job; each child in its own process group,
//             stdin from /dev/null, the launcher's environment plus DDILOCO_RESTART (0 at the
//             first start, then 1, 2, ...) and DDILOCO_LAUNCH_PID;
//   restart   a child that exits non-zero or is killed by a signal is started again after
//             min(backoff_s·2^(n−1), backoff_max_s) before its n-th restart, at most
//             max_restarts times (then it is given up: a unit's job goes on without it; a
//             syncer given up ends the job); a child that exits 0 is done, one that cannot be
//             started at all (no such program) is given up at once. A restarted syncer gets
//             `--resume auto` instead of the first start's --resume/--overwrite;
//   signals   SIGINT, SIGTERM and SIGUSR1 are forwarded to every child (the syncer first): to
//             its process group and to the process group of each of its descendants (Open
//             MPI's mpirun puts every rank in a group of its own). From then on nothing is
//             restarted. A second stop signal SIGKILLs every child at once;
//   the end   when the syncer has ended (exit 0, given up, or stopped by a signal), the unit
//             jobs have drain_s to exit by themselves, then get SIGTERM, then SIGKILL
//             term_grace_s later. The launcher is a child subreaper (PR_SET_CHILD_SUBREAPER):
//             processes orphaned by a child that died (ranks of an mpirun killed with -9) are
//             adopted, killed and reaped. run() returns once no child and no adopted process
//             is left. Its status is the syncer's: its exit code, or 128 + the signal that
//             killed it (signal_exit_status); 128 + the forwarded signal when it was not
//             running then;
//   chaos     `kill` faults (chaos.hpp) SIGKILL one rank of a unit job at their time: the
//             rank's pid comes from its pid file (run_dir.hpp: pid_dir, unit_pid_name); a
//             missing file, one written before the job's current start, a pid that is gone
//             or not in the unit job's process tree make the kill "missed", with the reason.
//             `kill_syncer` SIGKILLs the syncer process;
//   the log   one JSON object per event in launch.jsonl, and one human line on stdout:
//               spawn      role, unit, pid, restart, argv
//               exit       role, unit, pid, restart, status (shell convention: 128 + signal
//                          when killed), signal (0 if none), ran_s
//               restart    role, unit, restart (the coming one), backoff_s
//               give_up    role, unit, restarts, reason
//               kill       role, unit, rank (units), pid, at_s, missed, reason (when missed),
//                          source (chaos | status_page: a request of the syncer's status page)
//               request_refused  file, reason: a malformed kill request
//               forward    signal, syncer (was it running), units (those running)
//               drain      drain_s: the syncer has ended, unit jobs still run
//               terminate  signal (SIGTERM | SIGKILL), role, unit, pid: the end's escalation
//               orphan     pid, comm: an adopted process, killed
//               done       status, restarts {syncer, units: [...]}, given_up: [units],
//                          signal (forwarded, 0 if none), kills, kills_missed
//             every object with "event" and "elapsed_s" (seconds since run() began); role is
//             "syncer" or "unit", unit −1 for the syncer.
//
// Nothing busy-waits: the loop sleeps poll_s between checks (a signal cuts the sleep short).
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace ddiloco {
struct Config;
}

namespace ddiloco::launch {

enum class Role { syncer, unit };
const char* role_name(Role role);  ///< "syncer" | "unit"

/// One supervised process.
struct ChildSpec {
  Role role = Role::unit;
  int unit = -1;                          ///< the unit (role unit); −1 for the syncer
  std::vector<std::string> argv;          ///< argv[0]: a path, or a name looked up in PATH
  std::vector<std::string> restart_argv;  ///< argv of every restart; empty = argv
  std::vector<std::string> env;           ///< "NAME=value" set over the inherited environment
};

/// When a child that failed is started again.
struct RestartPolicy {
  int max_restarts = 10;      ///< per child; 0 = never
  double backoff_s = 1;       ///< before the first restart
  double backoff_max_s = 30;  ///< the cap of the doubling
  /// Seconds before restart number n ≥ 1: min(backoff_s · 2^(n−1), backoff_max_s).
  double backoff(int n) const;
};

/// A SIGKILL the supervisor sends at `at_s` seconds after run() began (chaos kill faults).
struct ScheduledKill {
  double at_s = 0;
  Role role = Role::unit;  ///< syncer: the syncer process; unit: rank `rank` of unit `unit`
  int unit = -1;
  int rank = 0;
  std::string source = "chaos";  ///< who asked: chaos (the schedule) | status_page
};

struct SupervisorOptions {
  RestartPolicy restart;
  double drain_s = 30;       ///< once the syncer has ended, units may exit by themselves this long
  double term_grace_s = 5;   ///< then SIGTERM; SIGKILL after this long
  double poll_s = 0.05;      ///< sleep between checks
  std::filesystem::path log_path;  ///< launch.jsonl (appended to); empty = no log file
  bool truncate_log = false;       ///< start log_path afresh
  bool print = true;               ///< one human line per event on stdout
  std::filesystem::path pid_dir;   ///< where unit ranks write their pid files (kills)
  /// run.dir: the status page's kill requests (status.hpp) are taken from it at every check
  /// and carried out as chaos kills of the unit's rank 0 (source status_page). Empty: none.
  std::filesystem::path run_dir;
  std::vector<ScheduledKill> kills;
  /// Polled at every check: a stop signal (SIGINT, SIGTERM, SIGUSR1) received since the last
  /// call, 0 if none. Empty: none ever.
  std::function<int()> next_signal;
};

struct SupervisorResult {
  int status = 0;                  ///< the launch's exit status (the syncer's, see above)
  int syncer_restarts = 0;
  std::vector<int> unit_restarts;  ///< per entry of `units` given to run()
  std::vector<int> given_up;       ///< units (ChildSpec::unit) given up, in that order
  int signal = 0;                  ///< the stop signal forwarded, 0 if none
  int kills = 0, kills_missed = 0; ///< scheduled kills carried out and missed
};

/// The supervision core of `ddiloco launch`, independent of what the children are.
class Supervisor {
 public:
  explicit Supervisor(SupervisorOptions options);
  /// Starts `syncer` and then every entry of `units`, supervises them as described above and
  /// returns when the syncer has ended and every child and adopted process is reaped. Makes the
  /// calling process a child subreaper and reaps any of its children (waitpid(−1)): call it
  /// from a process with no other children to wait for, from the thread that stays alive (the
  /// children get SIGTERM when it ends: PR_SET_PDEATHSIG). Throws Error when the log cannot be
  /// written.
  SupervisorResult run(const ChildSpec& syncer, const std::vector<ChildSpec>& units);

 private:
  SupervisorOptions options_;
};

/// `ddiloco launch`'s exit status when the syncer was restarted with no checkpoint and no unit
/// holding Θ, so that the run's Θ was re-initialised mid-run (docs/deployments.md "The syncer dying"), and
/// the run otherwise ended well; not with --resume never.
inline constexpr int kThetaLostStatus = 3;

/// What `ddiloco launch` was given.
struct LaunchArgs {
  std::string config_path;
  std::vector<std::string> overrides;  ///< --set key=value, in order
  std::string resume;                  ///< --resume auto|never|DIR ("" = none)
  bool overwrite = false;
  std::string self;                    ///< this binary (default: /proc/self/exe resolved)
};

/// The children of a launch: the syncer, then the job of unit 0, 1, ... .
///   syncer:   <self> syncer --config F [--set k=v]... [--set syncer.http=127.0.0.1:0]
///             [--resume R] [--overwrite] (syncer.http: when the config leaves it empty)
///             restarts: <self> syncer --config F [--set k=v]... --resume auto
///   unit u:   <launch.mpirun> -q --oversubscribe --bind-to none <launch.mpirun_args>...
///             -np <config.unit_ranks(u)> <self> unit --config F --unit u [--set k=v]...
/// Throws Error for a mode other than decoupled, diloco and streaming (ddp needs one MPI world,
/// single has no syncer: both run with `ddiloco train`).
struct LaunchPlan {
  ChildSpec syncer;
  std::vector<ChildSpec> units;
};
LaunchPlan plan_launch(const Config& config, const LaunchArgs& args);

/// The kill and kill_syncer faults of the config's chaos schedule as supervisor kills (none
/// when chaos is off).
std::vector<ScheduledKill> scheduled_kills(const Config& config);

/// `ddiloco launch`: loads and validates the config, checks run.dir (as the syncer will: a
/// directory holding a run needs --overwrite or --resume), clears its stale pid files, installs
/// the stop-signal handlers and supervises the plan, logging to run.dir/launch.jsonl (started
/// afresh unless --resume). Returns the exit status; throws Error for what the user can fix.
int run_launch(const LaunchArgs& args);

}  // namespace ddiloco::launch
