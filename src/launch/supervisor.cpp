// The supervision core of `ddiloco launch` (include/ddiloco/launch.hpp): children in their own
// process groups, restarts with exponential backoff, signal forwarding, the drain → SIGTERM →
// SIGKILL end, chaos kills from pid files, and a subreaper's sweep of orphans.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ddiloco/error.hpp"
#include "ddiloco/launch.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/run_dir.hpp"
#include "ddiloco/status.hpp"
#include "ddiloco/signals.hpp"

extern char** environ;

namespace ddiloco::launch {

namespace fs = std::filesystem;
using nlohmann::json;

const char* role_name(Role role) { return role == Role::syncer ? "syncer" : "unit"; }

double RestartPolicy::backoff(int n) const {
  // 2^(n−1) overflows to infinity long before n does; the cap takes it.
  const double b = std::ldexp(backoff_s, std::clamp(n, 1, 2000) - 1);
  return std::min(b, backoff_max_s);
}

namespace {

std::string signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGKILL: return "SIGKILL";
    case SIGHUP: return "SIGHUP";
    case SIGQUIT: return "SIGQUIT";
    case SIGABRT: return "SIGABRT";
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGPIPE: return "SIGPIPE";
    default: return fmt::format("signal {}", sig);
  }
}

// ---------------------------------------------------------------- the process table (/proc)

struct Proc {
  pid_t pid = 0, ppid = 0, pgrp = 0;
  char state = '?';
  std::string comm;
};

std::vector<Proc> read_processes() {
  std::vector<Proc> out;
  DIR* dir = ::opendir("/proc");
  if (dir == nullptr) return out;
  while (const dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    std::ifstream in(fmt::format("/proc/{}/stat", pid));
    std::string line;
    if (!std::getline(in, line)) continue;  // gone meanwhile
    // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
    const size_t open = line.find('('), close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos || close < open) continue;
    Proc p;
    p.pid = static_cast<pid_t>(pid);
    p.comm = line.substr(open + 1, close - open - 1);
    int ppid = 0, pgrp = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %d %d", &p.state, &ppid, &pgrp) != 3) continue;
    p.ppid = ppid;
    p.pgrp = pgrp;
    out.push_back(p);
  }
  ::closedir(dir);
  return out;
}

// Every process below `root` in `procs` (children, their children, ...), root excluded.
std::vector<Proc> descendants(const std::vector<Proc>& procs, pid_t root) {
  std::multimap<pid_t, const Proc*> children;
  for (const Proc& p : procs) children.emplace(p.ppid, &p);
  std::vector<Proc> out;
  std::vector<pid_t> todo{root};
  std::set<pid_t> seen{root};
  while (!todo.empty()) {
    const pid_t parent = todo.back();
    todo.pop_back();
    const auto [lo, hi] = children.equal_range(parent);
    for (auto it = lo; it != hi; ++it)
      if (seen.insert(it->second->pid).second) {
        out.push_back(*it->second);
        todo.push_back(it->second->pid);
      }
  }
  return out;
}

// `sig` to the process group of `root` and to the process group of each of its descendants
// (Open MPI's mpirun starts every rank in a group of its own). Never to our own group.
void signal_tree(pid_t root, int sig) {
  const pid_t own = ::getpgrp();
  std::set<pid_t> groups;
  if (root != own) groups.insert(root);  // a child leads its own group (setpgid at spawn)
  for (const Proc& p : descendants(read_processes(), root)) {
    if (p.pgrp > 1 && p.pgrp != own)
      groups.insert(p.pgrp);
    else
      ::kill(p.pid, sig);
  }
  for (const pid_t g : groups) ::killpg(g, sig);
}

// The executable `name` runs: itself when it names a path, else the first match in PATH.
std::string resolve_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* env = std::getenv("PATH");
  std::stringstream path(env != nullptr ? env : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(path, dir, ':')) {
    const fs::path candidate = fs::path(dir.empty() ? "." : dir) / name;
    std::error_code ec;
    if (fs::is_regular_file(candidate, ec) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate.string();
  }
  return "";
}

// The environment of a child: ours, with `extra` ("NAME=value") set over it.
std::vector<std::string> child_environment(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
  for (const std::string& kv : extra) {
    const std::string name = kv.substr(0, kv.find('=') + 1);
    std::erase_if(env, [&](const std::string& e) { return e.starts_with(name); });
    env.push_back(kv);
  }
  return env;
}

void sleep_seconds(double s) {
  if (s <= 0) return;
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(s);
  ts.tv_nsec = static_cast<long>((s - static_cast<double>(ts.tv_sec)) * 1e9);
  ::nanosleep(&ts, nullptr);  // a signal cuts it short: then the loop looks at once
}

// ---------------------------------------------------------------- one run

enum class State { running, waiting, done, given_up, ended };

struct Child {
  ChildSpec spec;
  State state = State::waiting;
  pid_t pid = -1;
  int restarts = 0;         // restarts so far: DDILOCO_RESTART of the current start
  double started_at = 0;    // elapsed_s of the current start
  fs::file_time_type started_file_time{};
  double restart_at = 0;    // elapsed_s at which a waiting child is started again
  int status = 0;           // the last exit status (shell convention)
  bool exited = false;      // has exited at least once
  std::string what() const {
    return spec.role == Role::syncer ? std::string("syncer") : fmt::format("unit {}", spec.unit);
  }
};

namespace {

// The child between fork and execve: its own process group, stopped if the launcher dies,
// default signal handlers, stdin from /dev/null, none of our descriptors but `report_fd`, on
// which execve's errno is written if it fails.
[[noreturn]] void exec_child(const std::string& program, char** argv, char** envp, pid_t parent, int report_fd) {
  // Only async-signal-safe calls from here to execve.
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0);  // the launcher died: stop (mpirun: the job)
  if (::getppid() != parent) ::_exit(127);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int s = 1; s < NSIG; ++s)
    if (s != SIGKILL && s != SIGSTOP) ::sigaction(s, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  const int null_fd = ::open("/dev/null", O_RDONLY);
  if (null_fd >= 0 && null_fd != 0) {
    ::dup2(null_fd, 0);
    ::close(null_fd);
  }
  // Our other descriptors (launch.jsonl, ...) are not the child's.
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, 3U, ~0U, 4U /* CLOSE_RANGE_CLOEXEC */) != 0)
#endif
    for (int fd = 3; fd < 4096; ++fd)
      if (fd != report_fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  ::execve(program.c_str(), argv, envp);
  const int err = errno;
  [[maybe_unused]] const ssize_t n = ::write(report_fd, &err, sizeof err);
  ::_exit(127);
}

}  // namespace

class Run {
 public:
  explicit Run(const SupervisorOptions& options) : o_(options) {
    if (!o_.log_path.empty()) log_ = JsonlWriter(o_.log_path, o_.truncate_log);
    kills_ = o_.kills;
    std::stable_sort(kills_.begin(), kills_.end(),
                     [](const ScheduledKill& a, const ScheduledKill& b) { return a.at_s < b.at_s; });
  }

  SupervisorResult run(const ChildSpec& syncer, const std::vector<ChildSpec>& units) {
    // Orphans of a child that dies (the ranks of an mpirun killed with -9) are re-parented to
    // us instead of init, so that we can kill and reap them.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    children_.push_back(Child{.spec = syncer});
    for (const ChildSpec& u : units) children_.push_back(Child{.spec = u});
    // Requests an earlier launch left (posted as it stopped) are not this one's to carry out.
    if (!o_.run_dir.empty()) take_kill_requests(o_.run_dir, static_cast<int>(units.size()));
    for (Child& c : children_) {
      // Units are not started for a syncer that could not be, nor after a stop signal.
      if (stopping_ || children_[0].state == State::given_up) break;
      spawn(c);
      handle_signals();
    }
    double next_sweep = 0;
    for (;;) {
      handle_signals();
      reap();
      if (!stopping_) {
        start_due_restarts();
        carry_out_due_kills();
        carry_out_requests();
      }
      if (elapsed() >= next_sweep) {
        sweep_orphans();
        next_sweep = elapsed() + 0.25;
      }
      const Child& s = children_[0];
      if (s.state != State::running && s.state != State::waiting) break;
      sleep_until_next();
    }
    finish();
    return result_;
  }

 private:
  double elapsed() const { return clock_.seconds(); }

  void event(json j, const std::string& human) {
    j["elapsed_s"] = elapsed();
    if (log_.enabled()) log_.write(j);
    if (o_.print) {
      std::printf("launch [%8.2f s]: %s\n", elapsed(), human.c_str());
      std::fflush(stdout);
    }
  }
  json about(const Child& c) const {
    return {{"role", role_name(c.spec.role)}, {"unit", c.spec.role == Role::syncer ? -1 : c.spec.unit}};
  }

  Child* find_running(pid_t pid) {
    for (Child& c : children_)
      if (c.state == State::running && c.pid == pid) return &c;
    return nullptr;
  }
  bool any_unit_running() const {
    for (size_t i = 1; i < children_.size(); ++i)
      if (children_[i].state == State::running) return true;
    return false;
  }

  // ---- starting

  void give_up(Child& c, const std::string& reason) {
    c.state = State::given_up;
    if (c.spec.role == Role::unit) result_.given_up.push_back(c.spec.unit);
    json j = about(c);
    j["event"] = "give_up";
    j["restarts"] = c.restarts;
    j["reason"] = reason;
    event(j, fmt::format("giving up {}: {}{}", c.what(), reason,
                         c.spec.role == Role::unit ? "; the job goes on without it" : ""));
  }

  void spawn(Child& c) {
    const std::vector<std::string>& args =
        c.restarts > 0 && !c.spec.restart_argv.empty() ? c.spec.restart_argv : c.spec.argv;
    if (args.empty()) return give_up(c, "no command to run");
    const std::string program = resolve_program(args[0]);
    if (program.empty()) return give_up(c, fmt::format("cannot run '{}': not found in PATH", args[0]));
    std::vector<std::string> extra = c.spec.env;
    extra.push_back(fmt::format("DDILOCO_RESTART={}", c.restarts));
    extra.push_back(fmt::format("DDILOCO_LAUNCH_PID={}", ::getpid()));
    const std::vector<std::string> env = child_environment(extra);
    std::vector<char*> argv, envp;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);

    int pipe_fd[2];
    if (::pipe2(pipe_fd, O_CLOEXEC) != 0)
      return give_up(c, fmt::format("cannot start: pipe: {}", std::strerror(errno)));
    // Stop signals wait until the child has reset its handlers (ours must not run there).
    sigset_t block, old;
    sigemptyset(&block);
    for (int s : {SIGINT, SIGTERM, SIGUSR1, SIGHUP, SIGQUIT}) sigaddset(&block, s);
    ::sigprocmask(SIG_BLOCK, &block, &old);
    const pid_t parent = ::getpid();
    // Before the child exists: any pid file it writes is newer. File times are coarse (a
    // jiffy, a few ms behind the clock), hence the margin.
    const fs::file_time_type before_start =
        fs::file_time_type::clock::now() - std::chrono::milliseconds(20);
    const pid_t pid = ::fork();
    if (pid == 0) exec_child(program, argv.data(), envp.data(), parent, pipe_fd[1]);
    const int fork_errno = errno;
    if (pid > 0) ::setpgid(pid, pid);  // also here: no signal may reach a group not yet made
    ::close(pipe_fd[1]);
    int exec_errno = 0;
    ssize_t n = 0;
    if (pid > 0) {
      do n = ::read(pipe_fd[0], &exec_errno, sizeof exec_errno);
      while (n < 0 && errno == EINTR);
    }
    ::close(pipe_fd[0]);
    ::sigprocmask(SIG_SETMASK, &old, nullptr);
    if (pid < 0) return give_up(c, fmt::format("cannot start: fork: {}", std::strerror(fork_errno)));
    if (n == static_cast<ssize_t>(sizeof exec_errno)) {
      int st = 0;
      while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
      }
      return give_up(c, fmt::format("cannot run '{}': {}", program, std::strerror(exec_errno)));
    }
    c.pid = pid;
    c.state = State::running;
    c.started_at = elapsed();
    c.started_file_time = before_start;
    json j = about(c);
    j["event"] = "spawn";
    j["pid"] = pid;
    j["restart"] = c.restarts;
    j["argv"] = args;
    event(j, fmt::format("started {} (pid {}, restart {})", c.what(), pid, c.restarts));
  }

  void start_due_restarts() {
    for (Child& c : children_)
      if (c.state == State::waiting && c.exited && c.restart_at <= elapsed()) {
        ++c.restarts;
        spawn(c);
      }
  }

  // ---- exits

  void reap() {
    for (;;) {
      int st = 0;
      const pid_t pid = ::waitpid(-1, &st, WNOHANG);
      if (pid <= 0) return;  // none exited (0), or no child left (ECHILD)
      if (Child* c = find_running(pid)) on_exit(*c, st);
      // else an adopted orphan (killed by sweep_orphans), now reaped
    }
  }

  void on_exit(Child& c, int wait_status) {
    const int sig = WIFSIGNALED(wait_status) ? WTERMSIG(wait_status) : 0;
    const int status = sig != 0 ? signal_exit_status(sig) : WEXITSTATUS(wait_status);
    const pid_t pid = c.pid;
    c.pid = -1;
    c.exited = true;
    c.status = status;
    json j = about(c);
    j["event"] = "exit";
    j["pid"] = pid;
    j["restart"] = c.restarts;
    j["status"] = status;
    j["signal"] = sig;
    j["ran_s"] = elapsed() - c.started_at;
    event(j, fmt::format("{} (pid {}) {} after {:.2f} s", c.what(), pid,
                         sig != 0 ? "was killed by " + signal_name(sig)
                                  : fmt::format("exited with status {}", status),
                         elapsed() - c.started_at));
    // What is left of its process group goes with it; its orphans come to us (sweep_orphans).
    ::killpg(pid, SIGKILL);
    sweep_orphans();
    if (status == 0) {
      c.state = State::done;
    } else if (stopping_ || ending_) {
      c.state = State::ended;
    } else if (c.restarts < o_.restart.max_restarts) {
      c.state = State::waiting;
      const double wait = o_.restart.backoff(c.restarts + 1);
      c.restart_at = elapsed() + wait;
      json r = about(c);
      r["event"] = "restart";
      r["restart"] = c.restarts + 1;
      r["backoff_s"] = wait;
      event(r, fmt::format("restarting {} in {:.3g} s (restart {} of {})", c.what(), wait,
                           c.restarts + 1, o_.restart.max_restarts));
    } else {
      give_up(c, o_.restart.max_restarts == 0
                     ? fmt::format("exit status {} and launch.max_restarts is 0", status)
                     : fmt::format("exit status {} after {} restarts", status, c.restarts));
    }
  }

  // Processes re-parented to us whose parent (a child, or one of its processes) died: nobody
  // will stop them; kill them (reap() collects them).
  void sweep_orphans() {
    const pid_t self = ::getpid();
    for (const Proc& p : read_processes()) {
      if (p.ppid != self || p.state == 'Z' || find_running(p.pid) != nullptr) continue;
      ::kill(p.pid, SIGKILL);
      if (orphans_logged_.insert(p.pid).second)
        event({{"event", "orphan"}, {"pid", p.pid}, {"comm", p.comm}},
              fmt::format("killed process {} ({}), left behind by a child that ended", p.pid,
                          p.comm));
    }
  }

  // ---- signals

  void handle_signals() {
    if (!o_.next_signal) return;
    while (const int sig = o_.next_signal()) {
      std::vector<int> units;
      for (const Child& c : children_)
        if (c.state == State::running && c.spec.role == Role::unit) units.push_back(c.spec.unit);
      const bool syncer = children_[0].state == State::running;
      if (!stopping_) {
        stopping_ = true;
        result_.signal = sig;
        event({{"event", "forward"}, {"signal", sig}, {"syncer", syncer}, {"units", units}},
              fmt::format("{}: forwarding it to {} child(ren), the syncer first; no more restarts",
                          signal_name(sig), units.size() + (syncer ? 1 : 0)));
        for (Child& c : children_) {  // the syncer is children_[0]
          if (c.state == State::running) signal_tree(c.pid, sig);
          if (c.state == State::waiting) c.state = State::ended;  // its restart is off
        }
        if (!syncer && children_[0].state == State::ended) children_[0].status = signal_exit_status(sig);
      } else {
        event({{"event", "forward"}, {"signal", SIGKILL}, {"received", sig}, {"syncer", syncer},
               {"units", units}},
              fmt::format("{} again: killing every child (SIGKILL)", signal_name(sig)));
        for (Child& c : children_)
          if (c.state == State::running) signal_tree(c.pid, SIGKILL);
      }
    }
  }

  // ---- chaos kills

  void kill_event(const ScheduledKill& k, pid_t pid, const std::string& missed) {
    json j = {{"event", "kill"}, {"role", role_name(k.role)},
              {"unit", k.role == Role::syncer ? -1 : k.unit}, {"pid", pid}, {"at_s", k.at_s},
              {"missed", !missed.empty()}, {"source", k.source}};
    if (k.role == Role::unit) j["rank"] = k.rank;
    if (!missed.empty()) j["reason"] = missed;
    const std::string target =
        k.role == Role::syncer ? std::string("the syncer") : fmt::format("unit {} rank {}", k.unit, k.rank);
    if (missed.empty()) {
      ++result_.kills;
      event(j, fmt::format("{}: SIGKILL to {} (pid {})", k.source, target, pid));
    } else {
      ++result_.kills_missed;
      event(j, fmt::format("{}: kill of {} missed: {}", k.source, target, missed));
    }
  }

  void carry_out(const ScheduledKill& k) {
    if (k.role == Role::syncer) {
      Child& s = children_[0];
      if (s.state != State::running) return kill_event(k, 0, "the syncer is not running");
      ::kill(s.pid, SIGKILL);
      return kill_event(k, s.pid, "");
    }
    Child* unit = nullptr;
    for (size_t i = 1; i < children_.size(); ++i)
      if (children_[i].spec.unit == k.unit) unit = &children_[i];
    if (unit == nullptr) return kill_event(k, 0, fmt::format("no unit {} in this launch", k.unit));
    if (unit->state != State::running)
      return kill_event(k, 0, fmt::format("unit {}'s job is not running", k.unit));
    const std::string name = unit_pid_name(k.unit, k.rank);
    const fs::path file = o_.pid_dir / (name + ".pid");
    std::optional<PidFile> pf;
    try {
      if (!o_.pid_dir.empty()) pf = read_pid_file(o_.pid_dir, name);
    } catch (const Error& e) {
      return kill_event(k, 0, e.what());
    }
    if (!pf) return kill_event(k, 0, fmt::format("no pid file {}", file.string()));
    if (pf->written < unit->started_file_time)
      return kill_event(k, pf->pid, fmt::format("stale pid file {}: written before unit {}'s job "
                                                "started (restart {})",
                                                file.string(), k.unit, unit->restarts));
    if (::kill(pf->pid, 0) != 0 && errno == ESRCH)
      return kill_event(k, pf->pid, fmt::format("stale pid file {}: process {} is gone",
                                                file.string(), pf->pid));
    bool ours = pf->pid == unit->pid;
    for (const Proc& p : descendants(read_processes(), unit->pid)) ours = ours || p.pid == pf->pid;
    if (!ours)
      return kill_event(k, pf->pid, fmt::format("stale pid file {}: process {} is not part of "
                                                "unit {}'s job (pid {})",
                                                file.string(), pf->pid, k.unit, unit->pid));
    ::kill(pf->pid, SIGKILL);
    kill_event(k, pf->pid, "");
  }

  // Kills the syncer's status page asked for (status.hpp), as they come.
  void carry_out_requests() {
    if (o_.run_dir.empty()) return;
    for (const KillRequest& r : take_kill_requests(o_.run_dir, static_cast<int>(children_.size()) - 1)) {
      if (!r.error.empty()) {
        event({{"event", "request_refused"}, {"file", r.file}, {"reason", r.error}},
              "status page: request refused: " + r.error);
        continue;
      }
      carry_out(ScheduledKill{.at_s = elapsed(), .role = Role::unit, .unit = r.unit, .rank = 0,
                              .source = "status_page"});
    }
  }

  void carry_out_due_kills() {
    while (next_kill_ < kills_.size() && kills_[next_kill_].at_s <= elapsed())
      carry_out(kills_[next_kill_++]);
  }

  // ---- waiting

  void sleep_until_next(double deadline = 1e300) {
    double next = std::min(deadline, elapsed() + o_.poll_s);
    if (!stopping_ && !ending_) {
      for (const Child& c : children_)
        if (c.state == State::waiting && c.exited) next = std::min(next, c.restart_at);
      if (next_kill_ < kills_.size()) next = std::min(next, kills_[next_kill_].at_s);
    }
    sleep_seconds(std::max(next - elapsed(), 0.001));
  }

  // Waits (reaping, forwarding signals) until no unit job runs or `seconds` have passed.
  void wait_units(double seconds) {
    const double deadline = elapsed() + seconds;
    while (any_unit_running() && elapsed() < deadline) {
      handle_signals();
      reap();
      if (!any_unit_running()) break;
      sleep_until_next(deadline);
    }
  }

  void terminate_units(int sig) {
    for (size_t i = 1; i < children_.size(); ++i) {
      Child& c = children_[i];
      if (c.state != State::running) continue;
      json j = about(c);
      j["event"] = "terminate";
      j["signal"] = signal_name(sig);
      j["pid"] = c.pid;
      event(j, fmt::format("{} still running: {}", c.what(), signal_name(sig)));
      signal_tree(c.pid, sig);
    }
  }

  // The syncer has ended: drain, SIGTERM, SIGKILL, then nothing left.
  void finish() {
    ending_ = true;
    for (Child& c : children_)
      if (c.state == State::waiting) c.state = State::ended;  // restarts pending: off
    if (any_unit_running())
      event({{"event", "drain"}, {"drain_s", o_.drain_s}},
            fmt::format("the syncer has ended; unit jobs have {:.3g} s to exit", o_.drain_s));
    wait_units(o_.drain_s);
    if (any_unit_running()) {
      terminate_units(SIGTERM);
      wait_units(o_.term_grace_s);
    }
    while (any_unit_running()) {  // SIGKILL cannot be refused; resent every second
      terminate_units(SIGKILL);
      wait_units(1.0);
    }
    // Adopted orphans: kill and reap until none is left (bounded: a process stuck in the
    // kernel may take a moment to die).
    const double deadline = elapsed() + 10;
    for (;;) {
      reap();
      const pid_t self = ::getpid();
      bool left = false;
      for (const Proc& p : read_processes()) left = left || p.ppid == self;
      if (!left) break;
      if (elapsed() > deadline) {
        std::fprintf(stderr, "ddiloco: warning: launch: processes left after 10 s of SIGKILL\n");
        break;
      }
      sweep_orphans();
      sleep_seconds(0.01);
    }
    result_.status = children_[0].status;
    result_.syncer_restarts = children_[0].restarts;
    json units = json::array();
    for (size_t i = 1; i < children_.size(); ++i) {
      result_.unit_restarts.push_back(children_[i].restarts);
      units.push_back(children_[i].restarts);
    }
    event({{"event", "done"},
           {"status", result_.status},
           {"restarts", {{"syncer", result_.syncer_restarts}, {"units", units}}},
           {"given_up", result_.given_up},
           {"signal", result_.signal},
           {"kills", result_.kills},
           {"kills_missed", result_.kills_missed}},
          fmt::format("done: status {}, restarts: syncer {}, units {}", result_.status,
                      result_.syncer_restarts, units.dump()));
  }

  const SupervisorOptions& o_;
  JsonlWriter log_;
  Stopwatch clock_;
  std::vector<Child> children_;  // [0] the syncer, then the units in the order given
  std::vector<ScheduledKill> kills_;
  size_t next_kill_ = 0;
  bool stopping_ = false;  // a stop signal was forwarded: nothing is restarted
  bool ending_ = false;    // the syncer has ended
  std::set<pid_t> orphans_logged_;
  SupervisorResult result_;
};

}  // namespace

Supervisor::Supervisor(SupervisorOptions options) : options_(std::move(options)) {}

SupervisorResult Supervisor::run(const ChildSpec& syncer, const std::vector<ChildSpec>& units) {
  Run r(options_);
  return r.run(syncer, units);
}

}  // namespace ddiloco::launch
