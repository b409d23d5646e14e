// The files around the syncer's status page (docs/status_page.md), in run.dir:
//   syncer.http         where the page is served (JSON: address, pid, host); written once the
//                       server listens, removed when the syncer ends (`ddiloco status` reads it)
//   status.secret       the secret of the page's actions (0600), made by each syncer process
//                       that serves the page; not the run's secret, which admits units
//   requests/kill-P-N.json  a kill the page asked for ({"unit": U}; P the syncer's pid, N its
//                       count), for `ddiloco launch`'s supervisor to carry out as a chaos kill
//                       and remove
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace ddiloco {

/// run.dir/syncer.http.
struct HttpAddress {
  std::string address;  ///< ip:port served on
  int64_t pid = 0;      ///< the syncer process
  std::string host;     ///< ... and its host
  std::string url() const { return "http://" + address + "/"; }

  static std::filesystem::path file(const std::filesystem::path& run_dir);
  /// Written atomically (write_text_atomically). Throws Error naming the file.
  void write(const std::filesystem::path& run_dir) const;
  /// nullopt when there is no file (no syncer serves the page, or none has started); throws
  /// Error naming the file and field when it is malformed, or not a regular file of ours.
  static std::optional<HttpAddress> read(const std::filesystem::path& run_dir);
};

/// run.dir/status.secret.
std::filesystem::path status_secret_file(const std::filesystem::path& run_dir);

/// Asks `ddiloco launch` for a SIGKILL of unit `unit`'s rank 0: writes
/// run.dir/requests/kill-<this pid>-<n>.json atomically (the directory made 0700). Throws
/// Error naming the file.
void launch_request_kill(const std::filesystem::path& run_dir, int unit, int64_t n);

/// A kill request taken from run.dir/requests.
struct KillRequest {
  int unit = -1;       ///< −1: refused, see `error`
  std::string file;    ///< the request's file (removed)
  std::string error;   ///< why it was refused ("" accepted)
};
/// Reads and removes every request in run.dir/requests, in name order. A request that is not
/// a regular file of ours, not JSON, or whose "unit" is not an integer in 0..units−1 comes back
/// refused, with the reason. Never throws for a request's content.
std::vector<KillRequest> take_kill_requests(const std::filesystem::path& run_dir, int units);

}  // namespace ddiloco
