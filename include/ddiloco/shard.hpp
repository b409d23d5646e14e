// Token shards in llm.c's binary format.
//
// Layout (little-endian): a header of 256 int32 — [0] magic 20240520, [1] version 1,
// [2] token count n, the rest 0 — followed by n uint16 tokens. This is the format of llm.c's
// data scripts (dev/data/data_common.py, write_datafile), so GPT-2 shards made there load here
// unchanged, and ours load there.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace ddiloco {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderInts = 256;
inline constexpr size_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);

/// Writes tokens to `path` atomically (a temporary file in the same directory, fsync'd, then
/// renamed over the target). Creates parent directories. Throws Error on I/O failure.
void write_shard(const std::filesystem::path& path, std::span<const uint16_t> tokens);

/// Reads and checks a shard's header only: magic, version, and that the file size equals
/// header + 2·n bytes. Returns n (tokens). Throws Error naming the file and the problem.
int64_t read_shard_header(const std::filesystem::path& path);

/// The checks of Shard::open on a shard already in memory (`image`: header and tokens, as in
/// the file): header, size, and every token < vocab_size. Returns n (tokens). Throws Error
/// naming `source` and the problem, as Shard::open does for a file.
int64_t check_shard(std::span<const std::byte> image, int vocab_size, const std::string& source);

/// A shard mapped read-only into memory after full validation (header as above, and every
/// token < vocab_size).
class Shard {
 public:
  /// Throws Error naming the file and the problem (bad magic / version / size, token ≥ vocab).
  static Shard open(const std::filesystem::path& path, int vocab_size);

  Shard(Shard&& other) noexcept;
  Shard& operator=(Shard&& other) noexcept;
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;
  ~Shard();

  std::span<const uint16_t> tokens() const { return {tokens_, static_cast<size_t>(count_)}; }
  const std::filesystem::path& path() const { return path_; }

 private:
  Shard() = default;
  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t count_ = 0;
};

/// Files matching a glob pattern (e.g. "data/kjv/train_*.bin"), sorted by name. `what` names
/// the config field in the error thrown when nothing matches.
std::vector<std::filesystem::path> expand_shard_pattern(const std::string& pattern,
                                                        const std::string& what);

}  // namespace ddiloco
