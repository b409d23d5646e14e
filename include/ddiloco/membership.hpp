// Who may join the syncer, and what it knows of each unit's presence: the isolated
// deployment's membership (docs/deployments.md "Fault isolation"), kept apart from any transport so that
// its decisions are unit-tested on their own.
//
// A unit job connects and says who it is (Hello). The syncer admits it only if it presents the
// run's secret and run id, names a unit index of the configuration with that unit's rank
// count, the same model shape and the same configuration digest, and no live process holds
// that index already (no split brain). Otherwise the connection is refused with one line that
// names both sides' values, and nothing else changes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ddiloco/config.hpp"

namespace ddiloco::protocol {

/// What a unit job says when it connects (the handshake payload, JSON).
struct Hello {
  int unit = -1;                ///< unit index, 0..M−1
  int ranks = 0;                ///< MPI ranks of the unit job
  GptConfig model;              ///< model shape
  std::string config_digest;    ///< config_digest() of its effective configuration
  std::string run_id;           ///< the run it means to join (from the rendezvous file)
  std::string proof;            ///< hello_proof() of the run's secret (never the secret itself)
  int64_t restart = 0;          ///< restarts of this unit before this process (0: first start)
  std::string host;             ///< hostname of the leader
  int64_t pid = 0;              ///< process id of the leader
  uint64_t window_bytes = 0;    ///< bytes the leader exposes (the protocol's window layout)
  nlohmann::json processes = nlohmann::json::array();  ///< every rank: {rank, host, pid}

  nlohmann::json to_json() const;
  /// Throws Error naming `source` and the field when a field is missing or of the wrong type.
  static Hello from_json(const nlohmann::json& j, const std::string& source);
};

/// What a hello presents to show that its unit holds the run's secret without sending it:
/// HMAC-SHA256 (link_auth.hpp) of a fixed label under the key derived from the secret, 64 hex
/// digits. It is the same for every hello of a run, so on its own it only keeps a unit of
/// another run out (the trusted mode); the authenticated and encrypted modes prove the secret
/// afresh on every connection before the hello is read (link.hpp, docs/security.md).
std::string hello_proof(std::string_view secret);

/// A digest of everything in a configuration that the syncer and every unit must agree on:
/// the effective YAML with the keys that may differ per process (run.threads, run.progress,
/// run.log_every, syncer.address, syncer.http, and the syncer-only syncer.link_timeout_s, link_min_mbit_s,
/// signal_stops_units, max_staleness, max_weight_ratio, max_outer_grad_ratio) set to their defaults; checksum.hpp of it, 16 hex digits.
std::string config_digest(const Config& config);

/// The rendezvous of the isolated deployment, in run.dir: `syncer.addr` (JSON: address,
/// run_id, pid, host) and `syncer.secret` (the secret alone, mode 0600 from its creation on).
/// Both written atomically with write_text_atomically (run_dir.hpp: a symlink or file planted
/// at their temporary names is never written through).
struct Rendezvous {
  std::string address;  ///< ip:port the syncer listens on
  std::string run_id;
  std::string secret;
  int64_t pid = 0;
  std::string host;
  /// The link mode the syncer listens in (link.hpp: "trusted" | "authenticated" |
  /// "encrypted"); a unit that would speak another is told so instead of timing out.
  /// "" in files of syncers older than the field.
  std::string link;

  static std::filesystem::path addr_file(const std::filesystem::path& run_dir);
  static std::filesystem::path secret_file(const std::filesystem::path& run_dir);
  void write(const std::filesystem::path& run_dir) const;
  /// Reads both files; nullopt while they do not exist yet (the syncer has not started).
  /// Throws Error naming the file for a file that exists but is malformed; before reading
  /// either file, for one that is a symlink or anything but a regular file, or is owned by
  /// another uid (whoever plants the address file stands between the units and the syncer);
  /// and for a secret file that is not the syncer's private one: a symlink (opened
  /// with O_NOFOLLOW) or anything but a regular file, a file owned by another uid than
  /// geteuid() ("it must be owned by you"), or one with any of the 077 mode bits set
  /// ("mode 0644: others can read the run's secret; chmod 600 <file>").
  static std::optional<Rendezvous> read(const std::filesystem::path& run_dir);
  /// 32 hex digits of 16 bytes from OpenSSL's RAND_bytes (the run id, and the run's secret).
  static std::string random_token();
};

/// The text of `file` (`what`, for messages), at most `limit` bytes. Throws Error naming the
/// file unless it is a regular file owned by this user (a symlink, a pipe, another user's
/// file are refused), and, with `secret`, one nobody else can read.
std::string read_own_file(const std::filesystem::path& file, const char* what, bool secret, size_t limit);

/// An IPv4 endpoint "a.b.c.d:port". Throws Error naming `what` when malformed.
struct Endpoint {
  std::string ip;
  int port = 0;
  static Endpoint parse(const std::string& text, const std::string& what);
  std::string str() const { return ip + ":" + std::to_string(port); }
};

/// The syncer's view of which unit processes are present, and the heal times.
class Membership {
 public:
  /// What every unit must match: the syncer's configuration, run id and (the proof of) its secret.
  Membership(const Config& config, std::string run_id, std::string secret, uint64_t window_bytes);

  /// "" if `hello` may join now; otherwise the one-line reason it is refused.
  std::string judge(const Hello& hello) const;
  /// Unit `hello.unit` joined at `now_s` (after judge() said yes).
  void joined(const Hello& hello, double now_s);
  /// Unit u was lost at `now_s` (its endpoint failed, or it disconnected).
  void lost(int u, double now_s, const std::string& reason);
  /// A merge included unit u at `now_s`: the time since its last loss if this is its first
  /// merge since it joined again (its heal time), nullopt otherwise.
  std::optional<double> merged(int u, double now_s);

  bool present(int u) const { return units_[u].present; }
  int64_t restarts(int u) const { return units_[u].joins > 0 ? units_[u].joins - 1 : 0; }
  int64_t total_restarts() const;
  /// When unit u was last lost (−1: never), and why.
  double lost_at(int u) const { return units_[u].lost_at; }
  const std::vector<double>& heal_times() const { return heal_s_; }
  /// Seconds unit u was absent in all, closed intervals only (its down time).
  double absent_s(int u) const { return units_[u].absent_s; }
  /// Joined again after a loss, and not merged since.
  bool healing(int u) const { return units_[u].healing; }
  /// The leader of unit u's last process to join: its pid (0: none yet) and host.
  int64_t pid(int u) const { return units_[u].pid; }
  const std::string& host(int u) const { return units_[u].host; }

 private:
  struct Unit {
    bool present = false;
    int64_t joins = 0;
    double lost_at = -1;
    double absent_s = 0;
    bool healing = false;  // joined again after a loss; the next merge with it heals it
    int64_t pid = 0;
    std::string host;
  };
  const Config& config_;
  std::string run_id_, proof_, digest_;
  uint64_t window_bytes_;
  std::vector<Unit> units_;
  std::vector<double> heal_s_;
};

}  // namespace ddiloco::protocol
