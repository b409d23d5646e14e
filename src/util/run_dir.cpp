#include "ddiloco/run_dir.hpp"

#include <fcntl.h>
#include <sys/stat.h>
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

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.release();
  }
  return *this;
}

int UniqueFd::close() { return fd_ < 0 ? 0 : ::close(release()); }

namespace {

// Who could have put something at `path`: the directory to look at.
std::string dir_of(const fs::path& path) {
  return path.has_parent_path() ? path.parent_path().string() : std::string(".");
}

std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "directory";
  if (S_ISFIFO(mode)) return "named pipe";
  if (S_ISSOCK(mode)) return "socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "device";
  return "special file";
}

// The checks of open_append_log on the opened descriptor (not on the name, which may have
// changed since).
void check_own_log(int fd, const fs::path& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("{}: cannot stat: {}", path.string(), std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    fail("{}: is a {}, expected a regular file (the log ddiloco appends to); remove it",
         path.string(), kind_of(st.st_mode));
  if (st.st_uid != ::geteuid())
    fail("{}: owned by uid {}, not by you (uid {}); refusing to append to another user's file "
         "(remove it, and check who can write to {})",
         path.string(), st.st_uid, ::geteuid(), dir_of(path));
  if (st.st_nlink > 1)
    fail("{}: has {} hard links; refusing to append to a file that is also elsewhere (remove it "
         "or replace it with a copy, and check who can write to {})",
         path.string(), st.st_nlink, dir_of(path));
}

}  // namespace

void remove_entry(const fs::path& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    fail("{}: cannot remove the old file before writing it afresh: {}", path.string(),
         std::strerror(errno));
}

UniqueFd create_new_file(const fs::path& path, mode_t mode) {
  remove_entry(path);
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
  if (!fd && (errno == EEXIST || errno == ELOOP))
    fail("{}: reappeared right after it was removed; refusing to write through it (another "
         "process writes there: check who can write to {})",
         path.string(), dir_of(path));
  if (!fd) fail("{}: cannot create: {}", path.string(), std::strerror(errno));
  return fd;
}

UniqueFd open_append_log(const fs::path& path, bool truncate) {
  // O_NONBLOCK: a named pipe planted there fails the open (no reader) or the checks below,
  // instead of blocking us until someone reads it.
  const int flags = O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK;
  UniqueFd fd(::open(path.c_str(), flags, 0644));
  if (!fd && errno == ELOOP)
    fail("{}: is a symbolic link; refusing to write through it (a file in {} was replaced: "
         "check who can write there)",
         path.string(), dir_of(path));
  if (!fd) fail("{}: cannot open for writing: {}", path.string(), std::strerror(errno));
  check_own_log(fd.get(), path);
  if (::fcntl(fd.get(), F_SETFL, O_APPEND) != 0 || (truncate && ::ftruncate(fd.get(), 0) != 0))
    fail("{}: cannot open for writing: {}", path.string(), std::strerror(errno));
  return fd;
}

void write_all(int fd, const void* data, size_t bytes, const fs::path& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      fail("{}: write failed: {}", path.string(), n < 0 ? std::strerror(errno) : "no progress");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void write_text_atomically(const fs::path& path, const std::string& text, mode_t mode) {
  const fs::path tmp = path.string() + ".tmp";
  UniqueFd fd = create_new_file(tmp, mode);
  try {
    write_all(fd.get(), text.data(), text.size(), path);
    if (::fsync(fd.get()) != 0 || fd.close() != 0)
      fail("{}: write failed: {}", path.string(), std::strerror(errno));
  } catch (...) {
    fd.close();
    ::unlink(tmp.c_str());
    throw;
  }
  // rename() replaces the entry at `path`, a planted symlink included, and never follows it.
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
