// Wire formats: sizes, round trips within each format's error bound, exact zeros, constants and
// block extremes, ties to even in bf16, the bit layouts of int2 and sparse, sparse's top-k
// selection, and refusal of non-finite or malformed input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <tuple>

#include "ddiloco/error.hpp"
#include "ddiloco/rng.hpp"
#include "ddiloco/wire_format.hpp"

namespace ddiloco::wire {
namespace {

Codec blocks(Format f, size_t block) { return {.format = f, .block = block}; }

Codec sparse(size_t chunk, size_t topk, int bits) {
  return {.format = Format::sparse, .chunk = chunk, .topk = topk, .value_bits = bits};
}

std::vector<float> round_trip(const Codec& c, const std::vector<float>& x) {
  const std::vector<std::byte> bytes = encode(c, x);
  EXPECT_EQ(bytes.size(), encoded_bytes(c, x.size()));
  std::vector<float> y(x.size());
  decode(c, bytes, y);
  return y;
}

std::vector<float> randn(size_t n, uint64_t seed, float scale) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * static_cast<float>(rng.normal());
  return v;
}

// Overwrites `bits` bits at bit `at` of the bit fields after a chunk's scale (least significant
// bit first), as the format lays them out.
void put_bits(std::vector<std::byte>& bytes, size_t chunk_offset, size_t at, uint32_t value, int bits) {
  auto* b = reinterpret_cast<unsigned char*>(bytes.data() + chunk_offset + 2 * sizeof(float));
  for (int i = 0; i < bits; ++i, ++at) {
    const auto mask = static_cast<unsigned char>(1u << (at % 8));
    b[at / 8] = static_cast<unsigned char>(((value >> i) & 1u) ? b[at / 8] | mask : b[at / 8] & ~mask);
  }
}

void expect_refused(const Codec& c, const std::vector<std::byte>& bytes, size_t n, const std::string& what) {
  std::vector<float> out(n);
  try {
    decode(c, bytes, out);
    ADD_FAILURE() << "accepted; expected an error naming '" << what << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

// Found by fuzz/wire_format.cpp: decode() of zero values passed an empty span's data(), null,
// to memcpy (undefined; UBSan reports it, so this fails under the asan preset without the fix).
TEST(WireFormat, DecodeOfZeroValuesIntoAnEmptySpan) {
  for (const Format f : {Format::fp32, Format::bf16, Format::int8}) {
    const Codec c = blocks(f, 64);
    const std::vector<std::byte> in(encoded_bytes(c, 0));
    std::vector<float> none;
    EXPECT_NO_THROW(decode(c, in, std::span<float>(none.data(), 0))) << format_name(f);
  }
}

TEST(WireFormat, SizesPerFormat) {
  EXPECT_EQ(encoded_bytes(blocks(Format::fp32, 64), 100), 400u);
  EXPECT_EQ(encoded_bytes(blocks(Format::bf16, 64), 100), 200u);
  EXPECT_EQ(encoded_bytes(blocks(Format::int8, 64), 100), 2 * 4 + 100u);
  EXPECT_EQ(encoded_bytes(blocks(Format::int4, 64), 101), 2 * 4 + 51u);
  EXPECT_EQ(encoded_bytes(blocks(Format::int4, 64), 0), 0u);
  EXPECT_EQ(encoded_bytes(blocks(Format::int2, 64), 101), 2 * 4 + 26u);  // ⌈101 / 4⌉
  EXPECT_EQ(encoded_bytes(blocks(Format::int2, 64), 100), 2 * 4 + 25u);
  EXPECT_EQ(encoded_bytes(blocks(Format::int2, 1), 3), 3 * 4 + 1u);
  EXPECT_EQ(encoded_bytes(blocks(Format::int2, 7), 0), 0u);
  EXPECT_THROW(encoded_bytes(blocks(Format::int8, 0), 10), Error);
  EXPECT_THROW(encoded_bytes(blocks(Format::int2, 0), 10), Error);
  for (Format f : {Format::fp32, Format::bf16, Format::int8, Format::int4, Format::int2, Format::sparse})
    EXPECT_EQ(parse_format(format_name(f)), f);
  EXPECT_EQ(parse_format("int2"), Format::int2);
  EXPECT_STREQ(format_name(Format::sparse), "sparse");
  EXPECT_THROW(parse_format("fp8"), Error);
}

// 4 + ⌈k·(⌈log2 chunk⌉ + b) / 8⌉ bytes per chunk, k = min(topk, chunk length); numbers worked
// out by hand.
TEST(WireFormat, SparseSizes) {
  EXPECT_EQ(encoded_bytes(Codec{.format = Format::sparse}, 4096), 120u);  // 8 + 64·(12 + 2) = 896 bits
  EXPECT_NEAR(116.0 * 8 / 4096, 0.227, 0.001);  // the defaults' bits per value, as documented
  EXPECT_EQ(encoded_bytes(sparse(4096, 64, 2), 10000), 3 * 120u);  // the last chunk: 1808 ≥ 64
  EXPECT_EQ(encoded_bytes(sparse(4096, 64, 2), 100), 120u);        // one short chunk, k = 64
  EXPECT_EQ(encoded_bytes(sparse(4096, 64, 2), 30), 8 + 53u);      // k = 30: 420 bits
  EXPECT_EQ(encoded_bytes(sparse(1000, 3, 4), 2500), 3 * 14u);     // 3·(10 + 4) = 42 bits → 6
  EXPECT_EQ(encoded_bytes(sparse(1000, 3, 8), 2001), 2 * 15u + 8 + 3);  // 3·18 = 54 → 7; k = 1: 18 → 3
  EXPECT_EQ(encoded_bytes(sparse(1, 1, 8), 5), 5 * 10u);           // 1-bit indices: 9 bits → 2
  EXPECT_EQ(encoded_bytes(sparse(3, 5, 2), 7), 2 * (8 + 2u) + 8 + 1);  // topk > chunk: k = 3, 12 bits; k = 1
  EXPECT_EQ(encoded_bytes(sparse(5, 5, 2), 5), 8 + 4u);            // 3-bit indices: 25 bits → 4
  EXPECT_EQ(encoded_bytes(sparse(1 << 24, 1, 2), 1), 8 + 4u);      // 24-bit indices: 26 bits
  EXPECT_EQ(encoded_bytes(sparse(64, 4, 2), 0), 0u);
  EXPECT_THROW(encoded_bytes(sparse(0, 1, 2), 10), Error);
  EXPECT_THROW(encoded_bytes(sparse((1 << 24) + 1, 1, 2), 10), Error);
  EXPECT_THROW(encoded_bytes(sparse(64, 0, 2), 10), Error);
  EXPECT_THROW(encoded_bytes(sparse(64, 4, 3), 10), Error);
  EXPECT_THROW(encoded_bytes(sparse(64, 4, 16), 10), Error);
}

TEST(WireFormat, Fp32IsExactAndBf16RoundsToNearestEven) {
  const std::vector<float> x = randn(257, 1, 3.0f);
  EXPECT_EQ(round_trip(blocks(Format::fp32, 64), x), x);
  const std::vector<float> y = round_trip(blocks(Format::bf16, 64), x);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_LE(std::fabs(y[i] - x[i]), std::ldexp(std::fabs(x[i]), -8)) << i;
  // bf16 keeps 7 mantissa bits: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 (even: 1), and
  // 1 + 3·2^-8 one between 1 + 2^-7 and 1 + 2^-6 (even: 1 + 2^-6).
  const std::vector<float> ties = {1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -2.5f, 0.0f};
  const std::vector<float> want = {1.0f, 1.0f, 1.0f + 0x1p-6f, -2.5f, 0.0f};
  EXPECT_EQ(round_trip(blocks(Format::bf16, 64), ties), want);
  EXPECT_THROW(encode(blocks(Format::bf16, 64), std::vector<float>{FLT_MAX}), Error);
}

TEST(WireFormat, BlockQuantizationWithinHalfAStepOfEachBlocksMaximum) {
  for (Format f : {Format::int8, Format::int4, Format::int2}) {
    const float Q = f == Format::int8 ? 127.0f : f == Format::int4 ? 7.0f : 1.0f;
    for (size_t block : {1u, 7u, 64u, 1000u}) {
      const std::vector<float> x = randn(333, 7 + block, 0.01f);
      const std::vector<float> y = round_trip(blocks(f, block), x);
      for (size_t lo = 0; lo < x.size(); lo += block) {
        const size_t hi = std::min(x.size(), lo + block);
        float a = 0;
        for (size_t i = lo; i < hi; ++i) a = std::max(a, std::fabs(x[i]));
        for (size_t i = lo; i < hi; ++i) {
          EXPECT_LE(std::fabs(y[i] - x[i]), a / (2 * Q) * 1.0001f) << format_name(f) << " " << i;
          if (std::fabs(x[i]) == a) {
            EXPECT_EQ(y[i], x[i]);  // the extreme comes back exactly
          }
        }
      }
    }
  }
}

TEST(WireFormat, ZerosAndConstantsAreExact) {
  for (Format f : {Format::bf16, Format::int8, Format::int4, Format::int2}) {
    const std::vector<float> zeros(130, 0.0f), constant(131, -0.0371f), positive(5, 3.25f);
    EXPECT_EQ(round_trip(blocks(f, 64), zeros), zeros) << format_name(f);
    if (f != Format::bf16) {  // bf16 rounds −0.0371 itself
      EXPECT_EQ(round_trip(blocks(f, 64), constant), constant) << format_name(f);
    }
    EXPECT_EQ(round_trip(blocks(f, 2), positive), positive) << format_name(f);
  }
}

// int2: the block's scale, then q + 1 in two bits, value 4i in the lowest; values in {0, ±a}
// come back exactly, and a half-step rounds away from zero (std::lround).
TEST(WireFormat, Int2LayoutAndExactValues) {
  const std::vector<float> x = {0.5f, 0.0f, -0.5f, 0.5f, -0.5f, 0.2f, -0.25f, 0.26f};
  const std::vector<std::byte> bytes = encode(blocks(Format::int2, 64), x);
  ASSERT_EQ(bytes.size(), 4u + 2u);
  float a;
  std::memcpy(&a, bytes.data(), 4);
  EXPECT_EQ(a, 0.5f);
  // q + 1 = 2, 1, 0, 2 | 0, 1, 0, 2 (−0.25 / 0.5 = −0.5 rounds to −1; 0.26 to 1).
  EXPECT_EQ(std::to_integer<int>(bytes[4]), 2 | 1 << 2 | 0 << 4 | 2 << 6);
  EXPECT_EQ(std::to_integer<int>(bytes[5]), 0 | 1 << 2 | 0 << 4 | 2 << 6);
  std::vector<float> y(x.size());
  decode(blocks(Format::int2, 64), bytes, y);
  const std::vector<float> want = {0.5f, 0.0f, -0.5f, 0.5f, -0.5f, 0.0f, -0.5f, 0.5f};
  EXPECT_EQ(y, want);
  const std::vector<float> ternary = {1.5f, -1.5f, 0.0f, 0.0f, 0.75f, -0.75f, 0.0f, 0.75f, -2.0f};
  EXPECT_EQ(round_trip(blocks(Format::int2, 4), ternary), ternary);  // blocks {±1.5}, {±0.75}, {−2}
}

// Sparse's layout, worked out by hand: chunk 8 (3-bit indices), top 2, 2-bit values (a sign bit
// above one magnitude bit: the smallest or the largest kept magnitude).
TEST(WireFormat, SparseLayout) {
  const std::vector<float> x = {0.0f, 0.5f, 3.0f, 0.0f, 0.0f, -1.0f, 0.0f, 1.0f};
  const std::vector<std::byte> bytes = encode(sparse(8, 2, 2), x);
  ASSERT_EQ(bytes.size(), 8u + 2u);  // 2·(3 + 2) = 10 bits
  float lo, hi;
  std::memcpy(&lo, bytes.data(), 4);
  std::memcpy(&hi, bytes.data() + 4, 4);
  EXPECT_EQ(lo, 1.0f);  // −1 at 5 and 1 at 7 tie: the lower index is kept
  EXPECT_EQ(hi, 3.0f);
  // Indices 2 = 010, 5 = 101 (bits 0–5, lowest first), then 3 → code 01 (+, largest) at bits
  // 6–7 and −1 → code 10 (−, smallest) at bits 8–9.
  EXPECT_EQ(std::to_integer<int>(bytes[8]), 0b01101010);
  EXPECT_EQ(std::to_integer<int>(bytes[9]), 0b10);
  std::vector<float> y(x.size());
  decode(sparse(8, 2, 2), bytes, y);
  const std::vector<float> want = {0.0f, 0.0f, 3.0f, 0.0f, 0.0f, -1.0f, 0.0f, 0.0f};
  EXPECT_EQ(y, want);
}

// The chunk's k largest magnitudes by an independent selection, ascending: a stable sort by
// magnitude keeps the lower index first among equal ones.
std::vector<size_t> largest(std::span<const float> x, size_t k) {
  std::vector<size_t> order(x.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t i, size_t j) { return std::fabs(x[i]) > std::fabs(x[j]); });
  order.resize(std::min(k, x.size()));
  std::sort(order.begin(), order.end());
  return order;
}

// The k indices of the chunk at byte `offset`, read from its bit fields ((index_bits)-bit each,
// least significant bit first after the two magnitudes).
std::vector<size_t> indices_in(const std::vector<std::byte>& bytes, size_t offset, size_t k, int index_bits) {
  std::vector<size_t> out;
  for (size_t j = 0, at = 0; j < k; ++j) {
    size_t index = 0;
    for (int b = 0; b < index_bits; ++b, ++at)
      index |= static_cast<size_t>((std::to_integer<unsigned>(bytes[offset + 8 + at / 8]) >> (at % 8)) & 1u) << b;
    out.push_back(index);
  }
  return out;
}

// Each chunk keeps its k largest magnitudes (ties: the lower index; read back from the bytes);
// kept values come back with their sign and within (hi − lo) / (2·(2^(b−1) − 1)) of themselves,
// the smallest and the largest exactly; dropped ones come back as 0, and none of them exceeds
// the smallest kept one.
TEST(WireFormat, SparseKeepsTheLargestWithinHalfAStep) {
  for (int bits : {2, 4, 8}) {
    const float steps = static_cast<float>((1 << (bits - 1)) - 1);
    for (auto [chunk, topk, ib] : {std::tuple<size_t, size_t, int>{64, 4, 6}, {100, 7, 7}, {7, 7, 3}, {16, 20, 4},
                                   {1, 1, 1}}) {
      const Codec c = sparse(chunk, topk, bits);
      std::vector<float> x = randn(1000, 3 + chunk, 0.01f);
      for (size_t i = 0; i < x.size(); i += 3) x[i] = std::round(x[i] * 300) / 300;  // ties, zeros
      const std::vector<std::byte> bytes = encode(c, x);
      std::vector<float> y(x.size());
      decode(c, bytes, y);
      for (size_t lo = 0, offset = 0; lo < x.size(); lo += chunk) {
        const std::span<const float> xs(x.data() + lo, std::min(chunk, x.size() - lo));
        const size_t k = std::min(topk, xs.size());
        const std::vector<size_t> kept = indices_in(bytes, offset, k, ib);
        ASSERT_EQ(kept, largest(xs, k)) << "bits " << bits << " chunk " << chunk << " at " << lo;
        offset += 8 + (k * static_cast<size_t>(ib + bits) + 7) / 8;
        float a = 0, smallest = INFINITY;
        for (size_t i : kept) a = std::max(a, std::fabs(xs[i])), smallest = std::min(smallest, std::fabs(xs[i]));
        std::vector<bool> is_kept(xs.size(), false);
        for (size_t i : kept) is_kept[i] = true;
        for (size_t i = 0; i < xs.size(); ++i) {
          const float xi = xs[i], yi = y[lo + i];
          if (!is_kept[i]) {
            EXPECT_EQ(yi, 0.0f) << "bits " << bits << " chunk " << chunk << " value " << lo + i << " is not kept";
            EXPECT_LE(std::fabs(xi), smallest);
            continue;
          }
          EXPECT_LE(std::fabs(yi - xi), (a - smallest) / (2 * steps) * 1.0001f + a * 1e-6f)
              << bits << " " << chunk << " " << lo + i;
          EXPECT_EQ(std::signbit(yi), std::signbit(xi)) << bits << " " << chunk << " " << lo + i;
          if (std::fabs(xi) == a || std::fabs(xi) == smallest) {
            EXPECT_EQ(yi, xi) << "the chunk's largest and smallest kept values come back exactly";
          }
        }
      }
    }
  }
}

TEST(WireFormat, SparseTiesGoToTheLowerIndex) {
  const std::vector<float> x = {1.0f, -1.0f, 0.5f, 1.0f, -1.0f, 1.0f, 0.0f, -1.0f, 1.0f, 1.0f};
  const std::vector<float> y = round_trip(sparse(5, 3, 8), x);
  // Chunk [0, 5): ±1 at 0, 1, 3, 4: keeps 0, 1, 3. Chunk [5, 10): ±1 at 5, 7, 8, 9: keeps 5, 7, 8.
  const std::vector<float> want = {1.0f, -1.0f, 0.0f, 1.0f, 0.0f, 1.0f, 0.0f, -1.0f, 1.0f, 0.0f};
  EXPECT_EQ(y, want);
  EXPECT_EQ(encode(sparse(5, 3, 8), x), encode(sparse(5, 3, 8), x)) << "deterministic";
}

// Exact: at most k − 1 nonzeros per chunk (so a zero is kept and lo = 0), each (j / L)·hi with
// L = 2^(b−1) − 1 and the chunk's largest at ±hi; zero chunks and a short last chunk included.
// With 2 bits, also: exactly k nonzeros of two magnitudes.
TEST(WireFormat, SparseRoundTripIsExactForKSparseGridValues) {
  Rng rng(11);
  for (int bits : {2, 4, 8}) {
    const int L = (1 << (bits - 1)) - 1;
    for (auto [chunk, topk] : {std::pair<size_t, size_t>{64, 5}, {33, 33}, {10, 3}, {4096, 64}}) {
      std::vector<float> x(3 * chunk + chunk / 2 + 1, 0.0f);
      for (size_t lo = 0; lo < x.size(); lo += chunk) {
        if (lo == chunk) continue;  // the second chunk stays zero
        const size_t len = std::min(chunk, x.size() - lo), k = std::min(topk, len);
        const float hi = 0.001f * static_cast<float>(1 + rng.below(1000));
        for (size_t j = 0; j + 2 < k; ++j) {  // k − 2 values on the grid, somewhere before the last
          const float t = static_cast<float>(rng.below(static_cast<uint64_t>(L) + 1)) / static_cast<float>(L);
          x[lo + rng.below(len - 1)] = (rng.below(2) ? -1.0f : 1.0f) * (hi * t);
        }
        x[lo + len - 1] = -hi;  // the largest
      }
      EXPECT_EQ(round_trip(sparse(chunk, topk, bits), x), x) << "bits " << bits << " chunk " << chunk;
    }
  }
  const std::vector<float> two = {0.25f, 0.0f, -2.0f, -0.25f, 0.0f, 2.0f, 0.25f, 0.0f};
  EXPECT_EQ(round_trip(sparse(8, 5, 2), two), two);
  const std::vector<float> zeros(100, 0.0f);
  EXPECT_EQ(round_trip(sparse(16, 4, 2), zeros), zeros);
  const std::vector<std::byte> bytes = encode(sparse(16, 4, 2), zeros);
  float lo = -1, hi = -1;
  std::memcpy(&lo, bytes.data(), 4);
  std::memcpy(&hi, bytes.data() + 4, 4);
  EXPECT_EQ(lo, 0.0f) << "an all-zero chunk has magnitudes 0";
  EXPECT_EQ(hi, 0.0f);
}

TEST(WireFormat, NonFiniteAndMalformedInputIsRefused) {
  for (const Codec& c : {blocks(Format::fp32, 4), blocks(Format::bf16, 4), blocks(Format::int8, 4),
                         blocks(Format::int4, 4), blocks(Format::int2, 4), sparse(4, 2, 2), sparse(16, 16, 8)}) {
    std::vector<float> x(10, 1.0f);
    x[6] = std::numeric_limits<float>::quiet_NaN();
    try {
      encode(c, x);
      ADD_FAILURE() << format_name(c.format) << ": NaN encoded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("value 6 is nan"), std::string::npos) << e.what();
    }
    x[6] = -std::numeric_limits<float>::infinity();
    EXPECT_THROW(encode(c, x), Error) << format_name(c.format);
    x[6] = 1.0f;
    std::vector<std::byte> wrong(encoded_bytes(c, 10) + 1);
    EXPECT_THROW(encode(c, x, wrong), Error) << format_name(c.format);
    wrong.resize(encoded_bytes(c, 10) - 1);
    expect_refused(c, wrong, 10, "expected " + std::to_string(encoded_bytes(c, 10)));
  }
  // A scale that is NaN, and an int4 code of −8 (nibble 0), cannot come from the encoder.
  std::vector<std::byte> bytes = encode(blocks(Format::int4, 4), std::vector<float>(4, 1.0f));
  std::vector<std::byte> bad = bytes;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bad.data(), &nan, 4);
  expect_refused(blocks(Format::int4, 4), bad, 4, "scale");
  bad = bytes;
  bad[4] = std::byte{0x0F};  // value 0: code 15 − 8 = 7 fine; value 1: nibble 0 → −8
  expect_refused(blocks(Format::int4, 4), bad, 4, "code -8");
  // An int2 code of 3 (q = 2).
  bytes = encode(blocks(Format::int2, 4), std::vector<float>(4, 1.0f));
  bad = bytes;
  bad[4] = std::byte{0b10111010};  // values 0, 1, 3: q + 1 = 2; value 2: 3
  expect_refused(blocks(Format::int2, 4), bad, 4, "value 2 has code 2");
}

// Every field of a sparse chunk checked: the two magnitudes, the indices (ascending, within the
// chunk). Chunks of 6 (3-bit indices) keep 2 values in 2 bits: indices at bits 0–5, codes at
// bits 6–9 after each chunk's two magnitudes; the second chunk starts at byte 10. Every code is
// a sign and a level, so none is out of range.
TEST(WireFormat, SparseMalformedInputIsRefused) {
  const Codec c = sparse(6, 2, 2);
  const std::vector<float> x = {0.0f, 0.0f, 3.0f, 0.0f, 0.0f, -3.0f, 1.0f, 0.0f, 0.0f, -2.0f};
  const std::vector<std::byte> good = encode(c, x);
  ASSERT_EQ(good.size(), 10u + 10u);
  std::vector<float> out(x.size());
  decode(c, good, out);  // kept: 2 and 5; then 6 and 9 (4 values: indices 0 and 3)
  auto with = [&](size_t chunk_offset, size_t at, uint32_t value, int bits) {
    std::vector<std::byte> b = good;
    put_bits(b, chunk_offset, at, value, bits);
    return b;
  };
  decode(c, with(0, 6, 2, 2), out);  // any code changes a value, nothing more
  EXPECT_EQ(out[2], -3.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (auto [lo, hi] : {std::pair{nan, 2.0f}, {1.0f, nan}, {1.0f, inf}, {-1.0f, 2.0f}, {2.5f, 2.0f}}) {
    std::vector<std::byte> b = good;
    std::memcpy(b.data() + 10, &lo, 4);
    std::memcpy(b.data() + 14, &hi, 4);
    expect_refused(c, b, x.size(), "chunk 1 has magnitudes");
  }
  expect_refused(c, with(0, 0, 5 | 2 << 3, 6), x.size(), "index 2 (kept value 1) does not follow 5");  // 5, 2
  expect_refused(c, with(0, 3, 2, 3), x.size(), "index 2 (kept value 1) does not follow 2");   // 2, 2
  expect_refused(c, with(0, 3, 6, 3), x.size(), "index 6 (kept value 1) is beyond its 6 values");
  expect_refused(c, with(10, 3, 4, 3), x.size(), "chunk 1: index 4 (kept value 1) is beyond its 4 values");
  std::vector<std::byte> longer = good;
  longer.push_back(std::byte{0});
  expect_refused(c, longer, x.size(), "21 bytes, expected 20");
}

}  // namespace
}  // namespace ddiloco::wire
