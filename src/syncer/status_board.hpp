// What the syncer's status page shows (docs/status_page.md): the merge loop fills a
// StatusSnapshot and publishes it; the HTTP threads (status_server.hpp) only ever read the
// latest one published, so that no request waits on, or holds, anything a merge needs.
//   StatusBoard        the loop's side: the history the page draws (merges, losses, events),
//                      kept from the events the syncer logs, and the publication
//   to_json / to_prometheus   renderings of one snapshot, for /api/state and /metrics
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace ddiloco::syncer {

/// One unit's row. Counts are as the syncer last polled them from the unit's window, so they
/// are the unit's claims (untrusted: shown, never acted on).
struct UnitStatus {
  int unit = 0;
  std::string state;         ///< starting | training | silent | lost | rejoining | done
  int64_t pid = 0;           ///< its leader's process id (0: unknown, one-job runs)
  std::string host;          ///< ... and host ("" unknown)
  int64_t restarts = 0;      ///< processes of it that joined after its first
  int64_t steps = 0, tokens = 0;  ///< inner steps and tokens, its earlier processes' included
  int64_t staleness = 0;     ///< merges of Θ it has not taken yet (max over fragments)
  double last_merge_s = -1;  ///< seconds since a merge last included it (−1: never)
  uint64_t bytes_up = 0, bytes_down = 0;  ///< its link since this syncer started, bytes
  std::optional<double> train_loss;       ///< its last log interval's mean (none yet: nullopt)
  double step_time_s = 0;    ///< its moving average, seconds (0: not known yet)
};

/// Everything one page refresh shows. The curves and events are shared with the board and
/// copied only when they change.
struct StatusSnapshot {
  double elapsed_s = 0;
  nlohmann::json run;  ///< dir, mode, units, fragments, h, tau, quorum, token_budget, isolated
  int64_t tokens = 0, merges = 0;
  std::vector<int64_t> versions;  ///< merges per fragment
  double merge_rate = 0;          ///< merges per second over the last 60 s
  bool stopping = false, checkpoint_wanted = false, recovering = false;
  std::vector<UnitStatus> units;
  std::shared_ptr<const std::vector<std::array<double, 3>>> val_loss;    ///< tokens, elapsed_s, loss
  std::shared_ptr<const std::vector<std::array<double, 4>>> train_loss;  ///< unit, job tokens, elapsed_s, loss
  std::optional<double> goodput;  ///< useful ÷ allocated over the units' books so far
  double useful_s = 0, allocated_s = 0, global_downtime_s = 0;
  std::shared_ptr<const std::string> config_yaml;
  std::shared_ptr<const std::vector<nlohmann::json>> events;  ///< oldest first
  struct Actions {
    bool kill = false, checkpoint = false, stop = false;
  } actions;
};

/// /api/state: the snapshot as JSON (docs/status_page.md, schema "ddiloco.status/1").
nlohmann::json to_json(const StatusSnapshot& s);
/// /metrics: Prometheus text exposition format 0.0.4 (docs/status_page.md lists the metrics).
std::string to_prometheus(const StatusSnapshot& s);

class StatusBoard {
 public:
  static constexpr size_t kEvents = 200;         ///< recent events kept
  static constexpr size_t kTrainSamples = 2000;  ///< training-loss samples kept (all units)
  static constexpr double kRateWindowS = 60;     ///< the merge rate's window, seconds

  explicit StatusBoard(int units);
  /// An event the syncer logged (its metrics.jsonl line): merges feed the merge rate and the
  /// units' last merge, global evaluations the loss curve, the rest the recent events.
  void event(const nlohmann::json& e);
  /// Unit u's training loss as polled now, when the job had trained `tokens` (all units), at `now_s`: a sample when it changed.
  void train_loss(int u, double loss, int64_t tokens, double now_s);
  /// Merges per second over the last kRateWindowS before `now_s` (or since the first merge).
  double merge_rate(double now_s);
  /// When a merge last included unit u, seconds on the syncer's clock (−1: never).
  double last_merged_at(int u) const { return last_merge_[u]; }
  /// Fills the snapshot's curves and events (shared with earlier snapshots while unchanged).
  void attach_history(StatusSnapshot& s);
  /// Makes `s` the snapshot readers get from now on.
  void publish(std::shared_ptr<const StatusSnapshot> s);
  /// The latest published (null before the first). Safe from any thread.
  std::shared_ptr<const StatusSnapshot> latest() const;

 private:
  std::deque<double> merge_times_;  // within the rate window
  double first_merge_ = -1;
  std::vector<double> last_merge_;  // per unit
  std::vector<double> last_loss_;   // per unit, the last sampled (NaN: none)
  std::shared_ptr<const std::vector<std::array<double, 3>>> val_;
  std::shared_ptr<const std::vector<std::array<double, 4>>> train_;
  std::deque<nlohmann::json> events_;  // the last kEvents
  bool events_dirty_ = false;
  std::shared_ptr<const std::vector<nlohmann::json>> events_shared_;  // events_ as last published
  mutable std::mutex mutex_;  // guards latest_ only: held for a pointer copy
  std::shared_ptr<const StatusSnapshot> latest_;
};

}  // namespace ddiloco::syncer
