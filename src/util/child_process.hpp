// A child process with its stdin and stdout piped to us, for tests and benchmarks that need
// a second, real process (a UCX peer, an mpirun job). Internal to ddiloco (not a public
// header): no shell, no quoting; the child runs in its own process group so that terminate()
// also reaches what it started (mpirun's ranks), and only that.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace ddiloco::util {

class ChildProcess {
 public:
  /// Starts argv[0] (a path, not searched in PATH) with arguments argv, the environment of
  /// this process plus `env` ("NAME=value", replacing a variable of the same name). stderr is
  /// inherited. Throws Error if it cannot be started.
  explicit ChildProcess(const std::vector<std::string>& argv,
                        const std::vector<std::string>& env = {});
  /// terminate(): nothing is left running or unreaped.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  /// Writes `line` and a newline to the child's stdin; false if it cannot (the child is gone).
  bool send(const std::string& line);
  /// Closes the child's stdin (it reads EOF).
  void close_stdin();
  /// The next line of the child's stdout without its newline; nullopt after timeout_s seconds
  /// without one, or at EOF. Sleeps in poll(), never spins.
  std::optional<std::string> read_line(double timeout_s);
  /// Sends `signal` to the child itself (not its group).
  void signal(int signal);
  /// Waits up to timeout_s for the child to exit and reaps it (killing whatever is left of its
  /// process group first): its exit status, or 128 + the signal that ended it; nullopt if it
  /// is still running then.
  std::optional<int> wait(double timeout_s);
  /// SIGTERM to the child's process group, up to grace_s seconds for the child to exit, then
  /// SIGKILL to the group; reaps the child. Idempotent.
  void terminate(double grace_s = 0);

 private:
  pid_t pid_ = -1;
  int in_ = -1;   // write end of the child's stdin
  int out_ = -1;  // read end of the child's stdout
  std::string buffer_;
  bool eof_ = false;
  std::optional<int> status_;
};

}  // namespace ddiloco::util
