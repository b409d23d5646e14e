// Deterministic random numbers for weight initialisation, data shuffling and sampling.
//
// The generator is std::mt19937_64, whose output sequence is fixed by the C++ standard; the
// normal and uniform transforms are written here (Box-Muller, 53-bit uniforms) rather
// than taken from <random>, whose distributions may differ between standard libraries. So the
// same seed gives the same model and the same data order on every platform and rank.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <string>

namespace ddiloco {

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}

  /// Uniform in [0, 1) with 53 bits of precision.
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

  /// Standard normal N(0, 1) by the Box-Muller transform (one value per call, the pair's
  /// second value is cached).
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = uniform();
    while (u1 <= 0.0) u1 = uniform();
    const double u2 = uniform();
    const double radius = std::sqrt(-2.0 * std::log(u1));
    spare_ = radius * std::sin(2.0 * std::numbers::pi * u2);
    has_spare_ = true;
    return radius * std::cos(2.0 * std::numbers::pi * u2);
  }

  /// Uniform integer in [0, n) without modulo bias (n > 0).
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x = engine_();
    while (x >= limit) x = engine_();
    return x % n;
  }

  uint64_t next_u64() { return engine_(); }

  /// The engine's full state as text (std::mt19937_64's stream format), for checkpoints.
  std::string state() const;
  void set_state(const std::string& text);

 private:
  std::mt19937_64 engine_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

/// Mixes a base seed with a stream identifier (SplitMix64 finaliser) so that e.g. per-epoch or
/// per-rank generators are decorrelated.
inline uint64_t mix_seed(uint64_t seed, uint64_t stream) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (stream + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace ddiloco
