// The syncer's side of a checkpoint (syncer_checkpoints.hpp).
#include "syncer/syncer_checkpoints.hpp"

#include <cstdio>

#include "ddiloco/error.hpp"

namespace ddiloco::syncer {

SyncerCheckpoints::SyncerCheckpoints(const Config& config, const OuterPlan& plan, SyncerCore& core,
                                     protocol::SyncerWindow& window, SyncerCore::Clock clock, SyncerCore::EventSink log,
                                     ProgressBar& bar,
                                     const std::filesystem::path& resumed_dir, int64_t resumed_id)
    : config_(config),
      plan_(plan),
      core_(core),
      window_(window),
      clock_(std::move(clock)),
      log_(std::move(log)),
      bar_(bar),
      on_(config.checkpoint.enabled()),
      root_(config.checkpoint.directory(config.run.dir)),
      last_unit_file_(config.units.count) {
  if (!resumed_dir.empty())
    for (int u = 0; u < core_.units(); ++u) last_unit_file_[u] = checkpoint::unit_file(resumed_dir, u);
  next_ = std::max(resumed_id, checkpoint::highest_id(root_)) + 1;
}

void SyncerCheckpoints::restore(SyncerCore& core, const Config& config, const checkpoint::SyncerState& state,
                                const std::filesystem::path& dir) {
  const int M = core.units(), P = core.fragments();
  std::vector<std::vector<int64_t>> last_seq(M);
  std::vector<std::vector<std::vector<float>>> refs(M);
  const bool wire_refs = config.wan.format != "fp32" && config.mode != Mode::ddp;  // ddp's window is fp32
  for (int u = 0; u < M; ++u) {
    const std::filesystem::path file = checkpoint::unit_file(dir, u);
    last_seq[u] = checkpoint::unit_last_seq(file, P);
    core.set_tokens_floor(u, checkpoint::unit_tokens(file));
    if (!wire_refs) continue;
    // The unit's own reference when its file holds one at the checkpoint's version (the unit
    // applies the same rule, checkpoint::has_reference).
    const checkpoint::UnitState unit = checkpoint::read_unit(file, P, core.fragment_plan().numels());
    refs[u].resize(P);
    for (int p = 0; p < P; ++p)
      if (checkpoint::has_reference(unit, p, state.versions[p])) refs[u][p] = unit.wire_ref[p];
  }
  core.restore(state, last_seq, refs);
}

// What checkpoint.every counts: merges; in ddp, whose merges only bring θ to evaluate, the inner
// steps of unit 0 (every unit makes the same).
int64_t SyncerCheckpoints::progress() const {
  return plan_.outer_steps ? core_.total_merges() : core_.steps_total() / core_.units();
}

void SyncerCheckpoints::start() {
  // ddp: the units' steps are not known before they report them (a resumed job's start at its
  // checkpoint's): counted from the first report (after_merge).
  due_at_ = plan_.outer_steps ? progress() + config_.checkpoint.every : -1;
  due_at_s_ = clock_() + config_.checkpoint.every_s;
  for (int u = 0; u < core_.units(); ++u) window_.set_control(u, protocol::kCheckpointNext, next_);
}

void SyncerCheckpoints::unit_connected(int u) {
  window_.set_control(u, protocol::kCheckpointNext, next_);
  if (wanted_) window_.set_control(u, protocol::kCheckpointWant, next_);
}

// Asked for before the merge is delivered: a diloco unit then writes its file on the round
// boundary where it applies this merge.
void SyncerCheckpoints::after_merge() {
  if (due_at_ < 0 && progress() > 0) due_at_ = progress() + config_.checkpoint.every;
  const bool by_count = config_.checkpoint.every > 0 && due_at_ >= 0 && progress() >= due_at_;
  const bool by_time = config_.checkpoint.every_s > 0 && clock_() >= due_at_s_;
  if ((by_count || by_time) && !wanted_ && !core_.stopping()) request();
}

std::string SyncerCheckpoints::request_now() {
  if (!on_) return "this run writes no checkpoints (checkpoint.dir)";
  if (wanted_) return fmt::format("checkpoint {} is under way", next_);
  if (core_.stopping()) return "the job is ending (its final checkpoint follows)";
  request();
  return "";
}

// Every unit writes its file at its next step boundary (diloco: round boundary) and says so
// in kCheckpointDone; merging and delivering go on meanwhile.
void SyncerCheckpoints::request() {
  wanted_ = true;
  for (int u = 0; u < core_.units(); ++u)
    if (!core_.unit_done(u)) window_.set_control(u, protocol::kCheckpointWant, next_);
}

// Is unit u's part of checkpoint next_ there? Its own file, or (a unit that finished, or is
// silent: hung, or down after a crash, is not waited for) its newest earlier file, linked in
// (`linked`), which is older than this checkpoint's syncer part: all that resuming needs. So one
// lost unit does not stop checkpoints.
bool SyncerCheckpoints::unit_file_ready(int u, bool final, std::vector<int>& linked) {
  const protocol::UnitHeaders& h = core_.headers(u);
  if (h.control(protocol::kCheckpointDone) == next_) return true;
  if (!core_.unit_done(u) && !core_.silent(u) && window_.remote().connected(u)) return false;  // not yet
  if (last_unit_file_[u].empty()) {
    if (core_.unit_done(u) || final)
      log_({{"event", "checkpoint_skipped"}, {"id", next_}, {"unit", u},
            {"reason", "the unit stopped without ever writing a checkpoint file"}, {"elapsed_s", clock_()}});
    return false;
  }
  linked.push_back(u);
  return true;
}

bool SyncerCheckpoints::try_complete(bool final, double elapsed_s, int64_t next_eval) {
  if (!on_ || (!wanted_ && !final)) return false;
  std::vector<int> linked;
  for (int u = 0; u < core_.units(); ++u) {
    if (core_.headers(u).control(protocol::kCheckpointFailed) == next_) {
      abandon(fmt::format("unit {} could not write its file (see unit_{}.jsonl)", u, u));
      return false;
    }
    if (!unit_file_ready(u, final, linked)) return false;
  }
  const std::filesystem::path dir = checkpoint::directory(root_, next_);
  Stopwatch clock;
  checkpoint::SyncerState st;
  try {
    link_unit_files(dir, linked);
    st = state(dir, elapsed_s, next_eval);
    checkpoint::write_syncer(dir, st, next_ == 2 ? config_.debug.checkpoint_write_delay_ms : 0);
    checkpoint::write_manifest(dir, next_, config_,
                               {{"merges", st.merges}, {"tokens", st.tokens}, {"versions", st.versions},
                                {"elapsed_s", st.elapsed_s}, {"final", final}});
    checkpoint::prune(root_, config_.checkpoint.keep);
  } catch (const std::exception& e) {
    // Disk full, a file system gone: this checkpoint is abandoned, not the job.
    abandon(e.what());
    return false;
  }
  print(fmt::format("checkpoint {}: {} merges, {:.2f}M tokens -> {} ({:.2f} s)\n", next_, st.merges,
                    st.tokens / 1e6, dir.string(), clock.seconds()));
  for (int u = 0; u < core_.units(); ++u) last_unit_file_[u] = checkpoint::unit_file(dir, u);
  log_({{"event", "checkpoint"}, {"id", next_}, {"path", dir.string()}, {"version", st.merges},
        {"tokens", st.tokens}, {"write_s", clock.seconds()}, {"linked_units", linked}, {"final", final},
        {"elapsed_s", clock_()}});
  next();
  return true;
}

// Never over a file the unit wrote meanwhile (it is newer, and written before our part); nor
// will the unit's write replace the link (unit files are written once).
void SyncerCheckpoints::link_unit_files(const std::filesystem::path& dir, const std::vector<int>& linked) const {
  for (int u : linked) {
    std::filesystem::create_directories(dir);
    const auto to = checkpoint::unit_file(dir, u);
    std::error_code ec;
    // Neither follows a symlink planted at `to`: link() fails on an existing entry, and
    // copy_file without overwrite creates its target with O_CREAT | O_EXCL.
    std::filesystem::create_hard_link(last_unit_file_[u], to, ec);
    if (ec && !std::filesystem::exists(to))
      std::filesystem::copy_file(last_unit_file_[u], to, std::filesystem::copy_options::skip_existing);
  }
}

checkpoint::SyncerState SyncerCheckpoints::state(const std::filesystem::path& dir, double elapsed_s,
                                                 int64_t next_eval) {
  checkpoint::SyncerState st;
  st.id = next_;
  st.mode = mode_name(plan_.mode);
  st.config_yaml = to_yaml(config_);
  st.model = config_.model;
  st.units = core_.units();
  st.fragments = core_.fragments();
  st.h = plan_.h;
  // ddp: Θ is θ as unit 0 last shipped it for evaluation; the checkpoint's is its file's.
  st.theta = plan_.outer_steps ? core_.flat_theta()
                               : checkpoint::read_unit(checkpoint::unit_file(dir, 0), core_.fragments()).params;
  st.momentum = core_.flat_momentum();
  st.versions = core_.versions();
  for (const auto& row : core_.merged_seq()) st.merged_seq.insert(st.merged_seq.end(), row.begin(), row.end());
  st.grace = core_.grace().state();
  st.merges = core_.total_merges();
  // What the units' files record (a resumed job starts from these), not what they have done
  // since.
  for (int u = 0; u < core_.units(); ++u) st.tokens += checkpoint::unit_tokens(checkpoint::unit_file(dir, u));
  st.next_eval = next_eval;
  st.elapsed_s = elapsed_s;
  st.run_seed = config_.run.seed;
  st.chaos_seed = config_.chaos.seed;
  return st;
}

// The checkpoint being written stays incomplete (pruned once a later one is complete); the
// next is asked for at its time.
void SyncerCheckpoints::abandon(const std::string& why) {
  print(fmt::format("ddiloco: warning: checkpoint {} abandoned: {}\n", next_, why), /*error=*/true);
  log_({{"event", "checkpoint_failed"}, {"id", next_}, {"error", why}, {"tokens", core_.tokens_total()},
        {"elapsed_s", clock_()}});
  next();
}

void SyncerCheckpoints::next() {
  ++next_;
  wanted_ = false;
  due_at_ = progress() + config_.checkpoint.every;
  due_at_s_ = clock_() + config_.checkpoint.every_s;
  for (int u = 0; u < core_.units(); ++u)
    if (!core_.unit_done(u)) window_.set_control(u, protocol::kCheckpointNext, next_);
}

void SyncerCheckpoints::print(const std::string& line, bool error) {
  if (bar_.enabled()) bar_.clear();
  std::fputs(line.c_str(), error ? stderr : stdout);
  std::fflush(error ? stderr : stdout);
}

}  // namespace ddiloco::syncer
