#include "ddiloco/checksum.hpp"

#include <bit>
#include <cstring>

namespace ddiloco {

uint64_t checksum(std::span<const float> data) { return checksum(std::as_bytes(data)); }

uint64_t checksum(std::span<const std::byte> data) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
  const size_t n = data.size_bytes();
  uint64_t h = 0x243F6A8885A308D3ULL ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, bytes + i, 8);
    h = std::rotl(h ^ (w * 0x9E3779B97F4A7C15ULL), 27) * 0xBF58476D1CE4E5B9ULL;
  }
  for (; i < n; ++i) h = (h ^ bytes[i]) * 0x100000001B3ULL;
  return h ^ (h >> 31);
}

}  // namespace ddiloco
