// Wire formats for what crosses the (emulated) WAN between a unit and the syncer (issue 6):
// fp32, bf16, and block-quantized int8 and 4-bit.
//
// A vector of n fp32 values is encoded as
//   fp32  n × 4 bytes, bit for bit
//   bf16  n × 2 bytes: the upper 16 bits of each fp32, rounded to nearest, ties to even
//         (the conversion of torch.bfloat16 and of CUDA's __float2bfloat16_rn)
//   int8  the absolute maximum a of each block of `block` values (the last may be shorter),
//         fp32, all blocks' first; then one int8 q = round(x / a · 127) in [−127, 127] per value
//   int4  as int8 with q = round(x / a · 7) in [−7, 7], two values per byte (value 2i in the
//         low nibble, 2i+1 in the high one), each stored as q + 8
// Values beyond bf16's range (|x| > ~3.39e38) are refused by the bf16 encoder.
// Decoding gives x̂ = (q / Q) · a (Q = 127 or 7), so zero blocks and each block's extreme
// values come back exactly (q / Q = ±1), constant vectors included, and every other value
// within a / (2Q) plus fp32 rounding: absmax block quantization (Dettmers et al. 2022,
// "8-bit Optimizers via Block-wise Quantization", arXiv 2110.02861).
// What is encoded is the caller's choice; outer gradients are sent as θ − base, with a base
// both sides hold, so that only the small difference is quantized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ddiloco::wire {

enum class Format { fp32, bf16, int8, int4 };

/// "fp32", "bf16", "int8", "int4"; throws Error naming the value and the choices.
Format parse_format(const std::string& name);
const char* format_name(Format format);

/// Bytes that `n` values take in `format` with blocks of `block` values (block ≥ 1; used by
/// int8 and int4 only).
size_t encoded_bytes(Format format, size_t n, size_t block);

/// Encodes `values` into `out` (encoded_bytes(...) bytes). Throws Error when a value is NaN or
/// infinite (naming its index), or when `out` has the wrong size.
void encode(Format format, std::span<const float> values, size_t block, std::span<std::byte> out);
std::vector<std::byte> encode(Format format, std::span<const float> values, size_t block);

/// Decodes `in` into `out` (its size is the number of values). Throws Error when `in` does not
/// have encoded_bytes(format, out.size(), block) bytes, or holds a non-finite scale or value.
void decode(Format format, std::span<const std::byte> in, size_t block, std::span<float> out);

}  // namespace ddiloco::wire
