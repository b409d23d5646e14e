#include "ddiloco/membership.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <type_traits>
#include <utility>
#include <limits>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "ddiloco/checksum.hpp"
#include "ddiloco/link_auth.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/run_dir.hpp"

namespace ddiloco::protocol {

// Opened without following a symlink, then checked on the descriptor (the name may change
// meanwhile). Whoever plants the address could put itself between the units and the syncer;
// whoever plants the secret, admit itself.
std::string read_own_file(const std::filesystem::path& file, const char* what, bool secret, size_t limit) {
  const std::string dir = file.has_parent_path() ? file.parent_path().string() : ".";
  // O_NONBLOCK: a named pipe planted there is refused below instead of blocking the open.
  UniqueFd fd(::open(file.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (!fd && errno == ELOOP)
    fail("{}: is a symbolic link; {} must be the file the syncer wrote (remove it, and check who "
         "can write to {})", file.string(), what, dir);
  if (!fd) fail("{}: cannot read {}: {}", file.string(), what, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail("{}: cannot stat: {}", file.string(), std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    fail("{}: not a regular file; {} must be the file the syncer wrote (remove it, and check who "
         "can write to {})", file.string(), what, dir);
  if (st.st_uid != ::geteuid())
    fail("{}: owned by uid {}, not by you (uid {}): it must be owned by you, as the syncer "
         "writes it (remove it, and check who can write to {})",
         file.string(), st.st_uid, ::geteuid(), dir);
  if (secret && (st.st_mode & 077) != 0)
    fail("{}: mode {:04o}: others can read the run's secret; chmod 600 {}", file.string(),
         st.st_mode & 07777, file.string());
  std::string text;
  char buf[4096];
  while (text.size() < limit) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("{}: cannot read {}: {}", file.string(), what, std::strerror(errno));
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

namespace {

std::string shape_text(const GptConfig& m) {
  return fmt::format("n_layer={} n_head={} n_embd={} vocab_size={} seq_len={}", m.n_layer,
                     m.n_head, m.n_embd, m.vocab_size, m.seq_len);
}

// An integer field must be a JSON integer within T's range: nlohmann's get<int>() converts a
// float such as 1e20 by a cast whose result is undefined, and truncates a large integer.
template <typename T>
T integer_field(const nlohmann::json& v, const char* key, const std::string& source) {
  const bool fits = v.is_number_unsigned()
                        ? v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
                        : v.is_number_integer() && std::in_range<T>(v.get<int64_t>());
  if (!fits)
    fail("{}: handshake field '{}' must be an integer in {}..{}, got {}", source, key,
         std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), v.dump());
  return v.is_number_unsigned() ? static_cast<T>(v.get<uint64_t>()) : static_cast<T>(v.get<int64_t>());
}

template <typename T>
T field(const nlohmann::json& j, const char* key, const std::string& source) {
  if (!j.is_object() || !j.contains(key))
    fail("{}: handshake field '{}' is missing", source, key);
  if constexpr (std::is_integral_v<T>) return integer_field<T>(j.at(key), key, source);
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    fail("{}: handshake field '{}' has the wrong type ({})", source, key, j.at(key).dump());
  }
}

std::string read_secret(const std::filesystem::path& file) {
  const std::string text = read_own_file(file, "the run's secret", true, 4096);
  std::string secret = text.substr(0, text.find('\n'));
  if (secret.empty())
    fail("{}: empty or unreadable (expected the run's secret on one line)", file.string());
  return secret;
}

}  // namespace

nlohmann::json Hello::to_json() const {
  return {{"unit", unit},
          {"ranks", ranks},
          {"model",
           {{"n_layer", model.n_layer}, {"n_head", model.n_head}, {"n_embd", model.n_embd},
            {"vocab_size", model.vocab_size}, {"seq_len", model.seq_len}}},
          {"config_digest", config_digest},
          {"run_id", run_id},
          {"proof", proof},
          {"restart", restart},
          {"host", host},
          {"pid", pid},
          {"window_bytes", window_bytes},
          {"processes", processes}};
}

Hello Hello::from_json(const nlohmann::json& j, const std::string& source) {
  Hello h;
  h.unit = field<int>(j, "unit", source);
  h.ranks = field<int>(j, "ranks", source);
  const auto m = field<nlohmann::json>(j, "model", source);
  const std::string ms = source + " model";
  h.model.n_layer = field<int>(m, "n_layer", ms);
  h.model.n_head = field<int>(m, "n_head", ms);
  h.model.n_embd = field<int>(m, "n_embd", ms);
  h.model.vocab_size = field<int>(m, "vocab_size", ms);
  h.model.seq_len = field<int>(m, "seq_len", ms);
  h.config_digest = field<std::string>(j, "config_digest", source);
  h.run_id = field<std::string>(j, "run_id", source);
  h.proof = field<std::string>(j, "proof", source);
  h.restart = field<int64_t>(j, "restart", source);
  h.host = field<std::string>(j, "host", source);
  h.pid = field<int64_t>(j, "pid", source);
  h.window_bytes = field<uint64_t>(j, "window_bytes", source);
  h.processes = field<nlohmann::json>(j, "processes", source);
  if (!h.processes.is_array()) fail("{}: handshake field 'processes' must be a list", source);
  return h;
}

std::string config_digest(const Config& config) {
  Config c = config;
  const RunConfig defaults;
  c.run.threads = defaults.threads;
  c.run.progress = defaults.progress;
  c.run.log_every = defaults.log_every;
  c.syncer.address.clear();
  c.syncer.http.clear();
  // The syncer's own conduct (its link's waits, its reaction to a signal) is not the units'
  // business: a syncer job that sets them still admits units started without.
  const SyncerConfig syncer_defaults;
  c.syncer.link_timeout_s = syncer_defaults.link_timeout_s;
  c.syncer.link_min_mbit_s = syncer_defaults.link_min_mbit_s;
  c.syncer.signal_stops_units = syncer_defaults.signal_stops_units;
  c.syncer.max_staleness = syncer_defaults.max_staleness;
  c.syncer.max_weight_ratio = syncer_defaults.max_weight_ratio;
  c.syncer.max_outer_grad_ratio = syncer_defaults.max_outer_grad_ratio;
  const std::string yaml = to_yaml(c);
  return fmt::format("{:016x}", checksum(std::as_bytes(std::span<const char>(yaml.data(), yaml.size()))));
}

std::filesystem::path Rendezvous::addr_file(const std::filesystem::path& run_dir) {
  return run_dir / "syncer.addr";
}
std::filesystem::path Rendezvous::secret_file(const std::filesystem::path& run_dir) {
  return run_dir / "syncer.secret";
}

void Rendezvous::write(const std::filesystem::path& run_dir) const {
  // The secret first: a unit that finds the address finds the secret beside it.
  // 0600 from its creation on: never readable by others, not even before the rename.
  write_text_atomically(secret_file(run_dir), secret + "\n", 0600);
  const nlohmann::json j = {{"address", address}, {"run_id", run_id}, {"pid", pid}, {"host", host}, {"link", link}};
  write_text_atomically(addr_file(run_dir), j.dump() + "\n");
}

std::optional<Rendezvous> Rendezvous::read(const std::filesystem::path& run_dir) {
  const auto addr = addr_file(run_dir), secret = secret_file(run_dir);
  // symlink_status: a symlink planted as the secret is there (and refused), not "not yet".
  if (!std::filesystem::exists(addr) ||
      !std::filesystem::exists(std::filesystem::symlink_status(secret)))
    return std::nullopt;
  Rendezvous r;
  const std::string text = read_own_file(addr, "the syncer's rendezvous file", false, 65536);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not the syncer's rendezvous file (JSON: {})", addr.string(), e.what());
  }
  r.address = field<std::string>(j, "address", addr.string());
  r.run_id = field<std::string>(j, "run_id", addr.string());
  r.pid = field<int64_t>(j, "pid", addr.string());
  r.host = field<std::string>(j, "host", addr.string());
  if (j.contains("link")) r.link = field<std::string>(j, "link", addr.string());
  Endpoint::parse(r.address, addr.string() + " address");
  r.secret = read_secret(secret);
  return r;
}

std::string Rendezvous::random_token() {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof bytes) != 1) fail("cannot draw a random token: OpenSSL's RAND_bytes failed");
  std::string out;
  for (unsigned char b : bytes) out += fmt::format("{:02x}", b);
  return out;
}

Endpoint Endpoint::parse(const std::string& text, const std::string& what) {
  const auto colon = text.rfind(':');
  auto bad = [&] {
    fail("{}: expected an IPv4 address and port such as 127.0.0.1:0, got '{}'", what, text);
  };
  if (colon == std::string::npos || colon == 0) bad();
  Endpoint e;
  e.ip = text.substr(0, colon);
  const std::string port = text.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) bad();
  e.port = std::stoi(port);
  if (e.port > 65535) bad();
  int parts = 0;
  std::stringstream ss(e.ip);
  std::string part;
  while (std::getline(ss, part, '.')) {
    if (part.empty() || part.size() > 3 || part.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(part) > 255)
      bad();
    ++parts;
  }
  if (parts != 4 || e.ip.back() == '.') bad();
  return e;
}

Membership::Membership(const Config& config, std::string run_id, std::string secret,
                       uint64_t window_bytes)
    : config_(config), run_id_(std::move(run_id)), proof_(hello_proof(secret)),
      digest_(config_digest(config)), window_bytes_(window_bytes), units_(config.units.count) {}

std::string hello_proof(std::string_view secret) {
  const std::string label = "ddiloco hello proof v1";
  const comm::auth::Mac mac = comm::auth::hmac(comm::auth::link_key(secret), std::as_bytes(std::span(label)));
  std::string hex;
  for (std::byte b : mac) hex += fmt::format("{:02x}", static_cast<unsigned>(b));
  return hex;
}

std::string Membership::judge(const Hello& h) const {
  // Constant-time, so that the time a refusal takes says nothing of how much of it matched.
  if (h.proof.size() != proof_.size() || CRYPTO_memcmp(h.proof.data(), proof_.data(), proof_.size()) != 0)
    return "wrong or missing proof of the run's secret (run.dir/syncer.secret)";
  if (h.run_id != run_id_) return fmt::format("run id {} is not this run's ({})", h.run_id, run_id_);
  const int M = static_cast<int>(units_.size());
  if (h.unit < 0 || h.unit >= M)
    return fmt::format("unit {} is outside 0..{} (units.count = {})", h.unit, M - 1, M);
  if (h.ranks != config_.unit_ranks(h.unit))
    return fmt::format("unit {} has {} ranks, the syncer's configuration gives it {}", h.unit,
                       h.ranks, config_.unit_ranks(h.unit));
  if (!(h.model == config_.model))
    return fmt::format("unit {} has model {}, the syncer has {}", h.unit, shape_text(h.model),
                       shape_text(config_.model));
  if (h.config_digest != digest_)
    return fmt::format("unit {} has configuration digest {}, the syncer has {} (another config "
                       "file or --set)",
                       h.unit, h.config_digest, digest_);
  if (h.window_bytes != window_bytes_)
    return fmt::format("unit {} exposes {} bytes, the syncer's window layout needs {}", h.unit,
                       h.window_bytes, window_bytes_);
  const Unit& u = units_[h.unit];
  if (u.present)
    return fmt::format("unit {} is already held by a live process (pid {} on {})", h.unit, u.pid,
                       u.host);
  return "";
}

void Membership::joined(const Hello& h, double now_s) {
  Unit& u = units_[h.unit];
  if (u.present) fail("membership: unit {} joined twice", h.unit);
  if (u.lost_at >= 0) {
    u.absent_s += now_s - u.lost_at;
    u.healing = true;
  }
  u.present = true;
  ++u.joins;
  u.pid = h.pid;
  u.host = h.host;
}

void Membership::lost(int unit, double now_s, const std::string&) {
  Unit& u = units_[unit];
  if (!u.present) return;
  u.present = false;
  u.lost_at = now_s;
  u.healing = false;
}

std::optional<double> Membership::merged(int unit, double now_s) {
  Unit& u = units_[unit];
  if (!u.healing) return std::nullopt;
  u.healing = false;
  heal_s_.push_back(now_s - u.lost_at);
  return heal_s_.back();
}

int64_t Membership::total_restarts() const {
  int64_t n = 0;
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) n += restarts(u);
  return n;
}

}  // namespace ddiloco::protocol
