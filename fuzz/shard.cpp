// Fuzz target: token shards (include/ddiloco/shard.hpp).
//
// Feeds: the input as a whole shard file (256-int32 header, then uint16 tokens), to
// check_shard (in memory) and to the real reader, Shard::open and read_shard_header, through a
// memfd (/proc/self/fd/N), with model.vocab_size 256 (byte-level text, as the tests' shards).
// Checks: no crash or sanitizer report; the only exception is ddiloco::Error; both readers
// agree (both refuse, or both accept with the same token count), and an accepted shard's
// tokens are all < vocab_size.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>

#include "ddiloco/error.hpp"
#include "ddiloco/shard.hpp"

namespace {

constexpr int kVocab = 256;

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "fuzz_shard: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto image = std::as_bytes(std::span(data, size));
  std::optional<int64_t> in_memory;
  try {
    in_memory = ddiloco::check_shard(image, kVocab, "fuzz shard");
  } catch (const ddiloco::Error&) {
  }

  const int fd = ::memfd_create("fuzz_shard", MFD_CLOEXEC);
  if (fd < 0) return 0;
  if (size > 0 && ::write(fd, data, size) != static_cast<ssize_t>(size)) {
    ::close(fd);
    return 0;
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  std::optional<int64_t> from_file;
  try {
    const int64_t header_count = ddiloco::read_shard_header(path);
    const ddiloco::Shard shard = ddiloco::Shard::open(path, kVocab);
    if (static_cast<int64_t>(shard.tokens().size()) != header_count)
      finding("Shard::open and read_shard_header disagree on the token count");
    for (uint16_t t : shard.tokens())
      if (t >= kVocab) finding("Shard::open accepted a token >= vocab_size");
    from_file = header_count;
  } catch (const ddiloco::Error&) {
  }
  ::close(fd);
  if (in_memory != from_file) finding("check_shard and Shard::open disagree on this input");
  return 0;
}
