#include "util/child_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "ddiloco/error.hpp"

extern char** environ;

namespace ddiloco::util {

namespace {

std::string env_name(const std::string& entry) { return entry.substr(0, entry.find('=')); }

}  // namespace

ChildProcess::ChildProcess(const std::vector<std::string>& argv,
                           const std::vector<std::string>& env) {
  if (argv.empty()) fail("ChildProcess: no program");
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0) fail("ChildProcess: pipe: {}", std::strerror(errno));
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(in[0]);
    ::close(in[1]);
    fail("ChildProcess: pipe: {}", std::strerror(errno));
  }
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool replaced = false;
    for (const std::string& x : env) replaced = replaced || env_name(x) == env_name(entry);
    if (!replaced) environment.push_back(entry);
  }
  environment.insert(environment.end(), env.begin(), env.end());
  std::vector<char*> args, envp;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const std::string& e : environment) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);  // e.g. SIGPIPE ignored here is default there
  const int rc = ::posix_spawn(&pid_, args[0], &actions, &attr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(in[0]);
  ::close(out[1]);
  if (rc != 0) {
    ::close(in[1]);
    ::close(out[0]);
    pid_ = -1;
    fail("ChildProcess: cannot start {}: {}", argv[0], std::strerror(rc));
  }
  in_ = in[1];
  out_ = out[0];
}

ChildProcess::~ChildProcess() { terminate(); }

bool ChildProcess::send(const std::string& line) {
  if (in_ < 0) return false;
  const std::string text = line + "\n";
  size_t done = 0;
  while (done < text.size()) {
    // MSG_NOSIGNAL is for sockets; a pipe whose reader died raises SIGPIPE, so block it here.
    sigset_t pipe_set, old;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    const ssize_t n = ::write(in_, text.data() + done, text.size() - done);
    const int err = errno;
    if (n < 0 && err == EPIPE) {
      timespec zero{0, 0};
      sigtimedwait(&pipe_set, nullptr, &zero);  // discard the pending SIGPIPE
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (n < 0) {
      if (err == EINTR) continue;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

void ChildProcess::close_stdin() {
  if (in_ >= 0) ::close(in_);
  in_ = -1;
}

std::optional<std::string> ChildProcess::read_line(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  for (;;) {
    const auto nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    if (eof_ || out_ < 0) return std::nullopt;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd p{out_, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (r <= 0) continue;
    char chunk[4096];
    const ssize_t n = ::read(out_, chunk, sizeof chunk);
    if (n > 0) {
      buffer_.append(chunk, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      eof_ = true;
    }
  }
}

void ChildProcess::signal(int sig) {
  if (pid_ > 0 && !status_) ::kill(pid_, sig);
}

std::optional<int> ChildProcess::wait(double timeout_s) {
  if (status_ || pid_ <= 0) return status_;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  for (;;) {
    // WNOWAIT: the exited child stays a zombie, so its pid (= its process group's id) cannot
    // be reused while we kill what is left of its group; then it is reaped.
    siginfo_t info{};
    const int r = ::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT);
    if (r == 0 && info.si_pid == pid_) {
      ::kill(-pid_, SIGKILL);  // leftovers of the group (e.g. ranks of a dead mpirun)
      int st = 0;
      while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      return status_;
    }
    if (r < 0 && errno != EINTR) {
      status_ = -1;
      return status_;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void ChildProcess::terminate(double grace_s) {
  if (pid_ > 0 && !status_) {
    if (grace_s > 0) {
      ::kill(-pid_, SIGTERM);
      wait(grace_s);
    }
    if (!status_) {
      ::kill(-pid_, SIGKILL);  // the child leads its group; only it and what it started
      ::kill(pid_, SIGKILL);
      while (!wait(1.0)) {
      }
    }
  }
  close_stdin();
  if (out_ >= 0) ::close(out_);
  out_ = -1;
}

}  // namespace ddiloco::util
