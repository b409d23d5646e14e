#include "ddiloco/sync_window.hpp"

#include <exception>

#include <atomic>
#include <algorithm>
#include <cstring>
#include <limits>

#include "ddiloco/error.hpp"
#include "ddiloco/mpi.hpp"

namespace ddiloco::sync {

namespace {
constexpr size_t kAlign = 64;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

WindowLayout::WindowLayout(const FragmentPlan& plan) {
  const int P = plan.size();
  header_block_ = (kControlWords + static_cast<size_t>(P) * kHeaderWords) * sizeof(int64_t);
  size_t off = align_up(header_block_);
  for (const auto& f : plan.fragments()) {
    numel_.push_back(f.numel);
    outbox_.push_back(off);
    off = align_up(off + f.numel * sizeof(float));
    inbox_.push_back(off);
    off = align_up(off + f.numel * sizeof(float));
  }
  bytes_ = off;
}

size_t WindowLayout::header_offset(int p) const {
  return (kControlWords + static_cast<size_t>(p) * kHeaderWords) * sizeof(int64_t);
}

// ---------------------------------------------------------------------------- learner side

LearnerWindow::LearnerWindow(MPI_Comm sync_comm, const WindowLayout& layout) : layout_(&layout) {
  mpi::check(MPI_Win_allocate(static_cast<MPI_Aint>(layout.bytes()), 1, MPI_INFO_NULL, sync_comm,
                              &base_, &win_),
             "Win_allocate(learner)");
  std::memset(base_, 0, layout.bytes());
  mpi::check(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_), "Win_lock_all(learner)");
  MPI_Win_sync(win_);
  // Every window is initialised before the syncer's first read.
  mpi::check(MPI_Barrier(sync_comm), "Barrier(window ready)");
}

LearnerWindow::~LearnerWindow() {
  // Freeing a window is collective: while an error unwinds the stack on this rank alone, the
  // others would never join, and the job would hang instead of reporting it (main aborts).
  if (win_ != MPI_WIN_NULL && std::uncaught_exceptions() == 0) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) close();
  }
}

void LearnerWindow::close() {
  if (win_ == MPI_WIN_NULL) return;
  MPI_Win_unlock_all(win_);
  MPI_Win_free(&win_);
  win_ = MPI_WIN_NULL;
}

int64_t& LearnerWindow::word(size_t byte_offset) const {
  return *reinterpret_cast<int64_t*>(base_ + byte_offset);
}

int64_t LearnerWindow::control(Control w) const {
  MPI_Win_sync(win_);
  return std::atomic_ref<int64_t>(word(w * sizeof(int64_t))).load(std::memory_order_acquire);
}

void LearnerWindow::set_control(Control w, int64_t value) {
  std::atomic_ref<int64_t>(word(w * sizeof(int64_t))).store(value, std::memory_order_release);
  MPI_Win_sync(win_);
}

bool LearnerWindow::outbox_free(int p) const {
  MPI_Win_sync(win_);
  const size_t h = layout_->header_offset(p);
  const int64_t seq =
      std::atomic_ref<int64_t>(word(h + kOutSeq * 8)).load(std::memory_order_acquire);
  const int64_t ack =
      std::atomic_ref<int64_t>(word(h + kOutAck * 8)).load(std::memory_order_acquire);
  return ack == seq;
}

int64_t LearnerWindow::publish(int p, std::span<const float> packed, const SnapshotMeta& meta) {
  if (packed.size() != layout_->numel(p))
    fail("publish: fragment {} has {} elements, got {}", p, layout_->numel(p), packed.size());
  if (!outbox_free(p)) fail("publish: fragment {} outbox still holds an unread snapshot", p);
  std::memcpy(base_ + layout_->outbox_offset(p), packed.data(), packed.size_bytes());
  const size_t h = layout_->header_offset(p);
  auto store = [&](Header w, int64_t v) {
    std::atomic_ref<int64_t>(word(h + w * 8)).store(v, std::memory_order_relaxed);
  };
  store(kOutSteps, meta.c_steps);
  store(kOutTokens, meta.c_tok);
  store(kOutStep, meta.step);
  store(kOutBaseVersion, meta.base_version);
  store(kOutChecksum, static_cast<int64_t>(checksum(packed)));
  // Data and metadata first, then the sequence number that announces them.
  MPI_Win_sync(win_);
  auto seq_word = std::atomic_ref<int64_t>(word(h + kOutSeq * 8));
  const int64_t seq = seq_word.load(std::memory_order_relaxed) + 1;
  seq_word.store(seq, std::memory_order_release);
  MPI_Win_sync(win_);
  return seq;
}

int64_t LearnerWindow::inbox_version(int p) const {
  MPI_Win_sync(win_);
  return std::atomic_ref<int64_t>(word(layout_->header_offset(p) + kInVersion * 8))
      .load(std::memory_order_acquire);
}

bool LearnerWindow::take_inbox(int p, std::span<float> out) {
  if (out.size() != layout_->numel(p))
    fail("take_inbox: fragment {} has {} elements, got {}", p, layout_->numel(p), out.size());
  const size_t h = layout_->header_offset(p);
  MPI_Win_sync(win_);
  const int64_t version =
      std::atomic_ref<int64_t>(word(h + kInVersion * 8)).load(std::memory_order_acquire);
  const auto sum = static_cast<uint64_t>(
      std::atomic_ref<int64_t>(word(h + kInChecksum * 8)).load(std::memory_order_acquire));
  std::memcpy(out.data(), base_ + layout_->inbox_offset(p), out.size_bytes());
  if (checksum(out) != sum) return false;
  std::atomic_ref<int64_t>(word(h + kInAck * 8)).store(version, std::memory_order_release);
  MPI_Win_sync(win_);
  return true;
}

void LearnerWindow::lose_outboxes() {
  for (int p = 0; p < layout_->fragments(); ++p) {
    auto* data = reinterpret_cast<float*>(base_ + layout_->outbox_offset(p));
    std::fill(data, data + layout_->numel(p), std::numeric_limits<float>::quiet_NaN());
  }
  hold_inboxes();
}

void LearnerWindow::set_inbox_taken(int p, int64_t version) {
  std::atomic_ref<int64_t>(word(layout_->header_offset(p) + kInAck * 8))
      .store(version, std::memory_order_release);
  MPI_Win_sync(win_);
}

void LearnerWindow::hold_inboxes() {
  for (int p = 0; p < layout_->fragments(); ++p)
    std::atomic_ref<int64_t>(word(layout_->header_offset(p) + kInAck * 8))
        .store(-1, std::memory_order_release);
  MPI_Win_sync(win_);
}

// ---------------------------------------------------------------------------- syncer side

SyncerWindow::SyncerWindow(MPI_Comm sync_comm, const WindowLayout& layout, int units)
    : layout_(&layout), units_(units) {
  char* base = nullptr;
  mpi::check(MPI_Win_allocate(0, 1, MPI_INFO_NULL, sync_comm, &base, &win_),
             "Win_allocate(syncer)");
  mpi::check(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_), "Win_lock_all(syncer)");
  mpi::check(MPI_Barrier(sync_comm), "Barrier(window ready)");
}

SyncerWindow::~SyncerWindow() {
  // Freeing a window is collective: while an error unwinds the stack on this rank alone, the
  // others would never join, and the job would hang instead of reporting it (main aborts).
  if (win_ != MPI_WIN_NULL && std::uncaught_exceptions() == 0) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) close();
  }
}

void SyncerWindow::close() {
  if (win_ == MPI_WIN_NULL) return;
  MPI_Win_unlock_all(win_);
  MPI_Win_free(&win_);
  win_ = MPI_WIN_NULL;
}

void SyncerWindow::poll(std::vector<UnitHeaders>& out) {
  const size_t words = layout_->header_block_bytes() / sizeof(int64_t);
  out.resize(units_);
  std::vector<MPI_Request> requests(units_);
  for (int u = 0; u < units_; ++u) {
    out[u].words.resize(words);
    mpi::check(MPI_Rget(out[u].words.data(), static_cast<int>(words), MPI_INT64_T, u + 1, 0,
                        static_cast<int>(words), MPI_INT64_T, win_, &requests[u]),
               "Rget(headers)");
  }
  mpi::check(MPI_Waitall(units_, requests.data(), MPI_STATUSES_IGNORE), "Waitall(headers)");
  bytes_read_ += static_cast<uint64_t>(units_) * words * sizeof(int64_t);
}

int64_t SyncerWindow::fetch(int u, int p, std::span<float> dst) {
  if (dst.size() != layout_->numel(p))
    fail("fetch: fragment {} has {} elements, got {}", p, layout_->numel(p), dst.size());
  MPI_Request request;
  // Fragments can exceed INT_MAX bytes; count in floats (INT_MAX floats = 8 GiB per fragment).
  mpi::check(MPI_Rget(dst.data(), static_cast<int>(dst.size()), MPI_FLOAT, u + 1,
                      static_cast<MPI_Aint>(layout_->outbox_offset(p)),
                      static_cast<int>(dst.size()), MPI_FLOAT, win_, &request),
             "Rget(snapshot)");
  mpi::check(MPI_Wait(&request, MPI_STATUS_IGNORE), "Wait(snapshot)");
  int64_t seq = 0, dummy = 0;
  mpi::check(MPI_Fetch_and_op(&dummy, &seq, MPI_INT64_T, u + 1,
                              static_cast<MPI_Aint>(layout_->header_offset(p) + kOutSeq * 8),
                              MPI_NO_OP, win_),
             "Fetch_and_op(seq)");
  mpi::check(MPI_Win_flush(u + 1, win_), "Win_flush");
  bytes_read_ += dst.size_bytes() + sizeof(int64_t);
  return seq;
}

void SyncerWindow::put_word(int u, size_t byte_offset, int64_t value) {
  mpi::check(MPI_Accumulate(&value, 1, MPI_INT64_T, u + 1, static_cast<MPI_Aint>(byte_offset), 1,
                            MPI_INT64_T, MPI_REPLACE, win_),
             "Accumulate");
  mpi::check(MPI_Win_flush(u + 1, win_), "Win_flush");
  bytes_written_ += sizeof(int64_t);
}

void SyncerWindow::ack(int u, int p, int64_t seq) {
  put_word(u, layout_->header_offset(p) + kOutAck * 8, seq);
}

void SyncerWindow::deliver(int u, int p, int64_t version, std::span<const float> data) {
  if (data.size() != layout_->numel(p))
    fail("deliver: fragment {} has {} elements, got {}", p, layout_->numel(p), data.size());
  MPI_Request request;
  mpi::check(MPI_Rput(data.data(), static_cast<int>(data.size()), MPI_FLOAT, u + 1,
                      static_cast<MPI_Aint>(layout_->inbox_offset(p)),
                      static_cast<int>(data.size()), MPI_FLOAT, win_, &request),
             "Rput(fragment)");
  mpi::check(MPI_Wait(&request, MPI_STATUS_IGNORE), "Wait(fragment)");
  // The data is complete at the target before the words that announce it.
  mpi::check(MPI_Win_flush(u + 1, win_), "Win_flush");
  bytes_written_ += data.size_bytes();
  const size_t h = layout_->header_offset(p);
  put_word(u, h + kInChecksum * 8, static_cast<int64_t>(checksum(data)));
  put_word(u, h + kInVersion * 8, version);
}

void SyncerWindow::request_stop(int u) { put_word(u, kStop * sizeof(int64_t), 1); }

void SyncerWindow::set_global_version(int u, int64_t version) {
  put_word(u, kGlobalVersion * sizeof(int64_t), version);
}

void SyncerWindow::set_job_tokens(int u, int64_t tokens) {
  put_word(u, kJobTokens * sizeof(int64_t), tokens);
}

void SyncerWindow::set_control(int u, Control word, int64_t value) {
  put_word(u, static_cast<size_t>(word) * sizeof(int64_t), value);
}

}  // namespace ddiloco::sync
