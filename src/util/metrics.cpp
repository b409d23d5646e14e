#include "ddiloco/metrics.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include "ddiloco/error.hpp"

namespace ddiloco {

double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

JsonlWriter::JsonlWriter(const std::filesystem::path& path, bool truncate) : path_(path) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  out_.open(path, truncate ? std::ios::trunc : std::ios::app);
  if (!out_) fail("{}: cannot open for writing", path.string());
}

void JsonlWriter::write(const nlohmann::json& event) {
  if (!out_.is_open()) return;
  out_ << event.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  out_.flush();
  if (!out_) fail("{}: write failed (disk full?)", path_.string());
}

ProgressBar::ProgressBar(bool enabled) : enabled_(enabled && ::isatty(STDOUT_FILENO)) {}

void ProgressBar::update(int64_t done, int64_t total, const std::string& status) {
  if (!enabled_) return;
  if (!first_ && done < total && since_draw_.seconds() < 0.1) return;
  first_ = false;
  since_draw_.restart();
  constexpr int kWidth = 30;
  const int filled = total > 0 ? static_cast<int>(kWidth * done / total) : 0;
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  std::printf("\r\033[K[%s] %lld/%lld %s", bar.c_str(), static_cast<long long>(done),
              static_cast<long long>(total), status.c_str());
  std::fflush(stdout);
  drawn_ = true;
}

void ProgressBar::clear() {
  if (!enabled_ || !drawn_) return;
  std::printf("\r\033[K");
  std::fflush(stdout);
  drawn_ = false;
}

void ProgressBar::finish() {
  if (!enabled_ || !drawn_) return;
  std::printf("\n");
  std::fflush(stdout);
  drawn_ = false;
}

}  // namespace ddiloco
