// The default transfers of remote_memory.hpp: done at once with the blocking operations.
#include "ddiloco/remote_memory.hpp"

#include <cstring>

#include "ddiloco/error.hpp"

namespace ddiloco::comm {

RemoteMemory::Ticket RemoteMemory::start_get(int u, size_t offset, size_t bytes) {
  std::vector<std::byte> data(bytes);
  if (!get(u, offset, data)) return 0;  // (absent: false at once)
  finished_.emplace(next_ticket_, std::move(data));
  return next_ticket_++;
}

RemoteMemory::Ticket RemoteMemory::start_put(int u, size_t offset, std::span<const std::byte> src) {
  if (!put(u, offset, src)) return 0;
  finished_.emplace(next_ticket_, std::vector<std::byte>());
  return next_ticket_++;
}

RemoteMemory::Status RemoteMemory::test(Ticket ticket, std::span<std::byte> dst) {
  const auto it = finished_.find(ticket);
  if (it == finished_.end()) return Status::failed;
  const std::vector<std::byte> data = std::move(it->second);  // a get's bytes; a put's: none
  finished_.erase(it);
  if (!data.empty()) {
    if (data.size() != dst.size()) fail("transfer {}: read {} bytes into a buffer of {}", ticket, data.size(), dst.size());
    std::memcpy(dst.data(), data.data(), dst.size());
  }
  return Status::done;
}

void RemoteMemory::abandon(Ticket ticket) { finished_.erase(ticket); }

}  // namespace ddiloco::comm
