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

/// Writes `text` to `path` atomically: temporary file, fsync, rename, fsync of the directory.
/// Throws Error naming the file when any step fails; the old file is then untouched.
void write_text_atomically(const std::filesystem::path& path, const std::string& text);

/// fsync of a directory, so that a rename inside it survives a crash.
void sync_directory(const std::filesystem::path& dir);

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
