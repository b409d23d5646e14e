// A unit that lies, for e2e/lying_unit.sh (issue 34, docs/security.md): it holds the run's
// secret, is admitted like any unit (the same hello, the same link mode) and joins from Θ, then
// speaks the window protocol (sync_window.hpp) wrongly in one way:
//
//   size       a snapshot whose announced byte count is not the layout's
//   backwards  two plausible snapshots of weight 0, then a sequence number below the last consumed
//   future     a base version ahead of every version the syncer made
//   reference  a difference against a reference version the syncer never sent
//   counters   token counters its batch cannot make (c_tok = 2^62 in 1 step)
//   checksum   a checksum of other data
//   values     finite values far outside any step: Θ + 1e30, then 3e38
//
// It trains nothing: it beats, says it runs, takes every merge it is sent, and publishes a
// snapshot of each fragment every --period-ms (its own Θ with the lie) once --after merges exist,
// so that the honest units' first merges are their own. It stops when the syncer says so (or
// after --max-s), says it is done, and waits to be released.
//   lying_unit --config F --unit U --lie CASE [--after N] [--period-ms MS] [--max-s S]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ddiloco/checksum.hpp"
#include "ddiloco/config.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/fragments.hpp"
#include "ddiloco/layers.hpp"
#include "ddiloco/link.hpp"
#include "ddiloco/membership.hpp"
#include "ddiloco/outer_plan.hpp"
#include "ddiloco/sync_window.hpp"
#include "ddiloco/wan.hpp"

using namespace ddiloco;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string config, lie;
  int unit = -1, after = 4, period_ms = 100;
  double max_s = 300;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--config") a.config = v;
    else if (k == "--unit") a.unit = std::stoi(v);
    else if (k == "--lie") a.lie = v;
    else if (k == "--after") a.after = std::stoi(v);
    else if (k == "--period-ms") a.period_ms = std::stoi(v);
    else if (k == "--max-s") a.max_s = std::stod(v);
    else fail("lying_unit: unknown option {}", k);
  }
  static const std::vector<std::string> lies = {"size", "backwards", "future", "reference", "counters", "checksum", "values"};
  if (a.config.empty() || a.unit < 0 || std::find(lies.begin(), lies.end(), a.lie) == lies.end())
    fail("usage: lying_unit --config F --unit U --lie size|backwards|future|reference|counters|checksum|values");
  return a;
}

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// The unit's window, written by hand where the lie needs it (LearnerWindow writes only truth).
class Liar {
 public:
  Liar(const Config& config, const Args& args, comm::UnitEnd& end, const protocol::WindowLayout& layout)
      : config_(config), args_(args), end_(end), layout_(layout), window_(end, layout),
        theta_(layout.fragments()), taken_(layout.fragments(), 0), seq_(layout.fragments(), 0),
        published_(layout.fragments(), 0) {
    for (int p = 0; p < layout.fragments(); ++p) theta_[p].resize(layout.numel(p));
  }

  // As a new process does (LearnerCore::go_down, joining): inboxes held, a rejoin asked, Θ taken.
  void join() {
    window_.hold_inboxes();
    window_.set_control(protocol::kRejoinRequest, 1);
    while (window_.control(protocol::kRejoinServed) < 1) beat_and_wait();
    take_merges();
    window_.set_control(protocol::kState, protocol::kRunning);
  }

  void run() {
    const auto deadline = Clock::now() + std::chrono::duration<double>(args_.max_s);
    while (window_.control(protocol::kStop) == 0 && Clock::now() < deadline && end_.connected()) {
      beat_and_wait();
      take_merges();
      if (window_.control(protocol::kGlobalVersion) < args_.after) continue;
      for (int p = 0; p < layout_.fragments(); ++p)
        if (hdr(p, protocol::kOutAck) == seq_[p]) lie(p);
    }
    window_.set_control(protocol::kState, protocol::kDone);
    const auto released_by = Clock::now() + std::chrono::seconds(30);
    while (window_.control(protocol::kReleased) == 0 && end_.connected() && Clock::now() < released_by) sleep_ms(50);
    std::printf("lying unit %d (%s): published %d lies, stopped\n", args_.unit, args_.lie.c_str(), lies_);
  }

 private:
  int64_t& hdr(int p, protocol::Header h) {
    return reinterpret_cast<int64_t*>(end_.base() + layout_.header_offset(p))[h];
  }

  void beat_and_wait() {
    ++steps_;
    window_.set_control(protocol::kHeartbeat, steps_);
    window_.set_control(protocol::kStepsDone, steps_);
    window_.set_control(protocol::kStepTimeNs, int64_t{args_.period_ms} * 1000000);
    sleep_ms(args_.period_ms);
  }

  void take_merges() {
    for (int p = 0; p < layout_.fragments(); ++p)
      if (window_.inbox_version(p) > taken_[p] && window_.take_inbox(p, theta_[p])) taken_[p] = window_.inbox_version(p);
  }

  // Writes a snapshot the way LearnerWindow::publish does (data and headers, then the sequence
  // number), with whatever the lie says in them.
  void put(int p, std::span<const std::byte> data, int64_t announced, uint64_t sum, int64_t ref,
           const protocol::SnapshotMeta& meta, int64_t seq) {
    std::memcpy(end_.base() + layout_.outbox_offset(p), data.data(), std::min(data.size(), layout_.capacity(p)));
    hdr(p, protocol::kOutSteps) = meta.c_steps;
    hdr(p, protocol::kOutTokens) = meta.c_tok;
    hdr(p, protocol::kOutStep) = meta.step;
    hdr(p, protocol::kOutBaseVersion) = meta.base_version;
    hdr(p, protocol::kOutRef) = ref;
    hdr(p, protocol::kOutBytes) = announced;
    hdr(p, protocol::kOutChecksum) = static_cast<int64_t>(sum);
    end_.sync();
    hdr(p, protocol::kOutSeq) = seq;
    end_.sync();
  }

  void lie(int p) {
    const int64_t tps = config_.unit_tokens_per_step(args_.unit);
    protocol::SnapshotMeta meta{4, 4 * tps, steps_, taken_[p]};
    std::vector<float> x = theta_[p];
    const auto raw = [&] { return std::as_bytes(std::span<const float>(x)); };
    const int64_t n = static_cast<int64_t>(x.size() * sizeof(float));
    const int64_t next = seq_[p] + 1;
    const std::string& l = args_.lie;
    if (l == "size") {
      put(p, raw(), n - 4, checksum(raw().first(n - 4)), -1, meta, next);
    } else if (l == "backwards") {
      // Two plausible snapshots that carry nothing (0 steps, 0 tokens: weight 0, so that only
      // the lie is tested, not a stale copy of Θ), then a number that goes back; that one is
      // never consumed, and nothing more is published.
      if (published_[p] >= 3) return;
      const bool back = published_[p]++ == 2;
      meta.c_steps = meta.c_tok = 0;
      put(p, raw(), n, checksum(raw()), -1, meta, back ? seq_[p] - 1 : next);
      if (!back) seq_[p] = next;
      lies_ += back;
      return;
    } else if (l == "future") {
      meta.base_version = taken_[p] + 1000;
      put(p, raw(), n, checksum(raw()), -1, meta, next);
    } else if (l == "reference") {
      const std::vector<std::byte> diff(layout_.wire_bytes(p));
      put(p, diff, static_cast<int64_t>(diff.size()), checksum(std::span<const std::byte>(diff)), 999999, meta, next);
    } else if (l == "counters") {
      meta.c_steps = 1;
      meta.c_tok = int64_t{1} << 62;
      put(p, raw(), n, checksum(raw()), -1, meta, next);
    } else if (l == "checksum") {
      put(p, raw(), n, checksum(raw()) ^ 1, -1, meta, next);
    } else if (l == "values") {
      const float far = lies_ % 2 == 0 ? 1e30f : 3e38f;
      for (float& v : x) v = v >= 0 ? far : -far;
      put(p, raw(), n, checksum(raw()), -1, meta, next);
    }
    seq_[p] = next;
    ++lies_;
  }

  const Config& config_;
  const Args& args_;
  comm::UnitEnd& end_;
  const protocol::WindowLayout& layout_;
  protocol::LearnerWindow window_;
  std::vector<std::vector<float>> theta_;
  std::vector<int64_t> taken_, seq_;
  std::vector<int> published_;
  int64_t steps_ = 0;
  int lies_ = 0;
};

void connect(comm::UnitEnd& end, const Config& config, int unit, size_t bytes) {
  protocol::Hello hello;
  hello.unit = unit;
  hello.ranks = 1;
  hello.model = config.model;
  hello.config_digest = protocol::config_digest(config);
  hello.pid = ::getpid();
  hello.host = "lying-unit";
  hello.window_bytes = bytes;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  for (;;) {
    if (auto r = protocol::Rendezvous::read(config.run.dir)) {
      hello.run_id = r->run_id;
      hello.proof = protocol::hello_proof(r->secret);
      end.connect(r->address, r->secret, hello.to_json().dump(), 30);
      return;
    }
    if (Clock::now() > deadline) fail("lying_unit: no syncer.addr in {} within 60 s", config.run.dir);
    sleep_ms(200);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse(argc, argv);
    const Config config = load_config(args.config);
    const OuterPlan plan = OuterPlan::from(config);
    const ParameterLayout parameters = ParameterLayout::gpt2(config.model);
    const protocol::FragmentPlan fragments(parameters, plan.fragments, plan.h, plan.warmup);
    const protocol::WindowLayout layout(fragments, wan::wire_codec(config), config.wan.ef_decay,
                                        static_cast<size_t>(config.wan.down_topk));
    const comm::LinkMode mode = comm::resolve_link_mode(config.wan.security, config.syncer.listen);
    std::unique_ptr<comm::UnitEnd> end = comm::expose_to_syncer(mode, layout.bytes());
    connect(*end, config, args.unit, layout.bytes());
    std::printf("lying unit %d (%s): admitted\n", args.unit, args.lie.c_str());
    std::fflush(stdout);
    Liar liar(config, args, *end, layout);
    liar.join();
    liar.run();
    end->close();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lying_unit: %s\n", e.what());
    return 1;
  }
}
