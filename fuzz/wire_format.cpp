// Fuzz target: the wire-format decoders (include/ddiloco/wire_format.hpp: fp32, bf16, int8,
// int4, int2, sparse), i.e. what a unit or the syncer decodes from a peer.
//
// Feeds: a codec and a declared element count n from the input's first 8 bytes
//   [0] format (mod 6)  [1..2] n (uint16, so ≤ 65535 < 1<<16 values)
//   [3..4] block = chunk = 1 + uint16  [5..6] topk = 1 + uint16  [7] value_bits (2, 4, 8 or raw)
// and the rest as the encoded bytes: the first encoded_bytes(codec, n) of them when there are
// that many (the size a receiver checks first), else all of them (a wrong size).
// Checks: no crash or sanitizer report; the only exception is ddiloco::Error; a decode that
// succeeds yields only finite values (the documented contract: non-finite input is refused).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "ddiloco/error.hpp"
#include "ddiloco/wire_format.hpp"

using namespace ddiloco;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  auto u16 = [&](size_t i) { return static_cast<size_t>(data[i] | (data[i + 1] << 8)); };
  wire::Codec codec;
  codec.format = static_cast<wire::Format>(data[0] % 6);
  const size_t n = u16(1);
  codec.block = 1 + u16(3);
  codec.chunk = 1 + u16(3);
  codec.topk = 1 + u16(5);
  const int bits[] = {2, 4, 8, data[7]};
  codec.value_bits = bits[data[7] % 4];
  auto in = std::as_bytes(std::span(data + 8, size - 8));
  try {
    const size_t need = wire::encoded_bytes(codec, n);
    if (in.size() > need) in = in.first(need);
    // An empty vector's data() is null: decode() of 0 values must not pass it to memcpy
    // (found here: UBSan "null pointer passed as argument 1"; the 8 zero bytes are a seed).
    std::vector<float> buffer(n);
    const std::span<float> out(buffer.data(), n);
    wire::decode(codec, in, out);
    for (size_t i = 0; i < n; ++i)
      if (!std::isfinite(out[i])) {
        std::fprintf(stderr, "fuzz_wire_format: %s decoded a non-finite value at %zu\n",
                     wire::format_name(codec.format), i);
        std::abort();
      }
  } catch (const Error&) {
  }
  return 0;
}
