// Metrics: one JSON object per line (metrics.jsonl) plus what a person reads on the console.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "ddiloco/run_dir.hpp"

namespace ddiloco {

/// CPU time (user + system) this process has used so far, seconds, all threads.
double process_cpu_seconds();

/// Wall time since this process was started (exec), seconds: /proc/self/stat's start time
/// against /proc/uptime (clock-tick resolution). 0 where /proc cannot be read.
double process_age_s();

/// This machine's host name ("" if unknown).
std::string host_name();

/// Seconds on a monotonic clock since construction.
class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  void restart() { start_ = std::chrono::steady_clock::now(); }

 private:
  std::chrono::steady_clock::time_point start_;
};

/// Appends JSON objects, one per line, flushed after each so that a crash loses nothing
/// already logged and `tail -f` shows progress. Invalid UTF-8 in strings is replaced, never
/// thrown on. A default-constructed writer discards everything (ranks that do not log).
class JsonlWriter {
 public:
  JsonlWriter() = default;
  /// Opens `path` for appending (truncating when `truncate`), creating parent directories,
  /// through open_append_log (run_dir.hpp): throws Error naming the file when it cannot be
  /// opened, or is a symlink, not a regular file, another user's, or hard-linked elsewhere.
  JsonlWriter(const std::filesystem::path& path, bool truncate);

  /// One line, one write(2) to the file (no buffer of ours: a crash loses nothing already
  /// written). Throws Error naming the file when it cannot be written (disk full, ...).
  void write(const nlohmann::json& event);
  bool enabled() const { return static_cast<bool>(fd_); }
  /// Called with every event written, after its line is (the syncer's status page).
  void observe(std::function<void(const nlohmann::json&)> observer) { observer_ = std::move(observer); }

 private:
  UniqueFd fd_;
  std::filesystem::path path_;
  std::function<void(const nlohmann::json&)> observer_;
};

/// The events named `event` in the JSONL file `path` written by a JsonlWriter, from byte `from`
/// on, in order. Lines that are not JSON objects (one cut short by a crash) are skipped; a file
/// that does not exist has none.
std::vector<nlohmann::json> read_events(const std::filesystem::path& path, std::string_view event,
                                        std::uintmax_t from = 0);

/// A one-line progress bar redrawn in place ("\r") when stdout is a terminal; silent
/// otherwise (logs then carry the progress).
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled);
  /// Redraws at most ~10 times a second: [#####.....] done/total, then `status`.
  void update(int64_t done, int64_t total, const std::string& status);
  /// Ends the line so that following output starts on a fresh one.
  void finish();
  /// Clears the bar before other console output (call, print, then update again).
  void clear();
  bool enabled() const { return enabled_; }

 private:
  bool enabled_;
  bool drawn_ = false;
  Stopwatch since_draw_;
  bool first_ = true;
};

}  // namespace ddiloco
