#include "ddiloco/shard.hpp"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <utility>

#include "ddiloco/error.hpp"
#include "ddiloco/run_dir.hpp"

namespace ddiloco {

namespace fs = std::filesystem;

void write_shard(const fs::path& path, std::span<const uint16_t> tokens) {
  if (path.has_parent_path()) fs::create_directories(path.parent_path());
  std::array<int32_t, kShardHeaderInts> header{};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  if (tokens.size() > static_cast<size_t>(INT32_MAX))
    fail("{}: {} tokens exceed the format's int32 count", path.string(), tokens.size());
  header[2] = static_cast<int32_t>(tokens.size());

  const fs::path tmp = path.string() + ".tmp";
  {
    // Created afresh, never through a symlink or a file planted at the temporary name.
    UniqueFd f = create_new_file(tmp, 0644);
    write_all(f.get(), header.data(), kShardHeaderBytes, tmp);
    write_all(f.get(), tokens.data(), tokens.size_bytes(), tmp);
    if (::fsync(f.get()) != 0) fail("{}: fsync failed: {}", tmp.string(), std::strerror(errno));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);  // replaces a symlink at `path`, never writes through it
  if (ec) fail("{}: cannot rename from {}: {}", path.string(), tmp.string(), ec.message());
}

namespace {

void check_size(int64_t size, const std::string& label) {
  if (size < static_cast<int64_t>(kShardHeaderBytes))
    fail("{}: file is {} bytes, shorter than the {}-byte shard header (truncated or not a token "
         "shard)",
         label, size, kShardHeaderBytes);
}

// The header's magic, version and count against the file's size (`size` bytes); returns n.
int64_t check_header(const std::array<int32_t, kShardHeaderInts>& header, int64_t size,
                     const std::string& label) {
  if (header[0] != kShardMagic)
    fail("{}: bad magic {} (expected {}: not an llm.c/ddiloco token shard)", label, header[0],
         kShardMagic);
  if (header[1] != kShardVersion)
    fail("{}: unsupported shard version {} (expected {}: uint16 tokens)", label, header[1],
         kShardVersion);
  const int64_t count = header[2];
  if (count < 0) fail("{}: negative token count {} in the header", label, count);
  const int64_t expected = static_cast<int64_t>(kShardHeaderBytes) + 2 * count;
  if (size != expected)
    fail("{}: header says {} tokens ({} bytes with the header) but the file is {} bytes "
         "(truncated or corrupt)",
         label, count, expected, size);
  return count;
}

// Every token < vocab_size; `token(i)` reads token i.
template <typename Token>
void check_tokens(int64_t count, Token&& token, int vocab_size, const std::string& label) {
  for (int64_t i = 0; i < count; ++i)
    if (const uint16_t t = token(i); t >= vocab_size)
      fail("{}: token {} at index {} is ≥ model.vocab_size = {} (shard made for another "
           "tokenizer?)",
           label, t, i, vocab_size);
}

}  // namespace

int64_t read_shard_header(const fs::path& path) {
  UniqueFd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.get() < 0) fail("{}: cannot open token shard: {}", path.string(), std::strerror(errno));
  struct stat st {};
  if (::fstat(f.get(), &st) != 0) fail("{}: cannot stat: {}", path.string(), std::strerror(errno));
  const auto size = static_cast<int64_t>(st.st_size);
  check_size(size, path.string());
  std::array<int32_t, kShardHeaderInts> header{};
  if (::pread(f.get(), header.data(), kShardHeaderBytes, 0) !=
      static_cast<ssize_t>(kShardHeaderBytes))
    fail("{}: cannot read the shard header", path.string());
  return check_header(header, size, path.string());
}

Shard Shard::open(const fs::path& path, int vocab_size) {
  const int64_t count = read_shard_header(path);
  Shard shard;
  shard.path_ = path;
  shard.count_ = count;
  shard.map_bytes_ = kShardHeaderBytes + 2 * static_cast<size_t>(count);
  UniqueFd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.get() < 0) fail("{}: cannot open token shard: {}", path.string(), std::strerror(errno));
  void* map = ::mmap(nullptr, shard.map_bytes_, PROT_READ, MAP_PRIVATE, f.get(), 0);
  if (map == MAP_FAILED) fail("{}: mmap failed: {}", path.string(), std::strerror(errno));
  shard.map_ = map;
  shard.tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(map) +
                                                    kShardHeaderBytes);
  const uint16_t* tokens = shard.tokens_;
  check_tokens(count, [tokens](int64_t i) { return tokens[i]; }, vocab_size, path.string());
  return shard;
}

int64_t check_shard(std::span<const std::byte> image, int vocab_size, const std::string& source) {
  const auto size = static_cast<int64_t>(image.size());
  check_size(size, source);
  std::array<int32_t, kShardHeaderInts> header{};
  std::memcpy(header.data(), image.data(), kShardHeaderBytes);
  const int64_t count = check_header(header, size, source);
  const std::byte* tokens = image.data() + kShardHeaderBytes;
  check_tokens(count, [tokens](int64_t i) {
    uint16_t t;  // the image need not be 2-byte aligned
    std::memcpy(&t, tokens + 2 * i, sizeof t);
    return t;
  }, vocab_size, source);
  return count;
}

Shard::Shard(Shard&& other) noexcept { *this = std::move(other); }

Shard& Shard::operator=(Shard&& other) noexcept {
  if (this != &other) {
    if (map_) ::munmap(map_, map_bytes_);
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    count_ = std::exchange(other.count_, 0);
  }
  return *this;
}

Shard::~Shard() {
  if (map_) ::munmap(map_, map_bytes_);
}

std::vector<fs::path> expand_shard_pattern(const std::string& pattern, const std::string& what) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<fs::path> files;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  if (files.empty())
    fail("{}: no token shards match '{}' (run `ddiloco prepare-data` or scripts/demo.sh first)",
         what, pattern);
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace ddiloco
