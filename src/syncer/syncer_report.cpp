// The syncer's end of the job: the last checkpoint, every learner's time book and link
// counters, the final evaluation of Θ, the model file and the `done` event (goodput, global
// downtime, bytes across units, heal times).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "ddiloco/model_io.hpp"
#include "ddiloco/mpi.hpp"
#include "syncer/syncer.hpp"

namespace ddiloco::syncer {

// What the job's end reports: gathered by finish and report, said in the done event and the
// summary lines.
struct Syncer::Outcome {
  double train_end = 0;    // training's end on the syncer's clock, s
  double train_cpu_s = 0;  // the syncer's CPU seconds by then
  int64_t unmerged = 0;    // snapshots on a WAN link when the job ended
  uint64_t window_bytes = 0;
  TimeBook learners;       // over the learner ranks (or units)
  double worst_booking = 0;
  double global_downtime = 0;
  double val_loss = 0;     // of the final Θ
  int64_t steps = 0, tokens = 0, merges = 0;
  int64_t trained = 0;     // tokens trained by this run
  uint64_t bytes = 0;      // across units, each message once
  nlohmann::json links = nlohmann::json::array();
  std::filesystem::path model_path;
};

void Syncer::finish() {
  bar_.finish();
  if (door_) {  // what the link counted since the last poll, then the last summary
    take_link_refusals();
    log_refusals(true);
  }
  if (checkpoints_.on() && (config_.checkpoint.at_stop || checkpoints_.wanted())) {
    core_.poll();  // every unit's last kCheckpointDone
    checkpoints_.try_complete(true, resumed_.elapsed_s + now(), eval_.next);
  }
  Outcome o;
  o.train_end = now();
  o.train_cpu_s = process_cpu_seconds();  // before the final evaluation and the model file
  o.unmerged = core_.snapshots_unmerged();
  std::vector<TimeBook> books = time_books();
  o.window_bytes = window_.bytes_read() + window_.bytes_written();
  window_.close();
  if (!door_) books = protocol::gather_time_books(TimeBook{}, topo_.world);
  report(o, books, link_counters());
}

// The time book unit u's leader left in its window (isolated): its final one with kDone, or, of
// a process that died, as it stood at its last step.
TimeBook Syncer::book_in_window(int u) const {
  double v[TimeBook::kFields];
  for (int i = 0; i < TimeBook::kFields; ++i) v[i] = core_.headers(u).control_f64(protocol::kTimeBook + i);
  return TimeBook::from_vector(v);
}

// Isolated: each unit's leader left its unit's time book in its window with kDone; its
// processes that died left theirs as they stood at their last step (books_before_); what was
// absent (no process until a new one joined) is down time of all its ranks. One job: the
// learners free their windows after the barrier, and the books are gathered over MPI (below).
std::vector<TimeBook> Syncer::time_books() {
  std::vector<TimeBook> books;
  if (!door_) {
    mpi::barrier_patient(topo_.sync_comm);
    return books;
  }
  books.emplace_back();  // the syncer's own, as the one-job deployment's rank 0
  for (int u = 0; u < M_; ++u) {
    books.push_back(unit_book(u));
    window_.set_control(u, protocol::kReleased, 1);  // the unit may close its window now
  }
  return books;
}

// Isolated: its book as its window holds it (its current process's), its dead processes', and
// its closed absences, every rank of it down.
TimeBook Syncer::unit_book(int u) const {
  TimeBook b = book_in_window(u);
  b += books_before_[u];
  const double absent = members_->absent_s(u) * config_.unit_ranks(u);
  b.down += absent;
  b.allocated += absent;
  return b;
}

// What crossed each unit's link: snapshots and merged fragments here; ddp's ring at the
// leaders.
std::vector<wan::LinkCounters> Syncer::link_counters() {
  std::vector<wan::LinkCounters> counters(M_);
  for (int u = 0; u < M_; ++u) counters[u] = links_.counters(u);
  if (!door_)
    for (const wan::LinkCounters& c : wan::gather_link_counters(wan::LinkCounters{}, topo_.world))
      counters[static_cast<size_t>(c.unit)] += c;
  return counters;
}

void Syncer::report(Outcome& o, const std::vector<TimeBook>& books,
                    const std::vector<wan::LinkCounters>& links) {
  o.global_downtime = core_.downtime().finish(o.train_end, core_.nominal_period());
  log_goodput(o, books);
  // Final global evaluation of Θ, then the model file.
  const std::vector<float> flat = core_.flat_theta();
  o.val_loss = eval_.evaluator->evaluate_now(flat);
  log_eval_results();
  o.steps = core_.steps_total();
  o.tokens = core_.tokens_total();
  count_traffic(o, links);
  o.merges = core_.total_merges();
  log_.write({{"event", "global_eval"}, {"final", true}, {"version", o.merges},
              {"round", o.merges / fragments_.size()}, {"step", o.steps / M_},
              {"tokens", o.tokens}, {"elapsed_s", now()}, {"val_loss", o.val_loss}});
  o.model_path = std::filesystem::path(config_.run.dir) / "model.h5";
  save_model(o.model_path, config_.model, flat,
             {{"mode", mode_name(plan_.mode)}, {"version", o.merges}, {"tokens", o.tokens},
              {"val_loss", o.val_loss}, {"run_dir", config_.run.dir}});
  o.trained = o.tokens - resumed_.tokens;  // by this run
  log_.write(done_event(o));
  print_summary(o);
}

// Each learner's time book in a goodput event; their sum, and the worst booking error.
void Syncer::log_goodput(Outcome& o, const std::vector<TimeBook>& books) {
  for (size_t r = 1; r < books.size(); ++r) {
    o.learners += books[r];
    o.worst_booking = std::max(o.worst_booking, std::abs(books[r].booked() - books[r].allocated) /
                                                    std::max(books[r].allocated, 1e-9));
    nlohmann::json e = {{"event", "goodput"}, {door_ ? "unit" : "rank", door_ ? r - 1 : r},
                        {"elapsed_s", now()}};
    e.update(books[r].to_json());
    log_.write(e);
  }
}

// Bytes across units, each message once: snapshots (up) and merged fragments (down); in
// ddp a leader's message crosses its up link and the receiver's down link: counted once, up.
void Syncer::count_traffic(Outcome& o, const std::vector<wan::LinkCounters>& links) const {
  for (const wan::LinkCounters& c : links) {
    o.bytes += c.up_bytes + (plan_.outer_steps ? c.down_bytes : 0);
    o.links.push_back({{"unit", c.unit}, {"up_bytes", c.up_bytes}, {"down_bytes", c.down_bytes},
                       {"up_messages", c.up_messages}, {"down_messages", c.down_messages}});
  }
}

nlohmann::json Syncer::done_event(const Outcome& o) {
  double heal_mean = 0, heal_max = 0;
  if (members_ && !members_->heal_times().empty()) {
    const auto& h = members_->heal_times();
    heal_mean = std::accumulate(h.begin(), h.end(), 0.0) / static_cast<double>(h.size());
    heal_max = *std::max_element(h.begin(), h.end());
  }
  return {{"event", "done"},
          {"mode", mode_name(plan_.mode)},
          {"step", o.steps / M_},
          {"tokens", o.tokens},
          {"elapsed_s", now()},
          {"train_s", o.train_end},
          {"val_loss", o.val_loss},
          {"tokens_per_s", o.trained / o.train_end},
          {"merges", o.merges},
          {"bytes_across_units", o.bytes},
          {"bytes_per_token", o.trained > 0 ? static_cast<double>(o.bytes) / o.trained : 0.0},
          {"wan_format", config_.wan.format},
          {"links", o.links},
          {"window_bytes", o.window_bytes},
          {"snapshots_rejected", core_.snapshots_rejected()},
          {"snapshots_superseded", core_.snapshots_superseded()},
          {"snapshots_in_flight", o.unmerged},  // on a WAN link when the job ended: not merged
          {"interrupted", stop_.signal != 0},
          {"syncer_cpu_s", process_cpu_seconds()},
          // What the syncer took from the learners' cores while they trained: its CPU
          // seconds up to the end of training (set-up included), ÷ train_s for a share.
          {"syncer_train_cpu_s", o.train_cpu_s},
          // Over the learner ranks: useful compute ÷ allocated rank-time.
          {"goodput", o.learners.goodput()},
          {"time", o.learners.to_json()},
          {"booking_error_max", o.worst_booking},
          {"global_downtime_s", o.global_downtime},
          {"downtime_episodes", core_.downtime().episodes()},
          {"longest_update_gap_s", core_.downtime().longest_gap_s()},
          {"rejoins", core_.rejoins_served()},
          {"unit_restarts", members_ ? members_->total_restarts() : 0},
          {"heal_s_mean", heal_mean},
          {"heal_s_max", heal_max},
          // A syncer restarted mid-run: what it recovered (docs/deployments.md "The syncer dying").
          {"syncer_recovered", restart_.recovered.is_null() ? nlohmann::json() : restart_.recovered},
          {"theta_reinitialised", restart_.theta_reinitialised},
          {"model", o.model_path.string()}};
}

void Syncer::print_summary(const Outcome& o) const {
  const std::string resumed_part = resumed_.from.empty() && !restart_.restarted
                                       ? ""
                                       : fmt::format(", {:.2f}M of them in this run", o.trained / 1e6);
  std::printf("%s: mode %s, %.2fM tokens%s in %.1fs (%.0f tokens/s), %lld merges, %.1f MB across "
              "units, final global val_loss %.4f; model saved to %s\n",
              stop_.signal != 0 ? "interrupted" : "done", mode_name(plan_.mode), o.tokens / 1e6,
              resumed_part.c_str(), o.train_end, o.trained / o.train_end, static_cast<long long>(o.merges),
              o.bytes / 1e6, o.val_loss, o.model_path.c_str());
  const TimeBook& l = o.learners;
  std::printf("goodput %.1f%% (learner rank-time %.0fs: compute %.0fs of which discarded %.0fs, "
              "waiting %.0fs, down %.0fs, other %.0fs); global downtime %.1fs\n",
              100 * l.goodput(), l.allocated, l.compute, l.discarded, l.wait, l.down, l.other,
              o.global_downtime);
  if (restart_.theta_reinitialised)  // the last line: a run that lost its model mid-way says so
    std::printf("ddiloco: warning: this run's Θ was re-initialised mid-run: the syncer was restarted "
                "with no checkpoint and no unit could give Θ back (%lld merges lost); its val_loss is "
                "not that of its token budget\n",
                static_cast<long long>(restart_.recovered.value("merges_before", int64_t{0})));
  std::fflush(stdout);
}

}  // namespace ddiloco::syncer
