// The syncer process's parts around its decisions (syncer_core.hpp): admission of units in
// the isolated deployment, global evaluation, checkpoints, the stop, and the job's report.
//   syncer.cpp            construction, the run loop, admission, the stop
//   syncer_checkpoints.*  the syncer's side of a checkpoint
//   syncer_recovery.cpp   a syncer restarted mid-run: Θ recovered from the units' copies
//   syncer_report.cpp     the end: time books, links, the final evaluation, the done event
//   syncer_status.cpp     the live status page's snapshot and actions (docs/status_page.md)
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ddiloco/config.hpp"
#include "ddiloco/fragments.hpp"
#include "ddiloco/membership.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/model.hpp"
#include "ddiloco/recovery.hpp"
#include "ddiloco/syncer.hpp"
#include "ddiloco/time_books.hpp"
#include "ddiloco/sync_window.hpp"
#include "ddiloco/syncer_core.hpp"
#include "ddiloco/topology.hpp"
#include "ddiloco/unit_links.hpp"
#include "syncer/global_eval.hpp"
#include "syncer/read_hooks.hpp"
#include "syncer/refusal_log.hpp"
#include "syncer/status_board.hpp"
#include "syncer/status_server.hpp"
#include "syncer/syncer_checkpoints.hpp"

namespace ddiloco::syncer {

/// Admits connection `id` as unit `unit` through `door`. When the link cannot take it (a
/// malformed remote key, out of threads or descriptors: admit() throws) the connection is
/// refused instead, a refusal that fails too is ignored (the link dropped it), and the reason
/// is returned; "" when admitted. Never throws: one unit's bad key must not stop the syncer.
std::string admit_or_refuse(comm::UnitListener& door, int64_t id, int unit);

}  // namespace ddiloco::syncer

namespace ddiloco::syncer {

class Syncer {
 public:
  Syncer(const Config& config, const OuterPlan& plan, const Topology& topo, const ValidationSet& val,
         const checkpoint::SyncerState* resumed, const std::filesystem::path& resumed_dir,
         const SyncerLink& link);
  /// Runs the job to its end; returns the stop signal that ended it early, or 0.
  int run();

 private:
  double now() const { return wall_.seconds(); }
  // Merges between two global evaluations: eval_every outer rounds of P merges; in ddp every
  // θ unit 0 ships (it ships at the evaluation cadence).
  int64_t eval_stride() const;
  void start();
  bool poll_once();  // one iteration of the run loop; true if anything happened
  int idle_poll_us() const;
  void check_stop();
  void admit_units();
  void take_link_refusals();
  void refused(const std::string& peer, int unit, const std::string& reason, int64_t n);
  void log_refusals(bool force);
  void unit_joined(int u, const protocol::Hello& hello);
  void unit_lost(int u, const std::string& reason);
  void after_merge(int p, const std::vector<int>& units);
  // Finished, or (isolated, once the job is ending) absent: nothing more to wait for.
  bool unit_finished(int u) const;
  // A syncer restarted mid-run (syncer_recovery.cpp): nothing is merged, delivered or served
  // until Θ is recovered from the units' offers.
  void recover_once();
  bool read_offer(int u);
  void settle_offers();
  void finish_recovery();
  int64_t merges_before_restart() const;
  void maybe_evaluate();
  void log_eval_results();
  // The status page (syncer_status.cpp).
  void start_status();
  void publish_status();
  UnitStatus unit_status(int u) const;
  void status_goodput(StatusSnapshot& s) const;
  void take_status_actions();
  void act(const StatusServer::Action& a);
  // The end (syncer_report.cpp).
  TimeBook book_in_window(int u) const;
  TimeBook unit_book(int u) const;  // isolated: unit u's book so far, its dead processes' and absences included
  void finish();
  std::vector<TimeBook> time_books();
  std::vector<wan::LinkCounters> link_counters();
  struct Outcome;
  void report(Outcome& o, const std::vector<TimeBook>& books, const std::vector<wan::LinkCounters>& links);
  void log_goodput(Outcome& o, const std::vector<TimeBook>& books);
  void count_traffic(Outcome& o, const std::vector<wan::LinkCounters>& links) const;
  nlohmann::json done_event(const Outcome& o);
  void print_summary(const Outcome& o) const;

  const Config& config_;
  const OuterPlan plan_;
  const int M_;
  const Topology& topo_;
  const ParameterLayout parameters_;
  const protocol::FragmentPlan fragments_;
  const protocol::WindowLayout layout_;
  comm::RemoteMemory& remote_;
  // The isolated deployment: where units join and leave (null in the one-job deployment, where
  // every unit is present from the start to the end).
  comm::UnitListener* door_;
  std::unique_ptr<protocol::Membership> members_;
  RefusalLog refusals_;  // refused connections: a few lines, then a summary per interval
  std::vector<TimeBook> books_before_;  // isolated, per unit: its dead processes' time books
  protocol::SyncerWindow window_;
  syncer::UnitLinks links_;
  Stopwatch wall_;
  JsonlWriter log_;
  ProgressBar bar_{config_.run.progress};
  syncer::SyncerCore core_;
  syncer::SyncerCheckpoints checkpoints_;
  syncer::ReadHooks read_hooks_;  // debug.* test hooks on snapshot reads
  int64_t budget_ = 0;
  // What this run goes on from: the checkpoint it resumed (if any), and the tokens trained
  // before it (a restarted syncer's: those it recovered).
  struct Resumed {
    std::string from;       // the checkpoint's directory ("" = none)
    double elapsed_s = 0;   // wall time of the runs this one resumes
    int64_t tokens = 0;
    int64_t next_eval = 0;  // the merges its next evaluation was due at (0: none)
  };
  Resumed resumed_;
  // Global evaluation of Θ: the validation set, the evaluator (made at the start), and the
  // merges the next evaluation is due at.
  struct Evaluation {
    explicit Evaluation(const ValidationSet& v) : val(v) {}
    const ValidationSet& val;
    std::unique_ptr<GlobalEvaluator> evaluator;
    int64_t next = 0;
  };
  Evaluation eval_;
  // How the job is ending early: the signal that interrupted it, and what that asked for.
  struct Stop {
    int signal = 0;              // 0: not interrupted
    bool leave_units = false;    // isolated, signalled, syncer.signal_stops_units off: exit alone
    int64_t after_version = 0;   // diloco, interrupted: the round every unit ends on
  };
  Stop stop_;
  // A syncer restarted mid-run: recovering while `recovery` is set, with the copies of Θ
  // offered so far, then what it recovered.
  struct Restart {
    explicit Restart(bool r) : restarted(r) {}
    const bool restarted;
    std::unique_ptr<syncer::Recovery> recovery;
    std::vector<std::vector<syncer::Offer>> copies;  // per fragment: those at the newest version offered
    nlohmann::json recovered;          // the syncer_recovered event (null: not restarted)
    bool theta_reinitialised = false;  // nothing of Θ's merges could be recovered
    void keep_newest(int p, syncer::Offer offer);
  };
  Restart restart_;
  // A unit's offer of its copies of Θ (it reconnected, or is recovering this syncer): read,
  // then settled (syncer_recovery.cpp).
  struct UnitOffer {
    std::vector<int64_t> versions;  // of the offer just read: per fragment, 0 none, −1 refused
    std::vector<int64_t> epochs;    // ... and the epoch of each copy's syncer
    int64_t settled = 0;            // the last offer settled
  };
  std::vector<UnitOffer> unit_offers_;  // per unit
  // The status page (docs/status_page.md): the board the loop publishes to about four times
  // a second, and the server that reads it (null: syncer.http off).
  struct Status {
    explicit Status(int units) : board(units) {}
    StatusBoard board;
    std::unique_ptr<StatusServer> server;
    std::shared_ptr<const std::string> yaml;
    pid_t launcher = 0;  // under `ddiloco launch`: the launcher, which carries out kills
    double next_publish = 0;
    int64_t requests = 0;  // kill requests written
  };
  Status status_;
};

}  // namespace ddiloco::syncer
