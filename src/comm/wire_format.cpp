#include "ddiloco/wire_format.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "ddiloco/error.hpp"

namespace ddiloco::wire {

namespace {

uint16_t to_bf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  // Round to nearest, ties to even: add 0x7FFF plus the lowest kept bit, then truncate.
  const uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

float from_bf16(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

int levels(Format f) { return f == Format::int8 ? 127 : 7; }

void check_finite(std::span<const float> values) {
  for (size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i]))
      fail("wire encode: value {} is {} (only finite values can be sent)", i, values[i]);
}

void check_size(size_t have, size_t want, const char* what) {
  if (have != want) fail("wire {}: {} bytes, expected {}", what, have, want);
}

}  // namespace

Format parse_format(const std::string& name) {
  if (name == "fp32") return Format::fp32;
  if (name == "bf16") return Format::bf16;
  if (name == "int8") return Format::int8;
  if (name == "int4") return Format::int4;
  fail("wire format '{}': expected fp32, bf16, int8 or int4", name);
}

const char* format_name(Format format) {
  switch (format) {
    case Format::fp32: return "fp32";
    case Format::bf16: return "bf16";
    case Format::int8: return "int8";
    case Format::int4: return "int4";
  }
  return "?";
}

size_t encoded_bytes(Format format, size_t n, size_t block) {
  if (block == 0) fail("wire: block size must be ≥ 1");
  const size_t scales = (n + block - 1) / block * sizeof(float);
  switch (format) {
    case Format::fp32: return n * 4;
    case Format::bf16: return n * 2;
    case Format::int8: return scales + n;
    case Format::int4: return scales + (n + 1) / 2;
  }
  return 0;
}

void encode(Format format, std::span<const float> values, size_t block, std::span<std::byte> out) {
  check_size(out.size(), encoded_bytes(format, values.size(), block), "encode");
  check_finite(values);
  auto* bytes = reinterpret_cast<unsigned char*>(out.data());
  const size_t n = values.size();
  if (format == Format::fp32) {
    std::memcpy(bytes, values.data(), n * 4);
    return;
  }
  if (format == Format::bf16) {
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = to_bf16(values[i]);
      if (!std::isfinite(from_bf16(h)))
        fail("wire encode: value {} = {} is beyond bf16's range", i, values[i]);
      std::memcpy(bytes + 2 * i, &h, 2);
    }
    return;
  }
  // Block layout: the scales of all blocks first, then the codes (so that int4 nibbles pair
  // values across block boundaries without padding).
  const float Q = static_cast<float>(levels(format));
  const size_t blocks = (n + block - 1) / block;
  unsigned char* codes = bytes + blocks * sizeof(float);
  if (format == Format::int4) std::memset(codes, 0, (n + 1) / 2);
  for (size_t b = 0; b < blocks; ++b) {
    const size_t lo = b * block, hi = std::min(n, lo + block);
    float a = 0;
    for (size_t i = lo; i < hi; ++i) a = std::max(a, std::fabs(values[i]));
    std::memcpy(bytes + b * sizeof(float), &a, sizeof(float));
    for (size_t i = lo; i < hi; ++i) {
      const int q = a == 0 ? 0 : static_cast<int>(std::lround(values[i] / a * Q));
      const int clamped = std::clamp(q, -levels(format), levels(format));
      if (format == Format::int8)
        codes[i] = static_cast<unsigned char>(static_cast<int8_t>(clamped));
      else
        codes[i / 2] |= static_cast<unsigned char>((clamped + 8) << (4 * (i % 2)));
    }
  }
}

std::vector<std::byte> encode(Format format, std::span<const float> values, size_t block) {
  std::vector<std::byte> out(encoded_bytes(format, values.size(), block));
  encode(format, values, block, out);
  return out;
}

void decode(Format format, std::span<const std::byte> in, size_t block, std::span<float> out) {
  check_size(in.size(), encoded_bytes(format, out.size(), block), "decode");
  const auto* bytes = reinterpret_cast<const unsigned char*>(in.data());
  const size_t n = out.size();
  if (format == Format::fp32) {
    std::memcpy(out.data(), bytes, n * 4);
    check_finite(out);
    return;
  }
  if (format == Format::bf16) {
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, bytes + 2 * i, 2);
      out[i] = from_bf16(h);
    }
    check_finite(out);
    return;
  }
  const int Q = levels(format);
  const size_t blocks = (n + block - 1) / block;
  const unsigned char* codes = bytes + blocks * sizeof(float);
  for (size_t b = 0; b < blocks; ++b) {
    float a;
    std::memcpy(&a, bytes + b * sizeof(float), sizeof(float));
    if (!std::isfinite(a) || a < 0) fail("wire decode: block {} has scale {}", b, a);
    const size_t lo = b * block, hi = std::min(n, lo + block);
    for (size_t i = lo; i < hi; ++i) {
      const int q = format == Format::int8 ? static_cast<int8_t>(codes[i])
                                           : ((codes[i / 2] >> (4 * (i % 2))) & 0xF) - 8;
      if (q < -Q || q > Q) fail("wire decode: value {} has code {} outside ±{}", i, q, Q);
      out[i] = static_cast<float>(q) / static_cast<float>(Q) * a;
    }
  }
}

}  // namespace ddiloco::wire
