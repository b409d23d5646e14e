// The run directory (run.dir): where a training job writes its outputs.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>

namespace ddiloco {

/// Checks that `dir` can hold a new run: creates it if missing; throws Error (naming run.dir)
/// when it is not a directory, cannot be created or written, or already holds a run
/// (metrics.jsonl) and `overwrite` is false. Touches nothing else.
void check_run_dir(const std::filesystem::path& dir, bool overwrite);

/// Removes a previous run's outputs from `dir` (metrics, unit logs, config, model, plots);
/// called once every input has been validated.
void clear_run_outputs(const std::filesystem::path& dir);

/// Writes `text` to `path` atomically: temporary file `<path>.tmp` made by create_new_file
/// with `mode` (less the umask; 0600 for a secret, which is then never readable by others),
/// fsync, rename, fsync of the directory. rename() replaces whatever entry `path` is (a
/// planted symlink included) and never writes through it. Throws Error naming the file when
/// any step fails; the old file is then untouched.
void write_text_atomically(const std::filesystem::path& path, const std::string& text,
                           mode_t mode = 0644);

/// fsync of a directory, so that a rename inside it survives a crash.
void sync_directory(const std::filesystem::path& dir);

// ---- Opening files for writing in a directory that others may write too (run.dir on a
// shared file system, a group's scratch space). Whoever can write there can plant a symlink
// or a hard link at a name ddiloco is about to write; following it would let them make us
// overwrite, truncate or append to any file we may write (as root: any file at all). So a
// file is written only through a descriptor whose open refuses a symlink (O_NOFOLLOW) and
// that is either a file created afresh (temporaries) or checked to be a log of our own.

/// An open file descriptor, closed when destroyed; move-only. Empty: -1.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { close(); }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  /// close(2); its result (0 when empty), as a delayed write error may show only here (NFS).
  int close();

 private:
  int fd_ = -1;
};

/// Removes the directory entry `path` if there is one: a file or a symlink itself, never
/// what a symlink points to. Throws Error naming it when it exists and cannot be removed (a
/// directory, no permission).
void remove_entry(const std::filesystem::path& path);

/// Creates `path` afresh for writing, for a temporary file that is then renamed into place:
/// remove_entry(path), then open(O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode).
/// O_EXCL makes the open fail rather than follow a symlink or reuse a file planted again in
/// between, so the descriptor is always a new regular file of ours. Throws Error naming the
/// file: it cannot be removed or created, or something reappeared at its name meanwhile.
UniqueFd create_new_file(const std::filesystem::path& path, mode_t mode);

/// Opens the append-only log `path` (a JSONL file re-opened by a resumed run), creating it
/// (mode 0644 less the umask) when missing: open(O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW |
/// O_CLOEXEC), then fstat of the descriptor. With `truncate` it is emptied after the checks
/// (O_TRUNC would empty a planted file before them). Throws Error naming the file when it is
/// a symlink, not a regular file, owned by another user than geteuid(), has more than one hard
/// link (appending would write to the other name's file too), or cannot be opened.
UniqueFd open_append_log(const std::filesystem::path& path, bool truncate);

/// Writes all `bytes` to `fd` (retrying short writes and EINTR). Throws Error naming `path`.
void write_all(int fd, const void* data, size_t bytes, const std::filesystem::path& path);

// ---- pid files: how `ddiloco launch` finds the real process of a unit's rank (chaos kills).
// Every rank of a unit job writes write_pid_file(pid_dir(run.dir), unit_pid_name(u, r)) when
// it starts; the launcher reads it with read_pid_file.

/// Where pid files go: <run_dir>/pids.
std::filesystem::path pid_dir(const std::filesystem::path& run_dir);
/// The pid file name (without ".pid") of rank `rank` of unit `unit`: "unit<u>.rank<r>".
std::string unit_pid_name(int unit, int rank);

/// Writes this process's pid (getpid(), one decimal line) to <dir>/<name>.pid atomically
/// (temporary file, fsync, rename), creating `dir` when missing; an earlier file of the same
/// name is replaced. Returns the file's path. Throws Error naming the file when it cannot.
std::filesystem::path write_pid_file(const std::filesystem::path& dir, const std::string& name);

/// A pid file as read back: the pid and when the file was written.
struct PidFile {
  pid_t pid = 0;
  std::filesystem::file_time_type written;
};
/// Reads <dir>/<name>.pid; std::nullopt when there is no such file. Throws Error naming the
/// file when it cannot be read or does not hold one positive pid.
std::optional<PidFile> read_pid_file(const std::filesystem::path& dir, const std::string& name);

}  // namespace ddiloco
