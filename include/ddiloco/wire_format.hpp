// Wire formats for what crosses the (emulated) WAN between a unit and the syncer (issue 6):
// fp32, bf16, block-quantized int8, 4-bit and 2-bit, and sparse top-k.
//
// A vector of n fp32 values is encoded as
//   fp32  n × 4 bytes, bit for bit
//   bf16  n × 2 bytes: the upper 16 bits of each fp32, rounded to nearest, ties to even
//         (the conversion of torch.bfloat16 and of CUDA's __float2bfloat16_rn)
//   int8  the absolute maximum a of each block of `block` values (the last may be shorter),
//         fp32, all blocks' first; then one int8 q = round(x / a · 127) in [−127, 127] per value
//   int4  as int8 with q = round(x / a · 7) in [−7, 7], two values per byte (value 2i in the
//         low nibble, 2i+1 in the high one), each stored as q + 8
//   int2  as int8 with q = round(x / a) in {−1, 0, 1}, four values per byte (value 4i in the
//         lowest two bits, 4i+3 in the highest), each stored as q + 1
//   sparse  top-k sparsification with quantized values (SparseLoCo: Sarfi, Thérien,
//         Lidin and Belilovsky 2025, "Communication Efficient LLM Pre-training with SparseLoCo",
//         arXiv 2508.15706), below.
// Values beyond bf16's range (|x| > ~3.39e38) are refused by the bf16 encoder.
// Decoding gives x̂ = (q / Q) · a (Q = 127, 7 or 1), so zero blocks and each block's extreme
// values come back exactly (q / Q = ±1), constant vectors included, and every other value
// within a / (2Q) plus fp32 rounding: absmax block quantization (Dettmers et al. 2022,
// "8-bit Optimizers via Block-wise Quantization", arXiv 2110.02861).
//
// sparse: the values are cut into chunks of `chunk` values (the last may be shorter, length L).
// Each chunk keeps its k = min(topk, L) largest magnitudes (ties: the lower index wins, so that
// encoding is deterministic) and is laid out as
//   lo, hi   fp32 each: the smallest and the largest kept |x| (both 0 for an all-zero chunk)
//   indices  k indices within the chunk, ascending, ⌈log2 chunk⌉ bits each (at least 1)
//   values   k codes of b = value_bits ∈ {2, 4, 8} bits: the sign of x in the top bit, below it
//            the nearest of S + 1 = 2^(b−1) magnitude levels lo·(1 − j/S) + hi·(j/S), j ∈ [0, S]
// with the index and value bits packed least significant bit first from the byte after hi, and
// the chunk padded to a whole byte. A chunk thus takes 8 + ⌈k·(⌈log2 chunk⌉ + b) / 8⌉ bytes, a
// fixed function of (n, chunk, topk, value_bits) (the windows rely on fixed sizes):
// ≈ (k·(⌈log2 chunk⌉ + b) + 64) / chunk bits per value, 0.234 with the defaults (chunk 4096,
// topk 64, b = 2). No code stands for zero: a kept value is never rounded away (with b = 2 its
// magnitude becomes lo or hi). Decoding writes zeros except at the kept indices. Error bounds:
// a kept value comes back with its sign and within (hi − lo) / (2S) plus fp32 rounding, the
// chunk's smallest and largest kept magnitudes exactly; a dropped value has magnitude ≤ lo and
// comes back as 0. The round trip is exact where every chunk has at most k nonzeros, each of
// magnitude lo·(1 − j/S) + hi·(j/S) in fp32 for an integer j (so with b = 2: at most two
// magnitudes, or one besides zero).
//
// What is encoded is the caller's choice; outer gradients are sent as θ − base, with a base
// both sides hold, so that only the small difference is quantized (sync_window.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ddiloco::wire {

enum class Format { fp32, bf16, int8, int4, int2, sparse };

/// A wire format with its parameters; each format reads only its own.
struct Codec {
  Format format = Format::fp32;
  size_t block = 64;    ///< int8, int4, int2: values per fp32 scale, ≥ 1
  size_t chunk = 4096;  ///< sparse: values per chunk, in [1, 2^24]
  size_t topk = 64;     ///< sparse: values kept per chunk, ≥ 1 (a shorter chunk keeps all)
  int value_bits = 2;   ///< sparse: bits per kept value, 2, 4 or 8
};

/// "fp32", "bf16", "int8", "int4", "int2", "sparse"; throws Error naming the value and the
/// choices.
Format parse_format(const std::string& name);
const char* format_name(Format format);

/// Throws Error naming the parameter of `codec` that its format cannot use (block 0, a chunk
/// outside [1, 2^24], topk 0, value_bits not 2, 4 or 8).
void check(const Codec& codec);

/// Bytes that `n` values take in `codec` (formulas above). Throws Error as check() does.
size_t encoded_bytes(const Codec& codec, size_t n);

/// Encodes `values` into `out` (encoded_bytes(codec, values.size()) bytes). Throws Error when a
/// value is NaN or infinite (naming its index), or when `out` has the wrong size.
void encode(const Codec& codec, std::span<const float> values, std::span<std::byte> out);
std::vector<std::byte> encode(const Codec& codec, std::span<const float> values);

/// Decodes `in` (untrusted) into `out` (its size is the number of values). Throws Error, naming
/// what is wrong, when `in` does not have encoded_bytes(codec, out.size()) bytes, or holds a
/// non-finite or negative scale, a code outside its format's range, a non-finite value, or
/// (sparse) magnitudes that are not finite with 0 ≤ lo ≤ hi, or indices that are not strictly
/// ascending within their chunk.
void decode(const Codec& codec, std::span<const std::byte> in, std::span<float> out);

}  // namespace ddiloco::wire
