// The default transfers of remote_memory.hpp: done at once with the blocking operations.
#include "ddiloco/remote_memory.hpp"

#include <cstring>

#include "ddiloco/error.hpp"

namespace ddiloco::comm {

RemoteMemory::Ticket RemoteMemory::start_get(int u, size_t offset, size_t bytes) {
  if (!connected(u)) return 0;
  Finished f;
  f.data.resize(bytes);
  f.ok = get(u, offset, f.data);
  if (!f.ok) return 0;
  const Ticket t = next_ticket_++;
  finished_.emplace(t, std::move(f));
  return t;
}

RemoteMemory::Ticket RemoteMemory::start_put(int u, size_t offset, std::span<const std::byte> src) {
  if (!connected(u) || !put(u, offset, src)) return 0;
  const Ticket t = next_ticket_++;
  finished_.emplace(t, Finished{true, {}});
  return t;
}

RemoteMemory::Status RemoteMemory::test(Ticket ticket, std::span<std::byte> dst) {
  const auto it = finished_.find(ticket);
  if (it == finished_.end()) return Status::failed;
  if (!it->second.data.empty() && it->second.data.size() != dst.size())
    fail("transfer {}: read {} bytes into a buffer of {}", ticket, it->second.data.size(), dst.size());
  if (!dst.empty() && it->second.data.size() == dst.size())
    std::memcpy(dst.data(), it->second.data.data(), dst.size());
  finished_.erase(it);
  return Status::done;
}

void RemoteMemory::abandon(Ticket ticket) { finished_.erase(ticket); }

}  // namespace ddiloco::comm
