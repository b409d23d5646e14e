// The files around the syncer's status page (status.hpp).
#include "ddiloco/status.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "ddiloco/error.hpp"
#include "ddiloco/membership.hpp"
#include "ddiloco/run_dir.hpp"

namespace ddiloco {

std::filesystem::path status_secret_file(const std::filesystem::path& run_dir) { return run_dir / "status.secret"; }

std::filesystem::path HttpAddress::file(const std::filesystem::path& run_dir) { return run_dir / "syncer.http"; }

void HttpAddress::write(const std::filesystem::path& run_dir) const {
  const nlohmann::json j = {{"address", address}, {"url", url()}, {"pid", pid}, {"host", host}};
  write_text_atomically(file(run_dir), j.dump() + "\n");
}

std::optional<HttpAddress> HttpAddress::read(const std::filesystem::path& run_dir) {
  const std::filesystem::path f = file(run_dir);
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(f, ec))) return std::nullopt;
  const std::string text = protocol::read_own_file(f, "the status page's address", false, 4096);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(key)) fail("{}: field '{}' is missing (expected JSON written by the syncer)", f.string(), key);
    return j.at(key);
  };
  HttpAddress a;
  if (!field("address").is_string()) fail("{}: field 'address' must be a string ip:port", f.string());
  a.address = field("address").get<std::string>();
  protocol::Endpoint::parse(a.address, f.string() + ": field 'address'");
  if (!field("pid").is_number_integer()) fail("{}: field 'pid' must be an integer", f.string());
  a.pid = field("pid").get<int64_t>();
  if (j.contains("host") && j["host"].is_string()) a.host = j["host"].get<std::string>();
  return a;
}

namespace {
std::filesystem::path request_dir(const std::filesystem::path& run_dir) { return run_dir / "requests"; }
}  // namespace

void launch_request_kill(const std::filesystem::path& run_dir, int unit, int64_t n) {
  const std::filesystem::path dir = request_dir(run_dir);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    fail("{}: cannot create the launcher's request directory: {}", dir.string(), std::strerror(errno));
  write_text_atomically(dir / fmt::format("kill-{:010d}-{:06d}.json", ::getpid(), n), nlohmann::json{{"unit", unit}}.dump() + "\n", 0600);
}

std::vector<KillRequest> take_kill_requests(const std::filesystem::path& run_dir, int units) {
  std::vector<KillRequest> out;
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(request_dir(run_dir), ec))
    if (e.path().extension() == ".json") files.push_back(e.path());  // a .tmp is still being written
  std::sort(files.begin(), files.end());
  for (const std::filesystem::path& f : files) {
    KillRequest r;
    r.file = f.string();
    try {
      const nlohmann::json j = nlohmann::json::parse(protocol::read_own_file(f, "a kill request", false, 4096));
      const auto u = j.is_object() ? j.find("unit") : j.end();
      if (u == j.end() || !u->is_number_integer() || u->get<int64_t>() < 0 || u->get<int64_t>() >= units)
        r.error = fmt::format("{}: field 'unit' must be an integer in 0..{}", f.string(), units - 1);
      else
        r.unit = static_cast<int>(u->get<int64_t>());
    } catch (const std::exception& e) {
      r.error = fmt::format("{}: {}", f.string(), e.what());
    }
    std::filesystem::remove(f, ec);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace ddiloco
