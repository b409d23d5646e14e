// A syncer restarted mid-run (docs/deployments.md "The syncer dying"): before it merges, delivers or serves
// anything, it recovers Θ from the units. Every unit that reconnects to it hands back the
// newest copy of each Θ_p it holds (learner_faults.cpp offer_theta; sync_window.hpp,
// kOfferFor). Once enough units have (recovery.hpp says when), the newest version of each
// fragment is taken and the run goes on: same run id, token count and budget. Every syncer
// then settles each offer: the unit trains on, owed the newer fragments, or starts over from Θ
// (a rejoin), as the units that wait for merges do anyway.
#include <cmath>
#include <cstdio>

#include "syncer/syncer.hpp"

#include "ddiloco/error.hpp"
#include "ddiloco/signals.hpp"

namespace ddiloco::syncer {

// Is unit u offering its copies of Θ (an offer not settled yet), or asking to rejoin (a new
// process, a unit that starts over)? Either way it waits on us.
namespace {
bool offering(const protocol::UnitHeaders& h) { return h.control(protocol::kOfferFor) > h.control(protocol::kOfferTaken); }
bool asking(const protocol::UnitHeaders& h) { return h.control(protocol::kRejoinRequest) > h.control(protocol::kRejoinServed); }
}  // namespace

// One poll while recovering: the offers of the units, then, once enough have come (or a stop
// signal), the decision.
void Syncer::recover_once() {
  for (int u = 0; u < M_; ++u) {
    const protocol::UnitHeaders& h = core_.headers(u);
    if (!remote_.connected(u) || core_.unit_done(u) || !h.reachable || restart_.recovery->has_offered(u))
      continue;
    if (!offering(h) && !asking(h)) continue;
    core_.heard(u);  // it waits for us: alive
    if (offering(h) && !read_offer(u)) continue;  // its lane is busy: next poll
    bool copies = false;
    for (int64_t v : unit_offers_[u].versions) copies |= v > 0;
    restart_.recovery->offered(u, now(), copies);
  }
  if (restart_.recovery->complete(now()) || stop_signal() != 0) finish_recovery();
}

// After the recovery, every poll: an offer read is settled. A unit that asks to rejoin as well
// is served Θ (serve_rejoins). One whose copies are all versions of this syncer's history
// trains on, owed the newer fragments. One holding a copy that is not (it came back after the
// recovery, holding a newer merge of the dead syncer's), or whose copy was refused, starts
// over from Θ. Words that could not be written are written at a later poll.
void Syncer::settle_offers() {
  for (int u = 0; u < M_; ++u) {
    const protocol::UnitHeaders& h = core_.headers(u);
    if (!remote_.connected(u) || !h.reachable || !offering(h)) continue;
    const int64_t offer = h.control(protocol::kOfferFor);
    UnitOffer& offered = unit_offers_[u];
    if (offered.settled >= offer) continue;
    // A unit that asks to rejoin too is served Θ over its offer (serve_rejoins, after this):
    // nothing of the offer is needed any more.
    if (!asking(h) && offered.versions.empty() && !read_offer(u)) continue;
    bool start_over = false;
    for (size_t p = 0; p < offered.versions.size() && !asking(h); ++p) {
      const int64_t v = offered.versions[p];
      start_over |= v < 0 || (v > 0 && !core_.in_history(static_cast<int>(p), v, offered.epochs[p]));
    }
    if (start_over && !window_.set_control(u, protocol::kStartOver, offer)) continue;
    if (!start_over && !asking(h)) core_.offer_taken(u, offered.versions);
    if (!window_.set_control(u, protocol::kOfferTaken, offer)) continue;
    log_.write({{"event", "offer_settled"}, {"unit", u}, {"offer", offer}, {"versions", offered.versions},
                {"start_over", start_over || asking(h)}, {"elapsed_s", now()}});
    offered.settled = offer;
    offered.versions.clear();
  }
}

// Unit u's copies of Θ (UnitOffer::versions: the version of each, 0 for none, −1 for one refused),
// each checked (size, checksum, finite values); while recovering, only the newest version of
// each fragment offered so far is kept. False when its lane is busy (a transfer of before):
// read at a later poll.
bool Syncer::read_offer(int u) {
  if (window_.lane(u) != protocol::SyncerWindow::Lane::idle) return false;
  const protocol::UnitHeaders& h = core_.headers(u);
  UnitOffer& offered = unit_offers_[u];
  offered.versions.assign(fragments_.size(), 0);
  offered.epochs.assign(fragments_.size(), 0);
  for (int p = 0; p < fragments_.size(); ++p) {
    const int64_t version = h.header(p, protocol::kInVersion);
    if (version <= 0) continue;
    syncer::Offer offer{u, version, std::vector<float>(layout_.numel(p))};
    std::string problem = window_.fetch_offer(u, p, h, offer.values);
    if (problem.empty())
      for (float v : offer.values)
        if (!std::isfinite(v)) {
          problem = fmt::format("its copy of fragment {} holds non-finite values", p);
          break;
        }
    if (!problem.empty()) {
      log_.write({{"event", "offer_refused"}, {"unit", u}, {"fragment", p}, {"version", version},
                  {"reason", problem}, {"elapsed_s", now()}});
      offered.versions[p] = -1;
      continue;
    }
    offered.versions[p] = version;
    offered.epochs[p] = h.header(p, protocol::kOfferEpoch);
    core_.recovered_numbering(u, p, h.header(p, protocol::kOfferSeqBase));
    // In a lossy wire format the copy is the unit's reference R at that version: what its
    // unread snapshot is against, and what the next delivery to it is encoded against.
    window_.set_reference(u, p, version, offer.values);
    if (restart_.recovery) restart_.keep_newest(p, std::move(offer));
  }
  log_.write({{"event", "offer"}, {"unit", u}, {"versions", offered.versions},
              {"recovering", restart_.recovery != nullptr}, {"elapsed_s", now()}});
  return true;
}

// While recovering, a copy of Θ_p offered is kept if it is at the newest version offered so far
// (and every copy kept of an older one goes).
void Syncer::Restart::keep_newest(int p, syncer::Offer offer) {
  std::vector<syncer::Offer>& kept = copies[p];
  if (!kept.empty() && kept.front().version > offer.version) return;
  if (!kept.empty() && kept.front().version < offer.version) kept.clear();
  kept.push_back(std::move(offer));
}

// The merges the previous syncer had made: the most any live unit was told (kGlobalVersion)
// or the previous syncer logged.
int64_t Syncer::merges_before_restart() const {
  int64_t merges = 0;
  for (int u = 0; u < M_; ++u) merges = std::max(merges, core_.headers(u).control(protocol::kGlobalVersion));
  for (const auto& e : read_events(std::filesystem::path(config_.run.dir) / "metrics.jsonl", "merge"))
    if (e.contains("global_version") && e["global_version"].is_number_integer())
      merges = std::max(merges, e["global_version"].get<int64_t>());
  return merges;
}

// Θ_p ← the newest copy offered where it is newer than what this syncer holds (its checkpoint,
// or Θ₀), then the run goes on; said in a syncer_recovered event.
void Syncer::finish_recovery() {
  const bool exact = layout_.format() == wire::Format::fp32;
  const bool timed_out = restart_.recovery->timed_out(now());
  const int64_t before = merges_before_restart();
  nlohmann::json fragments = nlohmann::json::array();
  std::vector<int> from;
  for (int p = 0; p < fragments_.size(); ++p) {
    const syncer::Recovered r = syncer::choose_copy(restart_.copies[p], exact);
    const bool take = r.version > core_.versions()[p];
    if (take) core_.adopt(p, r.version, r.values);
    for (int u : r.from) from.push_back(u);
    fragments.push_back({{"fragment", p}, {"version", core_.versions()[p]},
                         {"source", take ? "units" : !resumed_.from.empty() ? "checkpoint" : "initial"},
                         {"units", r.from}, {"outvoted", r.outvoted}, {"max_diff", r.max_diff}});
    if (!r.outvoted.empty())
      std::fprintf(stderr, "ddiloco: warning: recovery: fragment %d version %lld: the copies of units %s differ "
                   "from the others' (fp32 copies must be identical): outvoted\n", p,
                   static_cast<long long>(r.version), nlohmann::json(r.outvoted).dump().c_str());
  }
  std::sort(from.begin(), from.end());
  from.erase(std::unique(from.begin(), from.end()), from.end());
  restart_.theta_reinitialised = before > 0 && core_.total_merges() == 0;
  restart_.recovered = {{"event", "syncer_recovered"},  {"fragments", fragments},
                {"from_units", from},           {"offers", restart_.recovery->offers()},
                {"holders", restart_.recovery->holders()},
                {"timed_out", timed_out},       {"recover_s", now()},
                {"merges_before", before},      {"merges_recovered", core_.total_merges()},
                {"checkpoint", resumed_.from.empty() ? nlohmann::json() : nlohmann::json(resumed_.from)},
                // μ > 0: the outer momentum is the checkpoint's (zero without one), not the
                // previous syncer's at the versions recovered.
                {"momentum", resumed_.from.empty() ? "zero" : "checkpoint"},
                {"theta_reinitialised", restart_.theta_reinitialised}, {"tokens", core_.tokens_total()},
                {"elapsed_s", now()}};
  log_.write(restart_.recovered);
  std::printf("syncer: recovered Θ at %lld of the %lld merges made before the restart (%d unit%s offered%s) "
              "in %.1f s; %.2fM tokens kept\n",
              static_cast<long long>(core_.total_merges()), static_cast<long long>(before),
              restart_.recovery->offers(),
              restart_.recovery->offers() == 1 ? "" : "s", timed_out ? ", timed out" : "", now(),
              core_.tokens_total() / 1e6);
  if (restart_.theta_reinitialised)
    std::fprintf(stderr, "ddiloco: warning: no unit and no checkpoint held Θ: it starts again from its "
                 "initialisation mid-run (%lld merges lost)\n", static_cast<long long>(before));
  std::fflush(stdout);
  resumed_.tokens = core_.tokens_total();  // what this syncer's run goes on from
  restart_.recovery.reset();
  restart_.copies.clear();
  // The recovered Θ is evaluated at once: its val_loss says what was kept.
  eval_.next = core_.total_merges();
}

}  // namespace ddiloco::syncer
