// The learner ↔ syncer protocol over one-sided windows (docs/architecture.md, "Learner ↔ syncer
// over one-sided windows"), written once over the transport of remote_memory.hpp: MPI RMA
// in the one-job deployment, UCX between separately launched jobs.
//
// Every unit leader exposes one window (comm::ExposedMemory) holding a control block, one
// header per fragment, and per fragment an OUTBOX (the learner's latest snapshot of θ_p) and
// an INBOX (the syncer's merged Θ_p). The syncer is the only origin (comm::RemoteMemory): it
// reads outboxes and writes inboxes, so a learner never blocks on the network: publishing and
// applying are local loads and stores (std::atomic_ref for the header words, the transport's
// sync() as the memory barrier).
//
// Flow control, so that nothing is ever read while it is being written:
//   outbox p: the learner writes a snapshot (data, then the header, then seq = previous + 1)
//             only when out_ack == out_seq, i.e. the syncer has consumed the previous one;
//             the syncer reads data only for seq > out_ack, re-reads seq afterwards (it must be
//             unchanged), verifies the checksum, then sets out_ack = seq.
//   inbox p:  the syncer writes (data, then in_checksum, then in_version) only when
//             in_ack == the version it delivered last, i.e. the learner has taken it; the
//             learner copies the data for in_version > in_ack, then sets in_ack = in_version.
//             A unit that crashed sets in_ack = −1, which matches no delivery, so nothing is
//             delivered until its rejoin is served: then the syncer writes Θ into every inbox
//             regardless of in_ack (the unit is waiting for kRejoinServed and reads no inbox
//             meanwhile), and the unit's takes restore the normal rule.
// Words are int64, 8-byte aligned, each written by exactly one side with a single store (the
// learner) or the transport's atomic put_word (the syncer). One hand-over: a unit whose syncer
// was restarted holds its inboxes (in_ack = −1, so nothing is delivered) and writes an OFFER
// into them itself, its copies of Θ with the inbox words (kInVersion, kInChecksum, kInRaw,
// kInBytes) and kOfferSeqBase/kOfferEpoch, until the syncer has read it (kOfferTaken) or
// serves the unit's rejoin over it; only then are the inbox words the syncer's again.
//
// A unit the transport reports absent (not connected, or lost) is skipped by the syncer's
// side: its headers keep their last polled values with `reachable` false, a fetch from it is
// refused, and what is written to it is dropped (remote_memory.hpp).
//
// Wire format (wire_format.hpp): what a fragment's outbox and inbox carry. With fp32 they hold
// the values themselves. In every other format (bf16, int8, int4, int2, sparse) they hold a
// DIFFERENCE against a reference both sides hold, so that only small numbers are rounded:
//   inbox  (syncer → learner): Θ_p − R, where R is the learner's reconstruction of the last
//          version it took; the learner sets R ← R + decode(...) and uses R as Θ_p. The
//          syncer computes the same R (same code, same fp32 operations), so the rounding error
//          of one delivery is part of the next difference and never accumulates. With sparse,
//          what a delivery drops stays in Θ_p − R: R lags Θ_p, and later deliveries carry it.
//   outbox (learner → syncer): θ_p − R + E at the version it names (kOutRef); the syncer
//          keeps its copy of R for every version the learner may still name and reconstructs
//          θ_p. E is error feedback: what the previous snapshot's rounding lost (its difference
//          minus what the syncer decodes), so that the outer gradients the syncer sums over
//          rounds lose nothing to rounding but the last one's (Seide et al. 2014, "1-bit SGD";
//          Karimireddy et al. 2019, "Error Feedback Fixes SignSGD", arXiv 1901.09847). With
//          wan.ef_decay β < 1 a snapshot carries θ_p − R + β·E, so that old losses fade: the
//          error-feedback accumulator of SparseLoCo (Sarfi et al. 2025, arXiv 2508.15706),
//          which stands in for outer momentum there; β = 1 is the plain error feedback above.
// Raw fp32 values travel where no reference is shared: the Θ served at a rejoin, and a
// snapshot with non-finite values (the syncer refuses it). Both sides start from R = Θ₀ (the
// common initialisation) or, on resume, from the checkpoint's Θ.
#pragma once

#include <chrono>
#include <bit>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include <map>
#include <optional>
#include <string>

#include "ddiloco/checksum.hpp"
#include "ddiloco/fragments.hpp"
#include "ddiloco/remote_memory.hpp"
#include "ddiloco/wire_format.hpp"

namespace ddiloco::protocol {

/// int64 words of a unit's control block.
enum Control : int {
  kHeartbeat = 0,   ///< learner: moves every inner step and while waiting; still when down
  kStepsDone,       ///< learner: inner steps completed
  kTokensDone,      ///< learner: tokens processed by the whole unit
  kState,           ///< learner: its UnitPhase
  kStop,            ///< syncer: 1 = stop at the next step boundary
  kStepTimeNs,      ///< learner: moving average of its inner-step time, nanoseconds
  kPublishSkipped,  ///< learner: snapshots not published because the outbox was still unread
  kGlobalVersion,   ///< syncer: merges made so far, over all fragments
  kJobTokens,       ///< syncer: tokens processed by all units (decoupled; as last polled)
  kRejoinRequest,   ///< learner: rejoins requested after crashes (+1 each)
  kRejoinServed,    ///< syncer: the rejoin request whose Θ now fills every inbox
  kReadsStarted,    ///< syncer: reads of this unit's snapshots begun (debug.crash_during_read)
  kCheckpointNext,  ///< syncer: id of the next checkpoint (where a unit that stops writes)
  kCheckpointWant,  ///< syncer: write checkpoint kCheckpointNext at the next step boundary
                    ///< (diloco: at the next round boundary)
  kCheckpointDone,  ///< learner: id of the last checkpoint whose unit file it wrote
  kCheckpointFailed,  ///< learner: id of a checkpoint whose unit file it could not write
  kStopAfterVersion,  ///< syncer (diloco): stop once the merge of this round is applied
  kSignal,          ///< learner: the stop signal its leader received (0 = none)
  kReleased,        ///< syncer (isolated): 1 = done reading, the unit may close its window
  kReadSeen,        ///< learner: the last kReadsStarted it answered (debug.crash_during_read:
                    ///< a due crash lands before the answer, so the read finds it)
  kTimeBook,        ///< learner (isolated): its unit's TimeBook, TimeBook::kFields doubles
                    ///< (bit patterns) from here on: at every step as it would stand if the
                    ///< process died then, and the final one before kState = kDone
  /// syncer (isolated): tokens and inner steps of this unit's earlier processes, as the syncer
  /// counts them; written when a process connects, so that a restarted syncer reads its books
  /// back from the live units (docs/deployments.md "The syncer dying").
  kTokensBefore = kTimeBook + 6,
  kStepsBefore,
  /// learner: offers made (+1 each time a restarted syncer admits it). An OFFER fills the
  /// held inboxes with this unit's newest copy of every Θ_p it holds, raw fp32, at the version
  /// in kInVersion (0: none), for a restarted syncer to recover Θ from (LearnerWindow::offer).
  kOfferFor,
  kOfferTaken,  ///< syncer: the last offer read and settled: the unit's inboxes are its own again
  /// syncer: an offer after which the unit starts over from Θ (a rejoin): a copy of it was
  /// refused, or is not in this syncer's history (newer than what it recovered without it)
  kStartOver,
  /// syncer: this syncer process's epoch (random, ≠ 0), written when the unit connects: the
  /// unit records with each merged fragment it takes which syncer sent it (kOfferEpoch)
  kSyncerEpoch,
  /// learner (decoupled, τ = 0): 1 + the fragment whose merge it waits for before its next
  /// step; 0 while it trains. A unit waiting for another fragment cannot send this one: the
  /// syncer leaves it out of this one's quorum (SyncerCore::quorum_needed), or two units whose
  /// rounds drifted apart would each wait for a merge that needs the other.
  kWaitingFor,
  /// learner: its mean training loss over its last log interval (run.log_every steps), the
  /// bit pattern of a double; 0 until the first (the syncer's status page shows it, untrusted)
  kTrainLoss,
  kControlWords = 40
};
static_assert(kTrainLoss < kControlWords, "the control block is full");

/// A unit's lifecycle phase, in its kState control word (not checkpoint::UnitState, a unit's
/// checkpoint contents).
enum UnitPhase : int64_t { kStarting = 0, kRunning = 1, kDone = 2 };

/// int64 words of one fragment's header.
enum Header : int {
  kOutSeq = 0,       ///< learner: sequence number of the snapshot in the outbox (0 = none)
  kOutSteps,         ///< learner: c_steps of that snapshot
  kOutTokens,        ///< learner: c_tok of that snapshot
  kOutStep,          ///< learner: the unit's inner step when it was taken
  kOutBaseVersion,   ///< learner: version of Θ_p it last applied
  kOutChecksum,      ///< learner: checksum(data)
  kOutAck,           ///< syncer: last seq consumed
  kInVersion,        ///< syncer: version of the merged Θ_p in the inbox (0 = none yet)
  kInChecksum,       ///< syncer: checksum(data)
  kInAck,            ///< learner: last version taken
  kOutRef,           ///< learner: version of the reference the snapshot is against (−1: raw)
  kOutBytes,         ///< learner: bytes of the snapshot in the outbox
  kInRaw,            ///< syncer: 1 = the inbox holds raw fp32 values, 0 = a difference
  kInBytes,          ///< syncer: bytes of what the inbox holds
  kOfferSeqBase,     ///< learner, in an offer: the base of its snapshot numbering (seq_base)
  kOfferEpoch,       ///< learner, in an offer: kSyncerEpoch of the syncer that sent the copy
  kHeaderWords = 16
};

using ddiloco::checksum;

/// Byte offsets of everything in a leader's window, the same on both sides, the wire codecs,
/// and the learner's error-feedback decay β ∈ [0, 1] (wan.ef_decay). Snapshots go up in
/// `codec`; deliveries come down in the same codec, except that a sparse one keeps `down_topk`
/// values per chunk when it is > 0 (wan.down_topk: a merge of M k-sparse outer gradients has up
/// to M·k nonzeros per chunk). Outboxes and inboxes hold raw fp32 values or the encoding,
/// whichever is larger; what crosses is what is written, kOutBytes / kInBytes. Throws Error for
/// a codec its format cannot use (wire::check) or β outside [0, 1].
class WindowLayout {
 public:
  explicit WindowLayout(const protocol::FragmentPlan& plan, const wire::Codec& codec = {}, double ef_decay = 1.0,
                        size_t down_topk = 0);
  const wire::Codec& codec() const { return codec_; }            ///< snapshots (up)
  const wire::Codec& down_codec() const { return down_codec_; }  ///< deliveries (down)
  wire::Format format() const { return codec_.format; }
  float ef_decay() const { return ef_decay_; }
  /// Bytes a snapshot's difference of fragment p takes on the wire.
  size_t wire_bytes(int p) const { return wire::encoded_bytes(codec_, numel_[p]); }
  /// Bytes a delivery's difference of fragment p takes on the wire.
  size_t down_bytes(int p) const { return wire::encoded_bytes(down_codec_, numel_[p]); }
  /// Bytes fragment p's outbox and inbox each hold: max(numel·4, wire_bytes(p), down_bytes(p)).
  size_t capacity(int p) const { return capacity_[p]; }
  size_t bytes() const { return bytes_; }
  size_t header_block_bytes() const { return header_block_; }  ///< control + all headers
  size_t header_offset(int p) const;
  size_t outbox_offset(int p) const { return outbox_[p]; }
  size_t inbox_offset(int p) const { return inbox_[p]; }
  size_t numel(int p) const { return numel_[p]; }
  int fragments() const { return static_cast<int>(numel_.size()); }

 private:
  std::vector<size_t> outbox_, inbox_, numel_, capacity_;
  size_t header_block_ = 0, bytes_ = 0;
  wire::Codec codec_, down_codec_;
  float ef_decay_;
};

/// Snapshot metadata a learner publishes with its fragment.
struct SnapshotMeta {
  int64_t c_steps = 0, c_tok = 0, step = 0, base_version = 0;
};

/// A unit leader's side, over `memory` (at least layout.bytes(), zeroed; it must outlive the
/// window). Throws Error when the memory is too small.
class LearnerWindow {
 public:
  LearnerWindow(comm::ExposedMemory& memory, const WindowLayout& layout);
  LearnerWindow(const LearnerWindow&) = delete;
  LearnerWindow& operator=(const LearnerWindow&) = delete;
  /// Ends the exposure (MPI: collective, after every exchange is over).
  void close() { memory_->close(); }

  int64_t control(Control word) const;
  void set_control(Control word, int64_t value);
  /// Stores a double's bit pattern in control word `word` (kTimeBook + i).
  void set_control_f64(int word, double value);

  /// May fragment p's outbox be written (the syncer consumed the previous snapshot)?
  bool outbox_free(int p) const;
  /// Writes a snapshot of fragment p (packed, numel(p) floats) in the wire format and publishes
  /// it: θ_p − R + β·E, E ← that minus what the syncer decodes (β = layout.ef_decay()), or raw
  /// fp32 values without a reference. Requires outbox_free(p). Returns the snapshot's sequence
  /// number.
  int64_t publish(int p, std::span<const float> packed, const SnapshotMeta& meta);
  /// Sets the reference R of fragment p (wire format; the syncer must set the same).
  void set_reference(int p, int64_t version, std::span<const float> values);
  /// R of fragment p and its version (−1 and empty: none, or fp32).
  int64_t reference_version(int p) const;
  std::span<const float> reference(int p) const;
  /// The error-feedback residual E of fragment p (empty: none yet), and setting it (resume).
  std::span<const float> residual(int p) const;
  void set_residual(int p, std::span<const float> values);

  /// Version of the merged Θ_p in the inbox (0: none yet).
  int64_t inbox_version(int p) const;
  /// Decodes the inbox of fragment p into `out` (Θ_p as this unit holds it) and marks it taken.
  /// Returns false when the data does not match its checksum (the inbox is then left
  /// unacknowledged and the reference unchanged).
  bool take_inbox(int p, std::span<float> out);

  /// Crash emulation: the unit's memory is gone, so its outboxes now hold garbage (NaN) —
  /// what the syncer would read from a host that lost its state mid-transfer. Sequence
  /// numbers are left as they are; the checksum check refuses what the syncer reads. Every
  /// inbox acknowledgement becomes −1 (nothing taken), so that the syncer delivers nothing
  /// more until the unit has taken the Θ served at its rejoin.
  void lose_outboxes();
  /// A resumed unit holds Θ_p at `version` from its checkpoint: marks that version taken, so
  /// that the syncer's flow control delivers the next one.
  void set_inbox_taken(int p, int64_t version);
  /// The inbox half of lose_outboxes(): a unit that starts over from Θ with its memory intact
  /// (its parameters went non-finite) leaves its outboxes, published before that, for the
  /// syncer to read and merge.
  void hold_inboxes();
  /// A unit whose syncer was restarted hands back what that syncer sent it: `values`
  /// (numel(p) fp32, Θ_p as this unit holds it) raw into inbox p, with its `version` (> 0) and
  /// the unit's snapshot-number base, for the restarted syncer to read (SyncerWindow::
  /// fetch_offer) before it serves the unit's rejoin. Requires held inboxes (hold_inboxes:
  /// no delivery can land meanwhile). Throws Error for a wrong size.
  void offer(int p, int64_t version, std::span<const float> values, int64_t seq_base, int64_t epoch);

 private:
  int64_t& word(size_t byte_offset) const;
  void sync() const { memory_->sync(); }
  comm::ExposedMemory* memory_;
  std::byte* base_ = nullptr;
  const WindowLayout* layout_;
  std::vector<std::vector<float>> ref_;  // per fragment: R (lossy wire formats)
  std::vector<int64_t> ref_version_;
  std::vector<std::vector<float>> residual_;  // per fragment: E (lossy wire formats)
  std::vector<float> scratch_;
};

/// What the syncer sees of one unit after a poll: its control block and fragment headers.
struct UnitHeaders {
  std::vector<int64_t> words;  ///< header_block_bytes / 8 words
  bool reachable = false;      ///< the last poll read them (false: the unit is absent)
  int64_t control(Control w) const { return words[w]; }
  /// A double the learner stored with set_control_f64 (its bit pattern).
  double control_f64(int w) const { return std::bit_cast<double>(words[w]); }
  int64_t header(int p, Header h) const {
    return words[kControlWords + static_cast<size_t>(p) * kHeaderWords + h];
  }
};

/// The syncer's side: origin of every operation, over `remote` (one unit per remote unit;
/// it must outlive the window).
class SyncerWindow {
 public:
  /// Seconds on a monotonic clock: it times each lane's patience (lane_on_time) and the poll
  /// budget. Empty: a steady clock. Tests pass the manual clock their SyncerCore runs on.
  using Clock = std::function<double()>;
  SyncerWindow(comm::RemoteMemory& remote, const WindowLayout& layout, Clock clock = {});
  SyncerWindow(const SyncerWindow&) = delete;
  SyncerWindow& operator=(const SyncerWindow&) = delete;
  void close() { remote_->close(); }
  comm::RemoteMemory& remote() { return *remote_; }
  const comm::RemoteMemory& remote() const { return *remote_; }
  const WindowLayout& layout() const { return *layout_; }

  /// Forgets what was known of unit u's window (its references fall back to `version` of Θ,
  /// which the caller delivers raw): a new process of the unit has a new, zeroed window.
  void reset_unit(int u);

  /// Reads every connected unit's control block and headers (one read per unit, completed
  /// together); an absent unit's keep their last values, with `reachable` false. Under a poll
  /// budget (set_poll_budget) a unit read less than its share of the budget ago keeps its
  /// last values and reachability, unless `all` (a unit that just connected must be read).
  void poll(std::vector<UnitHeaders>& out, bool all = false);
  /// The most a poll may take of each unit's link, bytes per second (0: no limit): polls of a
  /// unit are spaced by at least header_block_bytes() / budget seconds. Over a slow real link,
  /// where every read is a round trip with its transport's headers, unlimited polls would take
  /// the link from the snapshots (docs/deployments.md "Several hosts").
  void set_poll_budget(double bytes_per_s) { poll_budget_ = bytes_per_s; }
  /// What fetch() found.
  struct Fetched {
    int64_t seq_after = 0;  ///< the sequence number after the read (≠ the polled one: torn)
    size_t wire_bytes = 0;  ///< bytes read
    std::string problem;    ///< why the snapshot is refused ("" = none; torn is the caller's)
    bool unreachable = false;  ///< the read failed: the unit is lost or its link stalled
    int64_t ref = -1;          ///< the reference version it was decoded against (−1: raw fp32)
    bool garbled = false;      ///< refused for its checksum: what a crash leaves in an outbox
  };
  /// Reads unit u's snapshot of fragment p as announced by the polled `headers` (kOutBytes,
  /// kOutRef, kOutChecksum), re-reads its sequence number, checks the checksum and decodes it
  /// into `dst` (θ_p, numel(p) floats). A snapshot against a reference no longer held, of the
  /// wrong size, or failing its checksum is refused with a problem. Blocking: start_fetch, then
  /// end_fetch until it is over (unit u's lane must be idle, else Error).
  Fetched fetch(int u, int p, const UnitHeaders& headers, std::span<float> dst);
  /// Unit u's reference R of fragment p at `version` (numel(p) floats: what the unit took as
  /// Θ_p then, as it decoded it), or an empty span when it is not held (fp32, or pruned).
  std::span<const float> reference(int u, int p, int64_t version) const;
  /// How many references of unit u's fragment p are held: at most kMaxReferences.
  size_t references_held(int u, int p) const { return refs_.at(u).at(p).size(); }
  /// The most references held per unit and fragment. A unit names its last taken version, or
  /// an older one in a snapshot not read yet (a few deliveries back at most); one that keeps
  /// naming an old version (a unit that lies) would otherwise keep one fragment copy per
  /// delivery. Beyond this the oldest go, and a snapshot naming one is refused ("not held").
  static constexpr size_t kMaxReferences = 16;
  /// Marks snapshot `seq` of (u, p) consumed, freeing the outbox.
  void ack(int u, int p, int64_t seq);
  /// Writes merged Θ_p with `version` into unit u's inbox (the caller checked in_ack): in the
  /// wire format against the unit's reference, or as raw fp32 values when `raw` (a rejoin) or
  /// when no reference is shared. Returns the bytes written.
  /// Returns 0 when the unit could not be reached (lost, or its link stalled): nothing was
  /// announced, our reference of the unit is unchanged, and the caller delivers again later.
  /// Blocking: start_deliver, then end_deliver until it is over (the lane must be idle).
  size_t deliver(int u, int p, int64_t version, std::span<const float> data, bool raw = false);

  // Lanes: the syncer's bulk transfers with a unit (a snapshot read, a delivery) run without
  // the syncer waiting for them, one at a time per unit and side by side across units, as the
  // units' own links carry them (RemoteMemory::start_get / start_put). While unit u's lane is
  // busy, poll() leaves u's headers as they were, and the control words the syncer writes to
  // it (acks, stop, progress, checkpoint words) wait and are written, latest value per word, as
  // soon as the lane is idle: issued now they would queue behind the transfer on the unit's
  // connection. The short words that end a transfer (a read's sequence re-read, a delivery's
  // announcement) are issued when its bulk bytes are complete.
  enum class Lane { idle, fetch, deliver };
  Lane lane(int u) const { return lanes_[u].kind; }
  /// The fragment unit u's lane carries (−1 when idle).
  int lane_fragment(int u) const { return lanes_[u].fragment; }
  /// Starts reading unit u's snapshot of fragment p as `headers` announce it (see fetch). False
  /// when the lane is busy or the unit cannot be read now (absent, lost, its link stalled).
  bool start_fetch(int u, int p, const UnitHeaders& headers);
  /// The read of unit u's lane once its bytes are in (nullopt while they are on their way):
  /// re-reads the sequence number, checks and decodes into `dst` (numel(lane_fragment(u))
  /// floats) as fetch() does; the lane is idle afterwards. Error when the lane holds no read.
  std::optional<Fetched> end_fetch(int u, std::span<float> dst);
  /// Starts writing Θ_p as deliver() does; false when the lane is busy or the unit cannot be
  /// reached now (nothing announced, references unchanged).
  bool start_deliver(int u, int p, int64_t version, std::span<const float> data, bool raw = false);
  /// The delivery of unit u's lane once its bytes are at the unit (nullopt while on their way):
  /// announces it (raw flag, size, checksum, then the version) and returns the bytes written,
  /// or 0 when the unit could not be reached (as deliver()). The lane is idle afterwards.
  /// Error when the lane holds no delivery.
  std::optional<size_t> end_deliver(int u);
  /// Drops what unit u's lane carries and the words waiting for it (the unit is lost, or a
  /// new process of it connected).
  void abandon(int u);
  /// Is unit u's lane busy with a transfer younger than its patience, 0.25 s + its bytes at the
  /// slowest link rate allowed for (set_link_min_rate)?
  bool lane_on_time(int u) const;
  /// Transfers started on unit u's lane so far (tells one slow transfer from the next).
  uint64_t lane_serial(int u) const { return lanes_[u].serial; }
  /// The next poll reads unit u whatever the poll budget (its headers are known stale: a torn
  /// read).
  void request_poll(int u) { poll_now_[u] = true; }
  /// Has a poll of unit u been requested and not made yet?
  bool poll_pending(int u) const { return poll_now_[u]; }
  /// Writes the control words waiting for unit u (its lane idle): true when none is left.
  bool flush_words(int u);
  /// Seconds since unit u's lane transfer started, and its bytes (0 and 0 when idle).
  double lane_age_s(int u) const;
  size_t lane_bytes(int u) const { return lanes_[u].kind == Lane::idle ? 0 : lanes_[u].bytes.size(); }
  /// The slowest link rate the lanes' patience allows for, bytes per second (default 1e7, as
  /// UcxSyncerLink's). Error when not positive.
  void set_link_min_rate(double bytes_per_s);
  /// Bytes the next deliver(u, p) will write.
  size_t delivery_bytes(int u, int p) const;
  /// Sets unit u's reference R of fragment p (as the learner does).
  void set_reference(int u, int p, int64_t version, std::span<const float> values);
  /// Tells unit u to stop at its next step boundary.
  void request_stop(int u);
  /// Tells unit u how many merges the syncer has made.
  void set_global_version(int u, int64_t version);
  /// Tells unit u how many tokens all units have processed (the job's progress).
  void set_job_tokens(int u, int64_t tokens);
  /// Writes one syncer-owned control word of unit u (kRejoinServed, ...); false when the unit
  /// could not be reached.
  bool set_control(int u, Control word, int64_t value);
  /// Reads one control word of unit u now (not as of the last poll); false when it is absent.
  bool fetch_control(int u, Control word, int64_t& value);
  /// Reads unit u's offer of fragment p (LearnerWindow::offer) as the polled `headers` announce
  /// it into `dst` (numel(p) floats), checking its size and checksum. Blocking; unit u's lane
  /// must be idle. Returns "" when the copy is intact, else why it is refused (the unit could
  /// not be read, a size or checksum that does not match).
  std::string fetch_offer(int u, int p, const UnitHeaders& headers, std::span<float> dst);

  uint64_t bytes_read() const { return bytes_read_; }
  uint64_t bytes_written() const { return bytes_written_; }

 private:
  bool put_word(int u, size_t byte_offset, int64_t value);   // waits for a busy lane
  bool write_word(int u, size_t byte_offset, int64_t value);  // now
  static Fetched unreadable();
  void prune_references(const std::vector<UnitHeaders>& headers);
  struct LaneState {
    Lane kind = Lane::idle;
    int fragment = -1;
    comm::RemoteMemory::Ticket ticket = 0;
    std::vector<std::byte> bytes;  // a read's destination, a delivery's encoding
    // A read: what the headers announced. A delivery: its version, and the unit's reference
    // once it takes it.
    int64_t ref = -1, announced = 0, version = 0;
    uint64_t sum = 0;
    bool raw = false;
    std::vector<float> next;
    double started = 0;   // clock seconds
    uint64_t serial = 0;  // transfers started on this lane so far
    void busy(Lane k, int p, double now) {  // a transfer of fragment p started now
      kind = k;
      fragment = p;
      started = now;
      ++serial;
    }
    void end() {  // its transfer is over (its bytes and announcement stay for the caller)
      kind = Lane::idle;
      fragment = -1;
      ticket = 0;
    }
  };
  // Per unit: control words waiting to be written (the lane was busy, or the write failed), in
  // the order issued, the latest value per word; kept until written or the unit is lost.
  std::vector<std::vector<std::pair<size_t, int64_t>>> waiting_words_;
  std::vector<bool> poll_now_;
  double link_min_rate_ = 1e7;
  std::vector<LaneState> lanes_;
  comm::RemoteMemory* remote_;
  const WindowLayout* layout_;
  int units_;
  uint64_t bytes_read_ = 0, bytes_written_ = 0;
  double poll_budget_ = 0;
  std::vector<double> next_poll_;  // clock seconds
  Clock clock_;
  // [unit][fragment]: the unit's reference R at every version it may still name (lossy
  // formats): from the older of its last taken version and the one its unread snapshot names.
  std::vector<std::vector<std::map<int64_t, std::vector<float>>>> refs_;
  std::vector<float> delta_;
};

}  // namespace ddiloco::protocol
