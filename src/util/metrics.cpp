#include "ddiloco/metrics.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "ddiloco/error.hpp"

namespace ddiloco {

double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double process_age_s() {
  std::ifstream stat("/proc/self/stat"), uptime("/proc/uptime");
  std::string line;
  double up = 0;
  if (!std::getline(stat, line) || !(uptime >> up)) return 0.0;
  // Field 22 (starttime, clock ticks after boot), counted after the command name's ')'.
  const auto close = line.rfind(')');
  if (close == std::string::npos) return 0.0;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i)
    if (i == 22) return std::max(0.0, up - std::stod(field) / static_cast<double>(::sysconf(_SC_CLK_TCK)));
  return 0.0;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

std::vector<nlohmann::json> read_events(const std::filesystem::path& path, std::string_view event,
                                        std::uintmax_t from) {
  std::vector<nlohmann::json> events;
  std::ifstream in(path);
  in.seekg(static_cast<std::streamoff>(from));
  const std::string tag = fmt::format("\"event\":\"{}\"", event);  // as JsonlWriter writes it
  for (std::string line; std::getline(in, line);) {
    if (line.find(tag) == std::string::npos) continue;
    nlohmann::json e = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (e.is_object() && e.value("event", "") == event) events.push_back(std::move(e));
  }
  return events;
}

JsonlWriter::JsonlWriter(const std::filesystem::path& path, bool truncate) : path_(path) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  fd_ = open_append_log(path, truncate);
}

void JsonlWriter::write(const nlohmann::json& event) {
  if (!fd_) return;
  const std::string line =
      event.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + '\n';
  write_all(fd_.get(), line.data(), line.size(), path_);  // says why: ENOSPC, EIO, ...
  if (observer_) observer_(event);
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
