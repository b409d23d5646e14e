// A fast 64-bit checksum of buffers, for detecting torn or corrupted transfers and replicas
// that drifted apart; not cryptographic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace ddiloco {

/// Multiply-rotate hash over the bytes of `data` (8-byte words, then the tail).
uint64_t checksum(std::span<const float> data);
uint64_t checksum(std::span<const std::byte> data);

}  // namespace ddiloco
