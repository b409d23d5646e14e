// An in-memory transport for remote_memory.hpp: the protocol and the syncer's decisions,
// tested without MPI or UCX. Each unit's memory is a buffer of this process; the "remote"
// side copies to and from it (words with atomics, as the real transports' are). A unit can be
// detached (its process died) and a fresh memory attached (a new process of it).
#pragma once

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "ddiloco/remote_memory.hpp"

namespace ddiloco::test {

class LocalExposed final : public comm::ExposedMemory {
 public:
  explicit LocalExposed(size_t bytes) : words_((bytes + 7) / 8 + 8, 0), bytes_(bytes) {}
  std::byte* base() override { return reinterpret_cast<std::byte*>(words_.data()); }
  size_t bytes() const override { return bytes_; }
  void sync() override { std::atomic_thread_fence(std::memory_order_seq_cst); }
  void close() override { closed = true; }
  bool closed = false;

 private:
  std::vector<int64_t> words_;  // 8-byte aligned storage
  size_t bytes_;
};

class LocalRemote final : public comm::RemoteMemory {
 public:
  explicit LocalRemote(int units) : units_(units, nullptr) {}
  void attach(int u, LocalExposed* memory) { units_[u] = memory; }
  void detach(int u) { units_[u] = nullptr; }
  /// As UcxSyncerLink with an operation stalled (a cut link): connected, but every operation
  /// on the unit fails.
  void stall(int u, bool on) { stalled_.resize(units_.size()); stalled_[u] = on; }
  int units() const override { return static_cast<int>(units_.size()); }
  bool connected(int u) const override { return units_[u] != nullptr; }
  void get_all(std::span<Read> reads) override {
    for (Read& r : reads) r.ok = get(r.unit, r.offset, r.dst);
  }
  bool get(int u, size_t offset, std::span<std::byte> dst) override {
    if (!in(u, offset, dst.size())) return false;
    std::memcpy(dst.data(), units_[u]->base() + offset, dst.size());
    return true;
  }
  bool put(int u, size_t offset, std::span<const std::byte> src) override {
    if (!in(u, offset, src.size())) return false;
    std::memcpy(units_[u]->base() + offset, src.data(), src.size());
    ++puts;
    return true;
  }
  bool put_word(int u, size_t offset, int64_t value) override {
    if (!in(u, offset, 8)) return false;
    words_written.emplace_back(u, offset);
    std::atomic_ref<int64_t>(*reinterpret_cast<int64_t*>(units_[u]->base() + offset)).store(value);
    return true;
  }
  bool fetch_word(int u, size_t offset, int64_t& value) override {
    if (!in(u, offset, 8)) return false;
    value = std::atomic_ref<int64_t>(*reinterpret_cast<int64_t*>(units_[u]->base() + offset)).load();
    return true;
  }
  void close() override {}
  int64_t puts = 0;
  std::vector<std::pair<int, size_t>> words_written;  ///< (unit, offset) of every put_word, in order

  /// As a slow link: unit u's transfers (start_get / start_put) stay running while held, and
  /// are carried out at the first test() after the hold ends.
  void hold(int u, bool on) { held_.resize(units_.size()); held_[u] = on; }
  Ticket start_get(int u, size_t offset, size_t bytes) override {
    if (!in(u, offset, bytes)) return 0;
    transfers_[next_] = Transfer{u, offset, std::vector<std::byte>(bytes), false};
    return next_++;
  }
  Ticket start_put(int u, size_t offset, std::span<const std::byte> src) override {
    if (!in(u, offset, src.size())) return 0;
    transfers_[next_] = Transfer{u, offset, std::vector<std::byte>(src.begin(), src.end()), true};
    return next_++;
  }
  Status test(Ticket t, std::span<std::byte> dst) override {
    const auto it = transfers_.find(t);
    if (it == transfers_.end()) return Status::failed;
    Transfer& x = it->second;
    if (static_cast<size_t>(x.unit) < held_.size() && held_[x.unit]) return Status::running;
    const bool ok = x.put ? put(x.unit, x.offset, x.bytes) : get(x.unit, x.offset, dst.first(x.bytes.size()));
    transfers_.erase(it);
    return ok ? Status::done : Status::failed;
  }
  void abandon(Ticket t) override { transfers_.erase(t); }

 private:
  bool in(int u, size_t offset, size_t n) const {
    const bool stalled = static_cast<size_t>(u) < stalled_.size() && stalled_[u];
    return units_[u] != nullptr && !stalled && offset + n <= units_[u]->bytes();
  }
  std::vector<LocalExposed*> units_;
  std::vector<bool> stalled_, held_;
  struct Transfer {
    int unit;
    size_t offset;
    std::vector<std::byte> bytes;
    bool put;
  };
  std::map<Ticket, Transfer> transfers_;
  Ticket next_ = 1;
};

}  // namespace ddiloco::test
