// The syncer's end of the job: the last checkpoint, every learner's time book and link
// counters, the final evaluation of Θ, the model file and the `done` event (goodput, global
// downtime, bytes across units, heal times).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "ddiloco/model_io.hpp"
#include "ddiloco/mpi.hpp"
#include "sync/syncer.hpp"

namespace ddiloco {

void Syncer::finish() {
  bar_.finish();
  if (checkpoints_.on() && (config_.checkpoint.at_stop || checkpoints_.wanted())) {
    core_.poll();  // every unit's last kCheckpointDone
    checkpoints_.try_complete(true, resumed_elapsed_s_ + now(), next_eval_);
  }
  const double train_end = now();
  train_cpu_s_ = process_cpu_seconds();  // before the final evaluation and the model file
  const int64_t unmerged = core_.snapshots_unmerged();
  std::vector<TimeBook> books = time_books();
  const uint64_t window_bytes = window_.bytes_read() + window_.bytes_written();
  window_.close();
  if (!door_) books = gather_time_books(TimeBook{}, topo_.world);
  report(train_end, books, link_counters(), window_bytes, unmerged);
}

// The time book unit u's leader left in its window (isolated): its final one with kDone, or, of
// a process that died, as it stood at its last step.
TimeBook Syncer::book_in_window(int u) const {
  double v[TimeBook::kFields];
  for (int i = 0; i < TimeBook::kFields; ++i) v[i] = core_.headers(u).control_f64(sync::kTimeBook + i);
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
    TimeBook b = book_in_window(u);
    b += books_before_[u];
    const double absent = members_->absent_s(u) * config_.unit_ranks(u);
    b.down += absent;
    b.allocated += absent;
    books.push_back(b);
    window_.set_control(u, sync::kReleased, 1);  // the unit may close its window now
  }
  return books;
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

void Syncer::report(double train_end, const std::vector<TimeBook>& books,
                    const std::vector<wan::LinkCounters>& links, uint64_t window_bytes, int64_t unmerged) {
  const double global_downtime = core_.downtime().finish(train_end, core_.nominal_period());
  TimeBook learners;
  double worst_booking = 0;
  for (size_t r = 1; r < books.size(); ++r) {
    learners += books[r];
    worst_booking = std::max(worst_booking, std::abs(books[r].booked() - books[r].allocated) /
                                                std::max(books[r].allocated, 1e-9));
    nlohmann::json e = {{"event", "goodput"}, {door_ ? "unit" : "rank", door_ ? r - 1 : r},
                        {"elapsed_s", now()}};
    e.update(books[r].to_json());
    log_.write(e);
  }

  // Final global evaluation of Θ, then the model file.
  const std::vector<float> flat = core_.flat_theta();
  const double val_loss = evaluator_->evaluate_now(flat);
  log_eval_results();
  const int64_t steps = core_.steps_total();
  const int64_t tokens = core_.tokens_total();
  // Bytes across units, each message once: snapshots (up) and merged fragments (down); in
  // ddp a leader's message crosses its up link and the receiver's down link: counted once, up.
  uint64_t bytes = 0;
  nlohmann::json link_json = nlohmann::json::array();
  for (const wan::LinkCounters& c : links) {
    bytes += c.up_bytes + (plan_.outer_steps ? c.down_bytes : 0);
    link_json.push_back({{"unit", c.unit}, {"up_bytes", c.up_bytes}, {"down_bytes", c.down_bytes},
                         {"up_messages", c.up_messages}, {"down_messages", c.down_messages}});
  }
  const int64_t merges = core_.total_merges();
  log_.write({{"event", "global_eval"}, {"final", true}, {"version", merges},
              {"round", merges / fragments_.size()}, {"step", steps / M_},
              {"tokens", tokens}, {"elapsed_s", now()}, {"val_loss", val_loss}});
  double heal_mean = 0, heal_max = 0;
  if (members_ && !members_->heal_times().empty()) {
    const auto& h = members_->heal_times();
    heal_mean = std::accumulate(h.begin(), h.end(), 0.0) / static_cast<double>(h.size());
    heal_max = *std::max_element(h.begin(), h.end());
  }
  const std::filesystem::path model_path = std::filesystem::path(config_.run.dir) / "model.h5";
  save_model(model_path, config_.model, flat,
             {{"mode", mode_name(plan_.mode)}, {"version", merges}, {"tokens", tokens},
              {"val_loss", val_loss}, {"run_dir", config_.run.dir}});
  const int64_t trained = tokens - resumed_tokens_;  // by this run
  log_.write({{"event", "done"},
              {"mode", mode_name(plan_.mode)},
              {"step", steps / M_},
              {"tokens", tokens},
              {"elapsed_s", now()},
              {"train_s", train_end},
              {"val_loss", val_loss},
              {"tokens_per_s", trained / train_end},
              {"merges", merges},
              {"bytes_across_units", bytes},
              {"bytes_per_token", trained > 0 ? static_cast<double>(bytes) / trained : 0.0},
              {"wan_format", config_.wan.format},
              {"links", link_json},
              {"window_bytes", window_bytes},
              {"snapshots_rejected", core_.snapshots_rejected()},
              {"snapshots_superseded", core_.snapshots_superseded()},
              {"snapshots_in_flight", unmerged},  // on a WAN link when the job ended: not merged
              {"interrupted", interrupted_by_ != 0},
              {"syncer_cpu_s", process_cpu_seconds()},
              // What the syncer took from the learners' cores while they trained: its CPU
              // seconds up to the end of training (set-up included), ÷ train_s for a share.
              {"syncer_train_cpu_s", train_cpu_s_},
              // Over the learner ranks: useful compute ÷ allocated rank-time.
              {"goodput", learners.goodput()},
              {"time", learners.to_json()},
              {"booking_error_max", worst_booking},
              {"global_downtime_s", global_downtime},
              {"downtime_episodes", core_.downtime().episodes()},
              {"longest_update_gap_s", core_.downtime().longest_gap_s()},
              {"rejoins", core_.rejoins_served()},
              {"unit_restarts", members_ ? members_->total_restarts() : 0},
              {"heal_s_mean", heal_mean},
              {"heal_s_max", heal_max},
              // A syncer restarted mid-run: what it recovered (README "The syncer dying").
              {"syncer_recovered", recovered_.is_null() ? nlohmann::json() : recovered_},
              {"theta_reinitialised", theta_reinitialised_},
              {"model", model_path.string()}});
  const std::string resumed_part =
      resumed_from_.empty() && !restarted_ ? "" : fmt::format(", {:.2f}M of them in this run", trained / 1e6);
  std::printf("%s: mode %s, %.2fM tokens%s in %.1fs (%.0f tokens/s), %lld merges, %.1f MB across "
              "units, final global val_loss %.4f; model saved to %s\n",
              interrupted_by_ != 0 ? "interrupted" : "done", mode_name(plan_.mode), tokens / 1e6,
              resumed_part.c_str(), train_end, trained / train_end, static_cast<long long>(merges),
              bytes / 1e6, val_loss, model_path.c_str());
  std::printf("goodput %.1f%% (learner rank-time %.0fs: compute %.0fs of which discarded %.0fs, "
              "waiting %.0fs, down %.0fs, other %.0fs); global downtime %.1fs\n",
              100 * learners.goodput(), learners.allocated, learners.compute, learners.discarded,
              learners.wait, learners.down, learners.other, global_downtime);
  if (theta_reinitialised_)  // the last line: a run that lost its model mid-way says so
    std::printf("ddiloco: warning: this run's Θ was re-initialised mid-run: the syncer was restarted "
                "with no checkpoint and no unit could give Θ back (%lld merges lost); its val_loss is "
                "not that of its token budget\n",
                static_cast<long long>(recovered_.value("merges_before", int64_t{0})));
  std::fflush(stdout);
}

}  // namespace ddiloco
