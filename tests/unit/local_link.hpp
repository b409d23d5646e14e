// An in-memory transport for remote_memory.hpp: the protocol and the syncer's decisions,
// tested without MPI or UCX. Each unit's memory is a buffer of this process; the "remote"
// side copies to and from it (words with atomics, as the real transports' are). A unit can be
// detached (its process died) and a fresh memory attached (a new process of it).
#pragma once

#include <atomic>
#include <cstring>
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

 private:
  bool in(int u, size_t offset, size_t n) const {
    const bool stalled = static_cast<size_t>(u) < stalled_.size() && stalled_[u];
    return units_[u] != nullptr && !stalled && offset + n <= units_[u]->bytes();
  }
  std::vector<LocalExposed*> units_;
  std::vector<bool> stalled_;
};

}  // namespace ddiloco::test
