// Wire formats: sizes, round trips within each format's error bound, exact zeros, constants and
// block extremes, ties to even in bf16, and refusal of non-finite or malformed input.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

#include "ddiloco/error.hpp"
#include "ddiloco/rng.hpp"
#include "ddiloco/wire_format.hpp"

namespace ddiloco::wire {
namespace {

std::vector<float> round_trip(Format f, const std::vector<float>& x, size_t block) {
  const std::vector<std::byte> bytes = encode(f, x, block);
  EXPECT_EQ(bytes.size(), encoded_bytes(f, x.size(), block));
  std::vector<float> y(x.size());
  decode(f, bytes, block, y);
  return y;
}

std::vector<float> randn(size_t n, uint64_t seed, float scale) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * static_cast<float>(rng.normal());
  return v;
}

TEST(WireFormat, SizesPerFormat) {
  EXPECT_EQ(encoded_bytes(Format::fp32, 100, 64), 400u);
  EXPECT_EQ(encoded_bytes(Format::bf16, 100, 64), 200u);
  EXPECT_EQ(encoded_bytes(Format::int8, 100, 64), 2 * 4 + 100u);
  EXPECT_EQ(encoded_bytes(Format::int4, 101, 64), 2 * 4 + 51u);
  EXPECT_EQ(encoded_bytes(Format::int4, 0, 64), 0u);
  EXPECT_THROW(encoded_bytes(Format::int8, 10, 0), Error);
  EXPECT_EQ(parse_format("int4"), Format::int4);
  EXPECT_STREQ(format_name(Format::bf16), "bf16");
  EXPECT_THROW(parse_format("fp8"), Error);
}

TEST(WireFormat, Fp32IsExactAndBf16RoundsToNearestEven) {
  const std::vector<float> x = randn(257, 1, 3.0f);
  EXPECT_EQ(round_trip(Format::fp32, x, 64), x);
  const std::vector<float> y = round_trip(Format::bf16, x, 64);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_LE(std::fabs(y[i] - x[i]), std::ldexp(std::fabs(x[i]), -8)) << i;
  // bf16 keeps 7 mantissa bits: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 (even: 1), and
  // 1 + 3·2^-8 one between 1 + 2^-7 and 1 + 2^-6 (even: 1 + 2^-6).
  const std::vector<float> ties = {1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -2.5f, 0.0f};
  const std::vector<float> want = {1.0f, 1.0f, 1.0f + 0x1p-6f, -2.5f, 0.0f};
  EXPECT_EQ(round_trip(Format::bf16, ties, 64), want);
  EXPECT_THROW(encode(Format::bf16, std::vector<float>{FLT_MAX}, 64), Error);
}

TEST(WireFormat, BlockQuantizationWithinHalfAStepOfEachBlocksMaximum) {
  for (Format f : {Format::int8, Format::int4}) {
    const float Q = f == Format::int8 ? 127.0f : 7.0f;
    for (size_t block : {1u, 7u, 64u, 1000u}) {
      const std::vector<float> x = randn(333, 7 + block, 0.01f);
      const std::vector<float> y = round_trip(f, x, block);
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
  for (Format f : {Format::bf16, Format::int8, Format::int4}) {
    const std::vector<float> zeros(130, 0.0f), constant(131, -0.0371f), positive(5, 3.25f);
    EXPECT_EQ(round_trip(f, zeros, 64), zeros) << format_name(f);
    if (f != Format::bf16) {  // bf16 rounds −0.0371 itself
      EXPECT_EQ(round_trip(f, constant, 64), constant) << format_name(f);
    }
    EXPECT_EQ(round_trip(f, positive, 2), positive) << format_name(f);
  }
}

TEST(WireFormat, NonFiniteAndMalformedInputIsRefused) {
  for (Format f : {Format::fp32, Format::bf16, Format::int8, Format::int4}) {
    std::vector<float> x(10, 1.0f);
    x[6] = std::numeric_limits<float>::quiet_NaN();
    try {
      encode(f, x, 4);
      ADD_FAILURE() << format_name(f) << ": NaN encoded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("value 6 is nan"), std::string::npos) << e.what();
    }
    x[6] = std::numeric_limits<float>::infinity();
    EXPECT_THROW(encode(f, x, 4), Error) << format_name(f);
    std::vector<float> out(10);
    std::vector<std::byte> short_input(encoded_bytes(f, 10, 4) - 1);
    EXPECT_THROW(decode(f, short_input, 4, out), Error) << format_name(f);
  }
  // A scale that is NaN, and an int4 code of −8 (nibble 0), cannot come from the encoder.
  std::vector<std::byte> bytes = encode(Format::int4, std::vector<float>(4, 1.0f), 4);
  std::vector<float> out(4);
  std::vector<std::byte> bad = bytes;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bad.data(), &nan, 4);
  EXPECT_THROW(decode(Format::int4, bad, 4, out), Error);
  bad = bytes;
  bad[4] = std::byte{0x0F};  // value 0: code 15 − 8 = 7 fine; value 1: nibble 0 → −8
  EXPECT_THROW(decode(Format::int4, bad, 4, out), Error);
}

}  // namespace
}  // namespace ddiloco::wire
