#include "ddiloco/wire_format.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>

#include "ddiloco/error.hpp"

namespace ddiloco::wire {

namespace {

constexpr size_t kMaxChunk = size_t{1} << 24;

uint16_t to_bf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  // Round to nearest, ties to even: add 0x7FFF plus the lowest kept bit, then truncate.
  const uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

float from_bf16(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

void check_finite(std::span<const float> values) {
  for (size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i]))
      fail("wire encode: value {} is {} (only finite values can be sent)", i, values[i]);
}

void check_size(size_t have, size_t want, const char* what, Format format) {
  if (have != want) fail("wire {} ({}): {} bytes, expected {}", what, format_name(format), have, want);
}

// ---- block formats (int8, int4, int2): codes of `bits` bits, 8 / bits to a byte, lowest first.

struct Levels {
  int Q;       // codes q ∈ [−Q, Q]
  int bits;    // per code
  int offset;  // stored as q + offset (int8: as a two's-complement byte)
};

Levels block_levels(Format f) {
  switch (f) {
    case Format::int8: return {127, 8, 0};
    case Format::int4: return {7, 4, 8};
    default: return {1, 2, 1};  // int2
  }
}

bool is_block(Format f) { return f == Format::int8 || f == Format::int4 || f == Format::int2; }

void put_code(unsigned char* codes, size_t i, int q, const Levels& l) {
  const size_t per = static_cast<size_t>(8 / l.bits);
  const auto stored = static_cast<unsigned char>(q + l.offset);  // int8: q mod 256
  codes[i / per] |= static_cast<unsigned char>(stored << (l.bits * static_cast<int>(i % per)));
}

int get_code(const unsigned char* codes, size_t i, const Levels& l) {
  const size_t per = static_cast<size_t>(8 / l.bits);
  const int stored = (codes[i / per] >> (l.bits * static_cast<int>(i % per))) & ((1 << l.bits) - 1);
  return l.bits == 8 ? static_cast<int8_t>(stored) : stored - l.offset;
}

// The scales of all blocks first, then the codes (so that packed codes pair values across
// block boundaries without padding).
void encode_blocks(const Codec& c, std::span<const float> values, unsigned char* bytes) {
  const Levels l = block_levels(c.format);
  const size_t n = values.size(), blocks = (n + c.block - 1) / c.block;
  unsigned char* codes = bytes + blocks * sizeof(float);
  std::memset(codes, 0, (n * static_cast<size_t>(l.bits) + 7) / 8);
  for (size_t b = 0; b < blocks; ++b) {
    const size_t lo = b * c.block, hi = std::min(n, lo + c.block);
    float a = 0;
    for (size_t i = lo; i < hi; ++i) a = std::max(a, std::fabs(values[i]));
    std::memcpy(bytes + b * sizeof(float), &a, sizeof(float));
    for (size_t i = lo; i < hi; ++i) {
      const int q = a == 0 ? 0 : static_cast<int>(std::lround(values[i] / a * static_cast<float>(l.Q)));
      put_code(codes, i, std::clamp(q, -l.Q, l.Q), l);
    }
  }
}

void decode_blocks(const Codec& c, const unsigned char* bytes, std::span<float> out) {
  const Levels l = block_levels(c.format);
  const size_t n = out.size(), blocks = (n + c.block - 1) / c.block;
  const unsigned char* codes = bytes + blocks * sizeof(float);
  for (size_t b = 0; b < blocks; ++b) {
    float a;
    std::memcpy(&a, bytes + b * sizeof(float), sizeof(float));
    if (!std::isfinite(a) || a < 0) fail("wire decode: block {} has scale {}", b, a);
    const size_t lo = b * c.block, hi = std::min(n, lo + c.block);
    for (size_t i = lo; i < hi; ++i) {
      const int q = get_code(codes, i, l);
      if (q < -l.Q || q > l.Q) fail("wire decode: value {} has code {} outside ±{}", i, q, l.Q);
      out[i] = static_cast<float>(q) / static_cast<float>(l.Q) * a;
    }
  }
}

// ---- sparse (arXiv 2508.15706): per chunk a scale, then k indices and k codes, bit-packed.

// Bit fields of up to 32 bits, least significant bit first from bit 0 of byte 0. The writer
// ORs into bytes the caller zeroed.
class BitWriter {
 public:
  explicit BitWriter(unsigned char* bytes) : bytes_(bytes) {}
  void put(uint32_t value, int bits) {
    for (int b = 0; b < bits; ++b, ++at_)
      if ((value >> b) & 1u) bytes_[at_ / 8] |= static_cast<unsigned char>(1u << (at_ % 8));
  }

 private:
  unsigned char* bytes_;
  size_t at_ = 0;
};

class BitReader {
 public:
  BitReader(const unsigned char* bytes, size_t at_bit) : bytes_(bytes), at_(at_bit) {}
  uint32_t get(int bits) {
    uint32_t value = 0;
    for (int b = 0; b < bits; ++b, ++at_)
      value |= static_cast<uint32_t>((bytes_[at_ / 8] >> (at_ % 8)) & 1u) << b;
    return value;
  }

 private:
  const unsigned char* bytes_;
  size_t at_;
};

// ⌈log2 chunk⌉, at least 1: enough bits for every index of a full chunk.
int index_bits(size_t chunk) { return std::max(1, static_cast<int>(std::bit_width(chunk - 1))); }

// A sparse chunk's header: the smallest and the largest kept magnitude.
constexpr size_t kSparseHeader = 2 * sizeof(float);

// Bytes of one chunk of `len` values.
size_t sparse_chunk_bytes(const Codec& c, size_t len) {
  const size_t k = std::min(c.topk, len);
  return kSparseHeader + (k * static_cast<size_t>(index_bits(c.chunk) + c.value_bits) + 7) / 8;
}

size_t sparse_bytes(const Codec& c, size_t n) {
  const size_t full = n / c.chunk, rest = n % c.chunk;
  return full * sparse_chunk_bytes(c, c.chunk) + (rest > 0 ? sparse_chunk_bytes(c, rest) : 0);
}

// The indices of the k largest |x| (ties: the lower index), ascending, in order[0, k).
void top_k(std::span<const float> x, size_t k, std::vector<uint32_t>& order) {
  order.resize(x.size());
  std::iota(order.begin(), order.end(), uint32_t{0});
  if (k < x.size()) {
    std::nth_element(order.begin(), order.begin() + static_cast<ptrdiff_t>(k), order.end(),
                     [&](uint32_t i, uint32_t j) {
                       const float ai = std::fabs(x[i]), aj = std::fabs(x[j]);
                       return ai > aj || (ai == aj && i < j);
                     });
    order.resize(k);
    std::sort(order.begin(), order.end());
  }
}

// Magnitude level j of L = 2^(b−1) between lo and hi. Written as an interpolation so that
// j = 0 gives lo and j = L − 1 gives hi exactly.
float sparse_magnitude(float lo, float hi, uint32_t j, int bits) {
  const uint32_t top = (1u << (bits - 1)) - 1;
  if (top == 0 || j == 0) return lo;
  if (j == top) return hi;
  const float t = static_cast<float>(j) / static_cast<float>(top);
  return lo * (1.0f - t) + hi * t;
}

// Code of x: its sign in the top bit, below it the nearest of the L magnitude levels.
uint32_t sparse_code(float x, float lo, float hi, int bits) {
  const uint32_t top = (1u << (bits - 1)) - 1;
  const float t = hi > lo ? (std::fabs(x) - lo) / (hi - lo) : 0.0f;
  const auto j = static_cast<uint32_t>(std::clamp(std::lround(t * static_cast<float>(top)), 0L, static_cast<long>(top)));
  return (std::signbit(x) ? 1u << (bits - 1) : 0u) | j;
}

// One chunk into `out` (sparse_chunk_bytes(c, x.size()) bytes, zeroed).
void encode_sparse_chunk(const Codec& c, std::span<const float> x, std::vector<uint32_t>& order,
                         unsigned char* out) {
  const size_t k = std::min(c.topk, x.size());
  top_k(x, k, order);
  float lo = k > 0 ? INFINITY : 0.0f, hi = 0;
  for (size_t j = 0; j < k; ++j) {
    lo = std::min(lo, std::fabs(x[order[j]]));
    hi = std::max(hi, std::fabs(x[order[j]]));
  }
  std::memcpy(out, &lo, sizeof(float));
  std::memcpy(out + sizeof(float), &hi, sizeof(float));
  BitWriter bits(out + kSparseHeader);
  const int ib = index_bits(c.chunk);
  for (size_t j = 0; j < k; ++j) bits.put(order[j], ib);
  for (size_t j = 0; j < k; ++j) bits.put(sparse_code(x[order[j]], lo, hi, c.value_bits), c.value_bits);
}

void encode_sparse(const Codec& c, std::span<const float> values, unsigned char* bytes, size_t size) {
  std::memset(bytes, 0, size);
  std::vector<uint32_t> order;
  for (size_t lo = 0; lo < values.size(); lo += c.chunk) {
    const std::span<const float> x = values.subspan(lo, std::min(c.chunk, values.size() - lo));
    encode_sparse_chunk(c, x, order, bytes);
    bytes += sparse_chunk_bytes(c, x.size());
  }
}

// Chunk `chunk_no` from `in` (its sparse_chunk_bytes(c, out.size()) bytes) into `out`,
// refusing what the encoder cannot have written.
void decode_sparse_chunk(const Codec& c, const unsigned char* in, size_t chunk_no, std::span<float> out) {
  float lo, hi;
  std::memcpy(&lo, in, sizeof(float));
  std::memcpy(&hi, in + sizeof(float), sizeof(float));
  if (!std::isfinite(lo) || !std::isfinite(hi) || !(lo >= 0) || !(lo <= hi))
    fail("wire decode (sparse): chunk {} has magnitudes [{}, {}], expected finite 0 ≤ smallest ≤ largest",
         chunk_no, lo, hi);
  std::fill(out.begin(), out.end(), 0.0f);
  const size_t k = std::min(c.topk, out.size());
  const int ib = index_bits(c.chunk);
  BitReader indices(in + kSparseHeader, 0), codes(in + kSparseHeader, k * static_cast<size_t>(ib));
  int64_t previous = -1;
  for (size_t j = 0; j < k; ++j) {
    const uint32_t i = indices.get(ib);
    if (i >= out.size())
      fail("wire decode (sparse): chunk {}: index {} (kept value {}) is beyond its {} values", chunk_no, i, j,
           out.size());
    if (static_cast<int64_t>(i) <= previous)
      fail("wire decode (sparse): chunk {}: index {} (kept value {}) does not follow {} (indices must ascend)",
           chunk_no, i, j, previous);
    previous = i;
    const uint32_t code = codes.get(c.value_bits), sign = 1u << (c.value_bits - 1);
    const float m = sparse_magnitude(lo, hi, code & (sign - 1), c.value_bits);
    out[i] = (code & sign) ? -m : m;
  }
}

void decode_sparse(const Codec& c, const unsigned char* bytes, std::span<float> out) {
  for (size_t lo = 0, chunk_no = 0; lo < out.size(); lo += c.chunk, ++chunk_no) {
    const std::span<float> x = out.subspan(lo, std::min(c.chunk, out.size() - lo));
    decode_sparse_chunk(c, bytes, chunk_no, x);
    bytes += sparse_chunk_bytes(c, x.size());
  }
}

}  // namespace

Format parse_format(const std::string& name) {
  for (Format f : {Format::fp32, Format::bf16, Format::int8, Format::int4, Format::int2, Format::sparse})
    if (name == format_name(f)) return f;
  fail("wire format '{}': expected fp32, bf16, int8, int4, int2 or sparse", name);
}

const char* format_name(Format format) {
  switch (format) {
    case Format::fp32: return "fp32";
    case Format::bf16: return "bf16";
    case Format::int8: return "int8";
    case Format::int4: return "int4";
    case Format::int2: return "int2";
    case Format::sparse: return "sparse";
  }
  return "?";
}

void check(const Codec& c) {
  if (is_block(c.format) && c.block == 0) fail("wire: block size must be ≥ 1");
  if (c.format != Format::sparse) return;
  if (c.chunk == 0 || c.chunk > kMaxChunk)
    fail("wire (sparse): chunk must be in [1, {}], got {}", kMaxChunk, c.chunk);
  if (c.topk == 0) fail("wire (sparse): topk must be ≥ 1");
  if (c.value_bits != 2 && c.value_bits != 4 && c.value_bits != 8)
    fail("wire (sparse): value_bits must be 2, 4 or 8, got {}", c.value_bits);
}

size_t encoded_bytes(const Codec& c, size_t n) {
  check(c);
  switch (c.format) {
    case Format::fp32: return n * 4;
    case Format::bf16: return n * 2;
    case Format::sparse: return sparse_bytes(c, n);
    default: break;
  }
  const size_t scales = (n + c.block - 1) / c.block * sizeof(float);
  return scales + (n * static_cast<size_t>(block_levels(c.format).bits) + 7) / 8;
}

void encode(const Codec& c, std::span<const float> values, std::span<std::byte> out) {
  check_size(out.size(), encoded_bytes(c, values.size()), "encode", c.format);
  check_finite(values);
  auto* bytes = reinterpret_cast<unsigned char*>(out.data());
  const size_t n = values.size();
  if (c.format == Format::fp32) {
    std::memcpy(bytes, values.data(), n * 4);
  } else if (c.format == Format::bf16) {
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = to_bf16(values[i]);
      if (!std::isfinite(from_bf16(h)))
        fail("wire encode: value {} = {} is beyond bf16's range", i, values[i]);
      std::memcpy(bytes + 2 * i, &h, 2);
    }
  } else if (c.format == Format::sparse) {
    encode_sparse(c, values, bytes, out.size());
  } else {
    encode_blocks(c, values, bytes);
  }
}

std::vector<std::byte> encode(const Codec& c, std::span<const float> values) {
  std::vector<std::byte> out(encoded_bytes(c, values.size()));
  encode(c, values, out);
  return out;
}

void decode(const Codec& c, std::span<const std::byte> in, std::span<float> out) {
  check_size(in.size(), encoded_bytes(c, out.size()), "decode", c.format);
  const auto* bytes = reinterpret_cast<const unsigned char*>(in.data());
  const size_t n = out.size();
  if (c.format == Format::fp32) {
    if (n > 0) std::memcpy(out.data(), bytes, n * 4);  // an empty span's data() may be null
    check_finite(out);
  } else if (c.format == Format::bf16) {
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, bytes + 2 * i, 2);
      out[i] = from_bf16(h);
    }
    check_finite(out);
  } else if (c.format == Format::sparse) {
    decode_sparse(c, bytes, out);
  } else {
    decode_blocks(c, bytes, out);
  }
}

}  // namespace ddiloco::wire
