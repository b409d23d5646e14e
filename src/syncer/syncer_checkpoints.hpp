// The syncer's side of a checkpoint (checkpoint.hpp; docs/checkpoints.md "Checkpoints"): it asks every unit
// for its file, and once all are written (or linked from an earlier checkpoint for a unit that
// finished or is silent) writes its own part and the manifest last, so that the syncer's part
// is newer than every unit's: what resuming assumes (learner resume, checkpoint.hpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ddiloco/checkpoint.hpp"
#include "ddiloco/config.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/syncer.hpp"
#include "ddiloco/time_books.hpp"
#include "ddiloco/syncer_core.hpp"

namespace ddiloco::syncer {

class SyncerCheckpoints {
 public:
  /// `resumed_dir`: the checkpoint the job resumed from ("" = a fresh start); the core has been
  /// restored from it already (restore()). `bar` is cleared before anything is printed.
  SyncerCheckpoints(const Config& config, const OuterPlan& plan, SyncerCore& core, protocol::SyncerWindow& window,
                    SyncerCore::Clock clock, SyncerCore::EventSink log, ProgressBar& bar, const std::filesystem::path& resumed_dir,
                    int64_t resumed_id);

  /// Restores `core` from checkpoint `dir` (its syncer file `state`, and every unit's file for
  /// the snapshot numbering and the wire references). Throws Error for a corrupt unit file.
  static void restore(SyncerCore& core, const Config& config, const checkpoint::SyncerState& state,
                      const std::filesystem::path& dir);

  bool on() const { return on_; }
  const std::filesystem::path& root() const { return root_; }
  /// At the job's start (after the core was restored): tells every unit which checkpoint comes
  /// next (where a unit that stops writes its file), and when the first periodic one is due.
  void start();
  /// A unit (re)connected: it is told the same, and asked for the file if one is wanted.
  void unit_connected(int u);
  /// After a merge (ddp: after the syncer saw unit 0 step): asks the units for their files
  /// when checkpoint.every merges (ddp: inner steps) or checkpoint.every_s seconds have passed.
  void after_merge();
  /// A checkpoint now (the status page's action), asked for as a periodic one is; "" when
  /// asked, else why not (checkpoints off, one already under way, the job ending).
  std::string request_now();
  /// Is a checkpoint asked for and not complete yet?
  bool wanted() const { return wanted_; }
  /// Completes the checkpoint asked for once every unit has written its file; `final`: the job
  /// is over and every unit has stopped. `elapsed_s` is the job time to record, `next_eval`
  /// the merge count of the next global evaluation. Returns true when it was written.
  bool try_complete(bool final, double elapsed_s, int64_t next_eval);

 private:
  void request();
  int64_t progress() const;
  bool unit_file_ready(int u, bool final, std::vector<int>& linked);
  checkpoint::SyncerState state(const std::filesystem::path& dir, double elapsed_s, int64_t next_eval);
  void link_unit_files(const std::filesystem::path& dir, const std::vector<int>& linked) const;
  void abandon(const std::string& why);
  void next();
  void print(const std::string& line, bool error = false);

  const Config& config_;
  const OuterPlan plan_;
  SyncerCore& core_;
  protocol::SyncerWindow& window_;
  SyncerCore::Clock clock_;
  SyncerCore::EventSink log_;
  ProgressBar& bar_;
  const bool on_;
  std::filesystem::path root_;
  int64_t next_ = 1;        // id of the checkpoint being (or next to be) written
  bool wanted_ = false;     // the units were asked for checkpoint next_
  int64_t due_at_ = 0;      // progress() at which the next periodic checkpoint is asked for
  double due_at_s_ = 0;     // ... or the time, s (checkpoint.every_s)
  std::vector<std::filesystem::path> last_unit_file_;  // per unit: its newest checkpoint file
};

}  // namespace ddiloco::syncer
