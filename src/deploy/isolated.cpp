// The isolated deployment's two processes: the syncer alone, and one unit job. Everything
// that is not about the link (set-up, the roles' loops) is the one-job deployment's code.
#include "ddiloco/isolated.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <fstream>
#include <mutex>
#include <thread>

#include "ddiloco/error.hpp"
#include "ddiloco/membership.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/run_dir.hpp"
#include "ddiloco/runtime.hpp"
#include "ddiloco/syncer.hpp"
#include "ddiloco/time_books.hpp"
#include "ddiloco/signals.hpp"
#include "ddiloco/sync_window.hpp"
#include "ddiloco/topology.hpp"
#include "ddiloco/link.hpp"

namespace ddiloco::deploy {

namespace {

using Clock = std::chrono::steady_clock;

void require_outer_mode(const Config& config, const char* command) {
  if (!mode_traits(config.mode).outer_steps)
    fail("ddiloco {}: mode {} cannot run as separate jobs (it has no syncer, or its units "
         "all-reduce gradients every step in one MPI world): use `ddiloco train` (modes "
         "decoupled, diloco and streaming can)",
         command, mode_name(config.mode));
}

int64_t restart_count() {
  const char* r = std::getenv("DDILOCO_RESTART");
  if (r == nullptr || *r == '\0') return 0;
  char* end = nullptr;
  const long long n = std::strtoll(r, &end, 10);
  if (*end != '\0' || n < 0) fail("DDILOCO_RESTART: expected a count ≥ 0, got '{}'", r);
  return n;
}

// The syncer a unit talks to: syncer.address, or what the rendezvous file says; the run id and
// the secret always come from run.dir. nullopt while the syncer has not written them yet.
std::optional<protocol::Rendezvous> find_syncer(const Config& config) {
  auto r = protocol::Rendezvous::read(config.run.dir);
  if (r && !config.syncer.address.empty()) r->address = config.syncer.address;
  return r;
}

// One attempt to be admitted by the syncer that the rendezvous file names now (a restarted
// syncer may listen elsewhere), presenting that file's run id and secret in `hello`.
struct Admission {
  bool admitted = false;
  std::string address;         // admitted: the syncer's address
  std::string error;           // not admitted: why (empty: no rendezvous file to try yet)
  std::exception_ptr refusal;  // the syncer refused us on anything but the run id
  bool held = false;           // ... because a live process holds the unit's index
};

Admission connect_once(comm::UnitEnd& link, const Config& config, protocol::Hello& hello, double timeout_s) {
  Admission a;
  const auto r = find_syncer(config);
  if (!r) return a;
  const char* ours = comm::link_mode_name(comm::resolve_link_mode(config.wan.security, config.syncer.listen));
  if (!r->link.empty() && r->link != ours) {  // final, as a refusal: trying again changes nothing
    a.error = fmt::format("unit {}: the syncer listens with link {} ({}), this unit would speak {} "
                          "(wan.security = {}): give both the same configuration", hello.unit, r->link,
                          protocol::Rendezvous::addr_file(config.run.dir).string(), ours, config.wan.security);
    a.refusal = std::make_exception_ptr(Error(a.error));
    return a;
  }
  hello.run_id = r->run_id;
  hello.proof = protocol::hello_proof(r->secret);
  try {
    link.connect(r->address, r->secret, hello.to_json().dump(), timeout_s);
    a.admitted = true;
    a.address = r->address;
  } catch (const comm::LinkRefused& e) {
    a.error = e.what();
    // A stale rendezvous file (an earlier run's syncer) names another run: read it again.
    // Any other refusal names what differs, which trying again does not change.
    if (e.reason().find("run id") == std::string::npos) a.refusal = std::current_exception();
    a.held = e.reason().find("already held") != std::string::npos;
  } catch (const Error& e) {
    a.error = e.what();
  }
  return a;
}

// Connects to the syncer and is admitted, retrying with backoff (0.1 s doubling to 5 s) while
// the syncer is not there yet or does not answer, for up to syncer.connect_wait_s. A refusal is
// final: it names what differs. Except "already held" for a while: the holder may be this
// unit's previous process, whose death the syncer notices within syncer.heartbeat_timeout_s,
// so that refusal becomes final only once it has lasted longer than that (and 5 s).
void join_syncer(comm::UnitEnd& link, const Config& config, protocol::Hello hello) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(config.syncer.connect_wait_s);
  double pause = 0.1;
  std::string last = "no rendezvous file " + protocol::Rendezvous::addr_file(config.run.dir).string() + " yet";
  std::optional<Clock::time_point> held_since;  // refused as "already held" since then
  for (int attempt = 1;; ++attempt) {
    if (stop_signal() != 0) fail("unit {}: stopped by signal {} while waiting for the syncer", hello.unit, stop_signal());
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    const Admission a = connect_once(link, config, hello, std::clamp(left, 0.5, 10.0));
    if (a.held && !held_since) held_since = Clock::now();
    if (!a.held) held_since.reset();
    const double held_s = held_since ? std::chrono::duration<double>(Clock::now() - *held_since).count() : 0;
    if (a.refusal && (!a.held || held_s > std::max(config.syncer.heartbeat_timeout_s, 5.0)))
      std::rethrow_exception(a.refusal);
    if (a.admitted) {
      if (attempt > 1) std::printf("unit %d: connected to the syncer at %s after %d attempts\n", hello.unit,
                                   a.address.c_str(), attempt);
      return;
    }
    if (!a.error.empty()) last = a.error;
    if (attempt == 1) {  // a unit started before its syncer says what it is waiting for
      std::printf("unit %d: waiting for the syncer (%s); retrying with backoff for up to "
                  "syncer.connect_wait_s = %g s\n", hello.unit, last.c_str(), config.syncer.connect_wait_s);
      std::fflush(stdout);
    }
    if (Clock::now() + std::chrono::duration<double>(pause) > deadline)
      fail("unit {}: no syncer admitted us within syncer.connect_wait_s = {} s (last: {})", hello.unit,
           config.syncer.connect_wait_s, last);
    std::this_thread::sleep_for(std::chrono::duration<double>(pause));
    pause = std::min(pause * 2, 5.0);
  }
}

// A unit leader's watch over its link: when the syncer's endpoint fails (the syncer died, or
// the link broke), it connects again in the background with backoff, re-reading the
// rendezvous file, so that training never waits for it. The learner asks reconnected() once
// per step: true once after each new admission (it then takes Θ from the syncer afresh).
class Reconnector {
 public:
  Reconnector(comm::UnitEnd& link, const Config& config, protocol::Hello hello)
      : link_(link), config_(config), hello_(std::move(hello)), thread_([this] { run(); }) {}
  ~Reconnector() { stop(); }
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  /// Once after each new admission: how long the syncer was gone, seconds.
  std::optional<double> reconnected() {
    if (generation_.exchange(0) == 0) return std::nullopt;
    return last_gap_s_.load();
  }

 private:
  bool sleep(double s) {
    std::unique_lock lock(mutex_);
    return !wake_.wait_for(lock, std::chrono::duration<double>(s), [this] { return stopping_; });
  }
  void run() {
    while (sleep(0.2)) {
      if (link_.connected()) continue;
      const auto lost_at = Clock::now();
      std::printf("unit %d: lost the syncer (%s); training on, reconnecting in the background\n",
                  hello_.unit, link_.lost_reason().c_str());
      std::fflush(stdout);
      double pause = 0.2;
      while (sleep(pause)) {
        pause = std::min(pause * 2, 5.0);
        // Not back yet, or a stale rendezvous file: every failure, a refusal too, is retried.
        const Admission a = connect_once(link_, config_, hello_, 5.0);
        if (!a.admitted) continue;
        const double gap = std::chrono::duration<double>(Clock::now() - lost_at).count();
        last_gap_s_.store(gap);
        std::printf("unit %d: reconnected to the syncer at %s after %.1f s\n", hello_.unit,
                    a.address.c_str(), gap);
        std::fflush(stdout);
        generation_.fetch_add(1);
        break;
      }
    }
  }
  comm::UnitEnd& link_;
  const Config& config_;
  protocol::Hello hello_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::atomic<int64_t> generation_{0};
  std::atomic<double> last_gap_s_{0.0};
  std::thread thread_;  // last: started once the members above exist
};

// Two live syncers of one run would split it: a syncer whose rendezvous (`previous`) names a
// ddiloco process still running on this host is not replaced.
void refuse_if_running(const std::optional<protocol::Rendezvous>& previous, const Config& config) {
  if (!previous || previous->host != host_name() || previous->pid == ::getpid() || previous->pid <= 0) return;
  std::ifstream comm("/proc/" + std::to_string(previous->pid) + "/comm");
  std::string name;
  if (std::getline(comm, name) && name == "ddiloco")
    fail("syncer: the syncer of this run is still running (pid {} on {}, {}): stop it first, or pass "
         "--overwrite for a new run", previous->pid, previous->host,
         protocol::Rendezvous::addr_file(config.run.dir).string());
}

bool is_loopback_listen(const std::string& listen) {
  return comm::resolve_link_mode("auto", listen) == comm::LinkMode::authenticated;
}

}  // namespace

int run_syncer_process(const Config& config, bool overwrite, const std::string& resume_arg) {
  require_outer_mode(config, "syncer");
  const OuterPlan plan = OuterPlan::from(config);
  const Topology topology(config, MPI_COMM_WORLD, -1);
  configure_threads(config.run.threads, MPI_COMM_WORLD);
  const bool never = resume_arg == "never";
  const std::string resume = resume_arg.empty() || never ? "" : checkpoint::choose(config, resume_arg);
  // --resume auto where a syncer of this run died (its rendezvous file is still there: a
  // syncer that ends removes it): this one replaces it, recovering Θ from the units.
  const bool restart = resume_arg == "auto" && !overwrite &&
                       std::filesystem::exists(protocol::Rendezvous::addr_file(config.run.dir)) &&
                       std::filesystem::exists(std::filesystem::path(config.run.dir) / "metrics.jsonl");
  // A syncer restarted into the same run keeps its run id and secret, so that the units'
  // next handshakes match; a fresh run makes new ones.
  const auto previous = resume.empty() && !restart ? std::nullopt : protocol::Rendezvous::read(config.run.dir);
  if (restart) {
    refuse_if_running(previous, config);
    std::printf("syncer: a syncer of this run died (%s is left): this one replaces it\n",
                protocol::Rendezvous::addr_file(config.run.dir).c_str());
  }
  const bool replace = overwrite || never || (resume_arg == "auto" && resume.empty() && !restart);
  SyncerSetup setup = set_up_syncer(config, plan, MPI_COMM_WORLD, resume, replace, restart);
  const protocol::Endpoint listen = protocol::Endpoint::parse(config.syncer.listen, "syncer.listen");
  protocol::Rendezvous rv;
  rv.run_id = previous ? previous->run_id : protocol::Rendezvous::random_token();
  rv.secret = previous ? previous->secret : protocol::Rendezvous::random_token();
  const comm::LinkMode mode = comm::resolve_link_mode(config.wan.security, config.syncer.listen);
  const std::unique_ptr<comm::SyncerEnd> end =
      comm::listen_for_units(mode, rv.secret, listen.ip, listen.port, config.units.count);
  comm::SyncerEnd& link = *end;
  link.set_op_timeout(config.syncer.link_timeout_s);
  link.set_min_rate(config.syncer.link_min_mbit_s * 1e6 / 8);
  rv.address = link.address();
  rv.pid = ::getpid();
  rv.host = host_name();
  rv.link = comm::link_mode_name(mode);
  rv.write(config.run.dir);
  std::printf("syncer: listening on %s, link %s (run %s; %s)\n", rv.address.c_str(), comm::link_mode_name(mode),
              rv.run_id.c_str(), protocol::Rendezvous::addr_file(config.run.dir).c_str());
  if (mode == comm::LinkMode::trusted && !is_loopback_listen(config.syncer.listen))
    std::printf("syncer: WARNING: wan.security = trusted on %s, beyond loopback: any peer that reaches "
                "this port can read and write the memory of this syncer and of its units, the run's "
                "secret included (docs/security.md). Use encrypted (the default) unless only this job's "
                "own processes can reach the port.\n", rv.address.c_str());
  if (mode == comm::LinkMode::authenticated && !is_loopback_listen(config.syncer.listen))
    std::printf("syncer: WARNING: wan.security = authenticated on %s, beyond loopback: peers must prove the "
                "secret, but Θ and the snapshots travel in clear, and whoever is on the path can read "
                "them or take over a connection once it is admitted (docs/security.md). Use encrypted "
                "(the default) across networks you do not control.\n", rv.address.c_str());
  std::fflush(stdout);
  const int signal = syncer::run_syncer(config, plan, topology, *setup.val, resume,
                                setup.state ? &*setup.state : nullptr,
                                syncer::SyncerLink{&link, &link, rv.run_id, rv.secret, restart});
  // A unit that starts after the end finds no syncer instead of a dead address. A syncer that
  // leaves its units training (its job requeued: syncer.signal_stops_units off) keeps the file:
  // its next start is a restart, which recovers Θ from them (docs/deployments.md "The syncer dying").
  if (signal == 0 || config.syncer.signal_stops_units) {
    std::error_code ec;
    std::filesystem::remove(protocol::Rendezvous::addr_file(config.run.dir), ec);
  }
  return signal;
}

// The window memory the learner owns: the link, and the watch over it, which stops before
// the link goes on every path out of the learner (an error's included), so that it never
// touches a destroyed link.
class WatchedMemory final : public comm::ExposedMemory {
 public:
  WatchedMemory(std::unique_ptr<comm::UnitEnd> link, Reconnector& watch) : link_(std::move(link)), watch_(watch) {}
  ~WatchedMemory() override { watch_.stop(); }
  std::byte* base() override { return link_->base(); }
  size_t bytes() const override { return link_->bytes(); }
  void sync() override { link_->sync(); }
  void close() override {
    watch_.stop();
    link_->close();
  }

 private:
  std::unique_ptr<comm::UnitEnd> link_;
  Reconnector& watch_;
};

int run_unit_process(const Config& config, int unit) {
  require_outer_mode(config, "unit");
  const OuterPlan plan = OuterPlan::from(config);
  const Topology topology(config, MPI_COMM_WORLD, unit);
  configure_threads(config.run.threads, MPI_COMM_WORLD);
  // GPU ranks pick their device among this job's ranks (one unit job per node's GPUs).
  MPI_Comm learners = MPI_COMM_NULL;
  if (config.run.device == "cuda") mpi::check(MPI_Comm_dup(MPI_COMM_WORLD, &learners), "Comm_dup(learners)");
  UnitSetup unit_setup = set_up_unit(config, plan, topology, learners, "");
  learner::LearnerLink& link = unit_setup.link;  // the isolated deployment: a UCX link to the syncer
  link.restart = restart_count();
  comm::UnitEnd* end = nullptr;  // owned by run_learner as its window memory
  const comm::LinkMode mode = comm::resolve_link_mode(config.wan.security, config.syncer.listen);
  std::unique_ptr<Reconnector> reconnector;
  link.expose = [&](size_t bytes) {
    std::unique_ptr<comm::UnitEnd> memory = comm::expose_to_syncer(mode, bytes);
    protocol::Hello hello;
    hello.unit = unit;
    hello.ranks = topology.unit_size;
    hello.model = config.model;
    hello.config_digest = protocol::config_digest(config);
    hello.restart = link.restart;
    hello.host = host_name();
    hello.pid = ::getpid();
    hello.window_bytes = bytes;
    hello.processes = link.processes;  // for the syncer's log
    join_syncer(*memory, config, hello);
    end = memory.get();
    reconnector = std::make_unique<Reconnector>(*end, config, hello);
    return std::unique_ptr<comm::ExposedMemory>(std::make_unique<WatchedMemory>(std::move(memory), *reconnector));
  };
  // The syncer reads our last snapshots after kDone; it says when it is through. A syncer that
  // is gone, or silent for a minute, releases us too.
  link.reconnected = [&] { return reconnector ? reconnector->reconnected() : std::nullopt; };
  link.syncer_present = [&] { return end == nullptr || end->connected(); };
  link.wait_released = [&](protocol::LearnerWindow& window) {
    mpi::Backoff backoff(20000);
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (window.control(protocol::kReleased) == 0 && end->connected() && Clock::now() < deadline) backoff.idle();
    reconnector->stop();  // before the window (the link's memory) closes
  };
  // Once admitted (a refused process must not replace a live one's pid file): where the
  // launcher's kill faults find this rank.
  link.started = [&] {
    write_pid_file(pid_dir(config.run.dir), unit_pid_name(unit, topology.unit_rank));
  };
  learner::run_learner(config, plan, topology, *unit_setup.trainer, nullptr, nullptr, link);
  return stop_signal();
}

}  // namespace ddiloco::deploy
