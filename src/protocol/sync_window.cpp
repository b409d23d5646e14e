#include "ddiloco/sync_window.hpp"

#include <atomic>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <cmath>
#include <limits>
#include <thread>

#include "ddiloco/error.hpp"

namespace ddiloco::protocol {

namespace {
constexpr size_t kAlign = 64;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

WindowLayout::WindowLayout(const protocol::FragmentPlan& plan, const wire::Codec& codec, double ef_decay, size_t down_topk)
    : codec_(codec), down_codec_(codec), ef_decay_(static_cast<float>(ef_decay)) {
  if (down_topk > 0) down_codec_.topk = down_topk;
  wire::check(codec);
  wire::check(down_codec_);
  if (!(ef_decay >= 0 && ef_decay <= 1))
    fail("window layout: error-feedback decay must be in [0, 1], got {}", ef_decay);
  const int P = plan.size();
  header_block_ = (kControlWords + static_cast<size_t>(P) * kHeaderWords) * sizeof(int64_t);
  size_t off = align_up(header_block_);
  for (const auto& f : plan.fragments()) {
    numel_.push_back(f.numel);
    // Room for raw fp32 values or the encoding, whichever is larger (int8 and int4 with very
    // small blocks take more than 4 bytes per value, sparse with tiny chunks too).
    capacity_.push_back(std::max({f.numel * sizeof(float), wire::encoded_bytes(codec_, f.numel),
                                  wire::encoded_bytes(down_codec_, f.numel)}));
    outbox_.push_back(off);
    off = align_up(off + capacity_.back());
    inbox_.push_back(off);
    off = align_up(off + capacity_.back());
  }
  bytes_ = off;
}

size_t WindowLayout::header_offset(int p) const {
  return (kControlWords + static_cast<size_t>(p) * kHeaderWords) * sizeof(int64_t);
}

// ---------------------------------------------------------------------------- learner side

LearnerWindow::LearnerWindow(comm::ExposedMemory& memory, const WindowLayout& layout)
    : memory_(&memory), base_(memory.base()), layout_(&layout) {
  if (memory.bytes() < layout.bytes())
    fail("learner window: the exposed memory holds {} bytes, the layout needs {}", memory.bytes(),
         layout.bytes());
}

int64_t& LearnerWindow::word(size_t byte_offset) const {
  return *reinterpret_cast<int64_t*>(base_ + byte_offset);
}

int64_t LearnerWindow::control(Control w) const {
  sync();
  return std::atomic_ref<int64_t>(word(w * sizeof(int64_t))).load(std::memory_order_acquire);
}

void LearnerWindow::set_control(Control w, int64_t value) {
  std::atomic_ref<int64_t>(word(w * sizeof(int64_t))).store(value, std::memory_order_release);
  sync();
}

void LearnerWindow::set_control_f64(int w, double value) {
  if (w < 0 || w >= kControlWords) fail("set_control_f64: word {} outside the control block", w);
  std::atomic_ref<int64_t>(word(static_cast<size_t>(w) * sizeof(int64_t)))
      .store(std::bit_cast<int64_t>(value), std::memory_order_release);
  sync();
}

bool LearnerWindow::outbox_free(int p) const {
  sync();
  const size_t h = layout_->header_offset(p);
  const int64_t seq =
      std::atomic_ref<int64_t>(word(h + kOutSeq * 8)).load(std::memory_order_acquire);
  const int64_t ack =
      std::atomic_ref<int64_t>(word(h + kOutAck * 8)).load(std::memory_order_acquire);
  return ack == seq;
}

void LearnerWindow::set_reference(int p, int64_t version, std::span<const float> values) {
  if (layout_->format() == wire::Format::fp32) return;  // values travel as they are
  if (values.size() != layout_->numel(p))
    fail("set_reference: fragment {} has {} elements, got {}", p, layout_->numel(p), values.size());
  ref_.resize(layout_->fragments());
  ref_version_.resize(layout_->fragments(), -1);
  ref_[p].assign(values.begin(), values.end());
  ref_version_[p] = version;
}

int64_t LearnerWindow::reference_version(int p) const {
  return static_cast<size_t>(p) < ref_version_.size() && !ref_[p].empty() ? ref_version_[p] : -1;
}

std::span<const float> LearnerWindow::reference(int p) const {
  if (reference_version(p) < 0) return {};
  return ref_[p];
}

std::span<const float> LearnerWindow::residual(int p) const {
  if (static_cast<size_t>(p) >= residual_.size()) return {};
  return residual_[p];
}

void LearnerWindow::set_residual(int p, std::span<const float> values) {
  if (layout_->format() == wire::Format::fp32) return;
  if (!values.empty() && values.size() != layout_->numel(p))
    fail("set_residual: fragment {} has {} elements, got {}", p, layout_->numel(p), values.size());
  residual_.resize(layout_->fragments());
  residual_[p].assign(values.begin(), values.end());
}

int64_t LearnerWindow::publish(int p, std::span<const float> packed, const SnapshotMeta& meta) {
  if (packed.size() != layout_->numel(p))
    fail("publish: fragment {} has {} elements, got {}", p, layout_->numel(p), packed.size());
  if (!outbox_free(p)) fail("publish: fragment {} outbox still holds an unread snapshot", p);
  auto* out = reinterpret_cast<std::byte*>(base_ + layout_->outbox_offset(p));
  // θ − R in the wire format when a reference is shared and every value is finite; raw fp32
  // otherwise (non-finite values go as they are, for the syncer to refuse).
  const bool has_ref = layout_->format() != wire::Format::fp32 && static_cast<size_t>(p) < ref_.size() &&
                       !ref_[p].empty();
  bool raw = !has_ref;
  size_t bytes = packed.size_bytes();
  if (has_ref) {
    residual_.resize(layout_->fragments());
    std::vector<float>& e = residual_[p];
    if (e.size() != packed.size()) e.assign(packed.size(), 0.0f);
    scratch_.resize(packed.size());
    bool finite = true;
    // β·E: β = 1 adds E itself (1·e is e exactly, so the default changes no bit).
    const float beta = layout_->ef_decay();
    for (size_t i = 0; i < packed.size(); ++i) {
      scratch_[i] = packed[i] - ref_[p][i] + beta * e[i];
      finite &= std::isfinite(scratch_[i]);
    }
    if (finite) {
      bytes = layout_->wire_bytes(p);
      const std::span<std::byte> wire(out, bytes);
      wire::encode(layout_->codec(), scratch_, wire);
      // E ← what was meant − what the syncer will decode.
      wire::decode(layout_->codec(), wire, e);
      for (size_t i = 0; i < packed.size(); ++i) e[i] = scratch_[i] - e[i];
    } else {
      raw = true;
    }
  }
  if (raw) std::memcpy(out, packed.data(), packed.size_bytes());
  const size_t h = layout_->header_offset(p);
  auto store = [&](Header w, int64_t v) {
    std::atomic_ref<int64_t>(word(h + w * 8)).store(v, std::memory_order_relaxed);
  };
  store(kOutSteps, meta.c_steps);
  store(kOutTokens, meta.c_tok);
  store(kOutStep, meta.step);
  store(kOutBaseVersion, meta.base_version);
  store(kOutRef, raw ? -1 : ref_version_[p]);
  store(kOutBytes, static_cast<int64_t>(bytes));
  store(kOutChecksum, static_cast<int64_t>(checksum(std::span<const std::byte>(out, bytes))));
  // Data and metadata first, then the sequence number that announces them.
  sync();
  auto seq_word = std::atomic_ref<int64_t>(word(h + kOutSeq * 8));
  const int64_t seq = seq_word.load(std::memory_order_relaxed) + 1;
  seq_word.store(seq, std::memory_order_release);
  sync();
  return seq;
}

int64_t LearnerWindow::inbox_version(int p) const {
  sync();
  return std::atomic_ref<int64_t>(word(layout_->header_offset(p) + kInVersion * 8))
      .load(std::memory_order_acquire);
}

bool LearnerWindow::take_inbox(int p, std::span<float> out) {
  if (out.size() != layout_->numel(p))
    fail("take_inbox: fragment {} has {} elements, got {}", p, layout_->numel(p), out.size());
  const size_t h = layout_->header_offset(p);
  sync();
  auto load = [&](Header w) {
    return std::atomic_ref<int64_t>(word(h + w * 8)).load(std::memory_order_acquire);
  };
  const int64_t version = load(kInVersion);
  const auto sum = static_cast<uint64_t>(load(kInChecksum));
  const bool raw = load(kInRaw) != 0 || layout_->format() == wire::Format::fp32;
  const auto bytes = static_cast<size_t>(load(kInBytes));
  const auto* in = reinterpret_cast<const std::byte*>(base_ + layout_->inbox_offset(p));
  const size_t expected = raw ? out.size_bytes() : layout_->down_bytes(p);
  if (bytes != expected || checksum(std::span<const std::byte>(in, bytes)) != sum) return false;
  if (raw) {
    std::memcpy(out.data(), in, bytes);
    if (layout_->format() != wire::Format::fp32) set_reference(p, version, out);
  } else {
    if (static_cast<size_t>(p) >= ref_.size() || ref_[p].empty())
      fail("take_inbox: fragment {} arrived as a difference, but this unit holds no reference", p);
    scratch_.resize(out.size());
    wire::decode(layout_->down_codec(), std::span<const std::byte>(in, bytes), scratch_);
    for (size_t i = 0; i < out.size(); ++i) ref_[p][i] += scratch_[i];
    ref_version_[p] = version;
    std::copy(ref_[p].begin(), ref_[p].end(), out.begin());
  }
  std::atomic_ref<int64_t>(word(h + kInAck * 8)).store(version, std::memory_order_release);
  sync();
  return true;
}

void LearnerWindow::lose_outboxes() {
  for (int p = 0; p < layout_->fragments(); ++p) {
    auto* data = reinterpret_cast<float*>(base_ + layout_->outbox_offset(p));
    std::fill(data, data + layout_->numel(p), std::numeric_limits<float>::quiet_NaN());
  }
  ref_.clear();  // the references went with the memory: the rejoin serves raw values
  ref_version_.clear();
  residual_.clear();
  hold_inboxes();
}

void LearnerWindow::set_inbox_taken(int p, int64_t version) {
  std::atomic_ref<int64_t>(word(layout_->header_offset(p) + kInAck * 8))
      .store(version, std::memory_order_release);
  sync();
}

void LearnerWindow::hold_inboxes() {
  for (int p = 0; p < layout_->fragments(); ++p)
    std::atomic_ref<int64_t>(word(layout_->header_offset(p) + kInAck * 8))
        .store(-1, std::memory_order_release);
  sync();
}

void LearnerWindow::offer(int p, int64_t version, std::span<const float> values, int64_t seq_base,
                          int64_t epoch) {
  if (values.size() != layout_->numel(p))
    fail("offer: fragment {} has {} elements, got {}", p, layout_->numel(p), values.size());
  const auto bytes = std::as_bytes(values);
  std::memcpy(base_ + layout_->inbox_offset(p), bytes.data(), bytes.size());
  const size_t h = layout_->header_offset(p);
  auto store = [&](Header w, int64_t v) {
    std::atomic_ref<int64_t>(word(h + w * 8)).store(v, std::memory_order_release);
  };
  store(kInRaw, 1);
  store(kInBytes, static_cast<int64_t>(bytes.size()));
  store(kInChecksum, static_cast<int64_t>(checksum(bytes)));
  store(kOfferSeqBase, seq_base);
  store(kOfferEpoch, epoch);
  store(kInVersion, version);
  sync();
}

// ---------------------------------------------------------------------------- syncer side

SyncerWindow::SyncerWindow(comm::RemoteMemory& remote, const WindowLayout& layout, Clock clock)
    : remote_(&remote), layout_(&layout), units_(remote.units()), clock_(std::move(clock)),
      refs_(units_, std::vector<std::map<int64_t, std::vector<float>>>(layout.fragments())) {
  if (!clock_)
    clock_ = [t0 = std::chrono::steady_clock::now()] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
  lanes_.resize(units_);
  waiting_words_.resize(units_);
  poll_now_.assign(units_, false);
}

void SyncerWindow::reset_unit(int u) {
  for (auto& refs : refs_[u]) refs.clear();
  abandon(u);
}

void SyncerWindow::poll(std::vector<UnitHeaders>& out, bool all) {
  const size_t words = layout_->header_block_bytes() / sizeof(int64_t);
  out.resize(units_);
  next_poll_.resize(units_);
  const double now = clock_();
  const double spacing = poll_budget_ > 0 ? static_cast<double>(layout_->header_block_bytes()) / poll_budget_ : 0.0;
  std::vector<comm::RemoteMemory::Read> reads;
  std::vector<std::vector<int64_t>> fresh(units_);
  for (int u = 0; u < units_; ++u) {
    if (out[u].words.size() != words) out[u].words.assign(words, 0);
    if (!all && !poll_now_[u] && poll_budget_ > 0 && now < next_poll_[u] && remote_->connected(u))
      continue;  // within its budget
    if (lanes_[u].kind != Lane::idle && remote_->connected(u)) continue;  // behind its transfer
    if (!waiting_words_[u].empty()) flush_words(u);  // written before what they said is read
    poll_now_[u] = false;
    out[u].reachable = false;
    if (!remote_->connected(u)) continue;
    next_poll_[u] = now + spacing;
    // Read beside the last values: a read that fails (the unit died meanwhile) keeps them.
    fresh[u].resize(words);
    reads.push_back({u, 0, std::as_writable_bytes(std::span<int64_t>(fresh[u]))});
  }
  remote_->get_all(reads);
  for (const auto& r : reads) {
    if (!r.ok) continue;
    out[r.unit].words.swap(fresh[r.unit]);
    out[r.unit].reachable = true;
    bytes_read_ += words * sizeof(int64_t);
  }
  prune_references(out);
}

// A unit names, in its next snapshots, its last taken version or a newer one; an unread
// snapshot may name an older one. References below both are dropped (none while the unit
// holds its inboxes after a crash: its rejoin resets them).
void SyncerWindow::prune_references(const std::vector<UnitHeaders>& headers) {
  if (layout_->format() == wire::Format::fp32) return;
  for (int u = 0; u < units_; ++u)
    for (int p = 0; p < layout_->fragments(); ++p) {
      auto& refs = refs_[u][p];
      int64_t floor = headers[u].header(p, kInAck);
      if (floor < 0 || refs.size() <= 1) continue;
      if (headers[u].header(p, kOutSeq) > headers[u].header(p, kOutAck) && headers[u].header(p, kOutRef) >= 0)
        floor = std::min(floor, headers[u].header(p, kOutRef));
      refs.erase(refs.begin(), refs.lower_bound(floor));
      while (refs.size() > kMaxReferences) refs.erase(refs.begin());
    }
}

void SyncerWindow::set_reference(int u, int p, int64_t version, std::span<const float> values) {
  if (layout_->format() == wire::Format::fp32) return;
  refs_[u][p] = {{version, std::vector<float>(values.begin(), values.end())}};
}

// ---- lanes

// Lost, or its link stalled: the caller tries nothing more of the unit now.
SyncerWindow::Fetched SyncerWindow::unreadable() {
  Fetched got;
  got.seq_after = -1;
  got.unreachable = true;
  got.problem = "the unit could not be read";
  return got;
}

bool SyncerWindow::start_fetch(int u, int p, const UnitHeaders& headers) {
  LaneState& l = lanes_[u];
  if (l.kind != Lane::idle) return false;
  flush_words(u);  // (acks first: they free outboxes)
  const int64_t ref = headers.header(p, kOutRef);
  const auto announced = headers.header(p, kOutBytes);
  // Read what was announced, bounded by the outbox (a corrupt size is refused after the read).
  const size_t read = std::min(static_cast<size_t>(std::max<int64_t>(announced, 0)), layout_->capacity(p));
  l.ticket = remote_->start_get(u, layout_->outbox_offset(p), read);
  if (l.ticket == 0) return false;
  l.busy(Lane::fetch, p, clock_());
  l.ref = ref;
  l.announced = announced;
  l.sum = static_cast<uint64_t>(headers.header(p, kOutChecksum));
  l.bytes.resize(read);
  return true;
}

std::optional<SyncerWindow::Fetched> SyncerWindow::end_fetch(int u, std::span<float> dst) {
  LaneState& l = lanes_[u];
  if (l.kind != Lane::fetch) fail("end_fetch: unit {}'s lane holds no read", u);
  const int p = l.fragment;
  if (dst.size() != layout_->numel(p))
    fail("fetch: fragment {} has {} elements, got {}", p, layout_->numel(p), dst.size());
  const comm::RemoteMemory::Status status = remote_->test(l.ticket, l.bytes);
  if (status == comm::RemoteMemory::Status::running) return std::nullopt;
  l.end();
  Fetched got;
  const bool ok = status == comm::RemoteMemory::Status::done &&
                  remote_->fetch_word(u, layout_->header_offset(p) + kOutSeq * 8, got.seq_after);
  flush_words(u);
  if (!ok) return unreadable();
  const std::span<const std::byte> data(l.bytes);
  const bool raw = l.ref < 0 || layout_->format() == wire::Format::fp32;
  const size_t expected = raw ? dst.size_bytes() : layout_->wire_bytes(p);
  got.wire_bytes = data.size();
  got.ref = raw ? -1 : l.ref;
  bytes_read_ += data.size() + sizeof(int64_t);
  if (l.announced < 0 || static_cast<size_t>(l.announced) != expected) {
    got.problem = fmt::format("announced {} bytes, expected {} ({})", l.announced, expected,
                              raw ? "fp32" : wire::format_name(layout_->format()));
  } else if (checksum(data) != l.sum) {
    got.problem = "checksum mismatch";
    got.garbled = true;
  } else if (raw) {
    std::memcpy(dst.data(), data.data(), data.size());
  } else {
    const auto& refs = refs_[u][p];
    const auto it = refs.find(l.ref);
    if (it == refs.end()) {
      got.problem = fmt::format("reference version {} is not held (held: {})", l.ref,
                                refs.empty() ? std::string("none") : std::to_string(refs.begin()->first) + ".." +
                                                                         std::to_string(refs.rbegin()->first));
    } else {
      try {
        wire::decode(layout_->codec(), data, dst);
      } catch (const Error& e) {
        got.problem = e.what();
        return got;
      }
      for (size_t i = 0; i < dst.size(); ++i) dst[i] += it->second[i];
    }
  }
  return got;
}

std::span<const float> SyncerWindow::reference(int u, int p, int64_t version) const {
  const auto& refs = refs_.at(u).at(p);
  const auto it = refs.find(version);
  return it == refs.end() ? std::span<const float>() : std::span<const float>(it->second);
}

bool SyncerWindow::start_deliver(int u, int p, int64_t version, std::span<const float> data, bool raw) {
  if (data.size() != layout_->numel(p))
    fail("deliver: fragment {} has {} elements, got {}", p, layout_->numel(p), data.size());
  LaneState& l = lanes_[u];
  if (l.kind != Lane::idle) return false;
  flush_words(u);
  const bool lossy = layout_->format() != wire::Format::fp32;
  auto& refs = refs_[u][p];
  raw = raw || !lossy || refs.empty();
  l.next.clear();  // the unit's reference once it takes this delivery (lossy formats)
  if (raw) {
    const auto bytes = std::as_bytes(data);
    l.bytes.assign(bytes.begin(), bytes.end());
    // The unit's reference becomes what it takes here. Older ones stay until prune_references
    // finds no unread snapshot naming them: a unit that starts over from Θ with its memory
    // intact (non-finite parameters) left snapshots against them for us to read.
    if (lossy) l.next.assign(data.begin(), data.end());
  } else {
    // Θ_p − R against the newest reference (the version the unit took last: the caller checked
    // in_ack); the unit's R then moves by exactly what it decodes, and ours with it.
    const std::vector<float>& r = refs.rbegin()->second;
    delta_.resize(data.size());
    for (size_t i = 0; i < data.size(); ++i) delta_[i] = data[i] - r[i];
    l.bytes.resize(layout_->down_bytes(p));
    wire::encode(layout_->down_codec(), delta_, l.bytes);
    wire::decode(layout_->down_codec(), l.bytes, delta_);
    l.next = r;
    for (size_t i = 0; i < l.next.size(); ++i) l.next[i] += delta_[i];
  }
  // A unit that cannot be reached now (lost, or its link stalled) gets nothing, and our
  // reference of it stays: the caller delivers again later.
  l.ticket = remote_->start_put(u, layout_->inbox_offset(p), l.bytes);
  if (l.ticket == 0) return false;
  l.busy(Lane::deliver, p, clock_());
  l.version = version;
  l.raw = raw;
  l.sum = checksum(std::span<const std::byte>(l.bytes));
  return true;
}

std::optional<size_t> SyncerWindow::end_deliver(int u) {
  LaneState& l = lanes_[u];
  if (l.kind != Lane::deliver) fail("end_deliver: unit {}'s lane holds no delivery", u);
  const comm::RemoteMemory::Status status = remote_->test(l.ticket);
  if (status == comm::RemoteMemory::Status::running) return std::nullopt;
  const int p = l.fragment;
  l.end();
  // The data is complete at the target (done: the put was flushed) before the words that
  // announce it.
  bool ok = status == comm::RemoteMemory::Status::done;
  if (ok) bytes_written_ += l.bytes.size();
  const size_t h = layout_->header_offset(p);
  ok = ok && write_word(u, h + kInRaw * 8, l.raw ? 1 : 0);
  ok = ok && write_word(u, h + kInBytes * 8, static_cast<int64_t>(l.bytes.size()));
  ok = ok && write_word(u, h + kInChecksum * 8, static_cast<int64_t>(l.sum));
  ok = ok && write_word(u, h + kInVersion * 8, l.version);  // last: what makes the unit take it
  flush_words(u);
  if (!ok) return size_t{0};
  if (layout_->format() != wire::Format::fp32) {
    auto& refs = refs_[u][p];
    refs[l.version] = std::move(l.next);
    while (refs.size() > kMaxReferences) refs.erase(refs.begin());
  }
  return l.bytes.size();
}

bool SyncerWindow::lane_on_time(int u) const {
  if (lanes_[u].kind == Lane::idle) return false;
  return lane_age_s(u) < 0.25 + static_cast<double>(lanes_[u].bytes.size()) / link_min_rate_;
}

double SyncerWindow::lane_age_s(int u) const {
  if (lanes_[u].kind == Lane::idle) return 0.0;
  return clock_() - lanes_[u].started;
}

void SyncerWindow::set_link_min_rate(double bytes_per_s) {
  if (!(bytes_per_s > 0)) fail("link min rate must be positive, got {}", bytes_per_s);
  link_min_rate_ = bytes_per_s;
}

void SyncerWindow::abandon(int u) {
  LaneState& l = lanes_[u];
  if (l.ticket != 0) remote_->abandon(l.ticket);
  const uint64_t serial = l.serial;
  l = LaneState{};
  l.serial = serial;
  waiting_words_[u].clear();
}

SyncerWindow::Fetched SyncerWindow::fetch(int u, int p, const UnitHeaders& headers, std::span<float> dst) {
  if (lanes_[u].kind != Lane::idle) fail("fetch: unit {}'s lane is busy", u);
  if (!start_fetch(u, p, headers)) return unreadable();
  for (;;) {
    if (auto got = end_fetch(u, dst)) return *got;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

size_t SyncerWindow::deliver(int u, int p, int64_t version, std::span<const float> data, bool raw) {
  if (lanes_[u].kind != Lane::idle) fail("deliver: unit {}'s lane is busy", u);
  if (!start_deliver(u, p, version, data, raw)) return 0;
  for (;;) {
    if (auto bytes = end_deliver(u)) return *bytes;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

bool SyncerWindow::write_word(int u, size_t byte_offset, int64_t value) {
  if (!remote_->put_word(u, byte_offset, value)) return false;
  bytes_written_ += sizeof(int64_t);
  return true;
}

// A word for a unit whose lane is busy, or behind words that wait, waits too (written in the
// order issued once the lane is idle): true means it will be written unless the unit is lost.
bool SyncerWindow::put_word(int u, size_t byte_offset, int64_t value) {
  auto& waiting = waiting_words_[u];
  if (lanes_[u].kind == Lane::idle && waiting.empty()) return write_word(u, byte_offset, value);
  if (!remote_->connected(u)) return false;
  std::erase_if(waiting, [&](const auto& w) { return w.first == byte_offset; });
  waiting.emplace_back(byte_offset, value);
  return true;
}

bool SyncerWindow::flush_words(int u) {
  auto& waiting = waiting_words_[u];
  size_t written = 0;
  while (written < waiting.size() && lanes_[u].kind == Lane::idle &&
         write_word(u, waiting[written].first, waiting[written].second))
    ++written;
  waiting.erase(waiting.begin(), waiting.begin() + static_cast<ptrdiff_t>(written));
  return waiting.empty();
}

void SyncerWindow::ack(int u, int p, int64_t seq) {
  put_word(u, layout_->header_offset(p) + kOutAck * 8, seq);
}

size_t SyncerWindow::delivery_bytes(int u, int p) const {
  const bool raw = layout_->format() == wire::Format::fp32 || refs_[u][p].empty();
  return raw ? layout_->numel(p) * sizeof(float) : layout_->down_bytes(p);
}

void SyncerWindow::request_stop(int u) { put_word(u, kStop * sizeof(int64_t), 1); }

void SyncerWindow::set_global_version(int u, int64_t version) {
  put_word(u, kGlobalVersion * sizeof(int64_t), version);
}

void SyncerWindow::set_job_tokens(int u, int64_t tokens) {
  put_word(u, kJobTokens * sizeof(int64_t), tokens);
}

bool SyncerWindow::fetch_control(int u, Control word, int64_t& value) {
  return remote_->fetch_word(u, static_cast<size_t>(word) * sizeof(int64_t), value);
}

std::string SyncerWindow::fetch_offer(int u, int p, const UnitHeaders& headers, std::span<float> dst) {
  if (lanes_[u].kind != Lane::idle) fail("fetch_offer: unit {}'s lane is busy", u);
  if (dst.size() != layout_->numel(p))
    fail("fetch_offer: fragment {} has {} elements, got {}", p, layout_->numel(p), dst.size());
  const int64_t bytes = headers.header(p, kInBytes);
  if (bytes != static_cast<int64_t>(dst.size_bytes()) || headers.header(p, kInRaw) != 1)
    return fmt::format("its copy of fragment {} is announced as {} bytes (raw {}), expected {} raw",
                       p, bytes, headers.header(p, kInRaw), dst.size_bytes());
  const std::span<std::byte> out = std::as_writable_bytes(dst);
  if (!remote_->get(u, layout_->inbox_offset(p), out)) return "the unit could not be read";
  bytes_read_ += out.size();
  if (checksum(std::span<const std::byte>(out)) != static_cast<uint64_t>(headers.header(p, kInChecksum)))
    return fmt::format("its copy of fragment {} fails its checksum", p);
  return "";
}

bool SyncerWindow::set_control(int u, Control word, int64_t value) {
  return put_word(u, static_cast<size_t>(word) * sizeof(int64_t), value);
}

}  // namespace ddiloco::protocol
