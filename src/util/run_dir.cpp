#include "ddiloco/run_dir.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include <fmt/format.h>

#include "ddiloco/error.hpp"

namespace ddiloco {

namespace fs = std::filesystem;

void check_run_dir(const fs::path& dir, bool overwrite) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    fail("run.dir: '{}' exists and is not a directory", dir.string());
  fs::create_directories(dir, ec);
  if (ec) fail("run.dir: cannot create '{}': {}", dir.string(), ec.message());
  if (::access(dir.c_str(), W_OK) != 0)
    fail("run.dir: '{}' is not writable: {}", dir.string(), std::strerror(errno));
  if (!overwrite && fs::exists(dir / "metrics.jsonl"))
    fail("run.dir: '{}' already holds a run (metrics.jsonl); pass --overwrite to replace it or "
         "choose another run.dir",
         dir.string());
}

void clear_run_outputs(const fs::path& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name == "metrics.jsonl" || name == "config.yaml" || name == "model.h5" ||
                      name == "loss.png" || name == "syncer.addr" || (name.starts_with("unit_") && name.ends_with(".jsonl"));
    if (ours) fs::remove(entry.path(), ec);
  }
}

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: some file systems do not allow it
  ::fsync(fd);
  ::close(fd);
}

void write_text_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail("{}: cannot create: {}", tmp.string(), std::strerror(errno));
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      fail("{}: write failed: {}", path.string(), std::strerror(err));
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    fail("{}: write failed: {}", path.string(), std::strerror(errno));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    fail("{}: cannot rename into place: {}", path.string(), ec.message());
  }
  sync_directory(path.parent_path());
}

fs::path pid_dir(const fs::path& run_dir) { return run_dir / "pids"; }

std::string unit_pid_name(int unit, int rank) { return fmt::format("unit{}.rank{}", unit, rank); }

fs::path write_pid_file(const fs::path& dir, const std::string& name) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("{}: cannot create the pid directory: {}", dir.string(), ec.message());
  const fs::path path = dir / (name + ".pid");
  write_text_atomically(path, fmt::format("{}\n", ::getpid()));
  return path;
}

std::optional<PidFile> read_pid_file(const fs::path& dir, const std::string& name) {
  const fs::path path = dir / (name + ".pid");
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  PidFile out;
  out.written = fs::last_write_time(path, ec);
  if (ec) fail("{}: cannot read: {}", path.string(), ec.message());
  std::ifstream in(path);
  if (!in) fail("{}: cannot read: {}", path.string(), std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  long long pid = 0;
  const auto [end, err] = std::from_chars(s.data(), s.data() + s.size(), pid);
  if (s.empty() || err != std::errc() || end != s.data() + s.size() || pid <= 0 ||
      pid > std::numeric_limits<pid_t>::max())
    fail("{}: expected one positive pid, got '{}'", path.string(), s);
  out.pid = static_cast<pid_t>(pid);
  return out;
}

}  // namespace ddiloco
