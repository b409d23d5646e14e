// Shared by the GPU unit tests (tests/gpu/mpi/): a small model's configuration on which the
// flash attention path runs (head size 64), and random token batches.
#pragma once

#include <cstdint>
#include <vector>

#include "ddiloco/config.hpp"
#include "ddiloco/rng.hpp"

namespace ddiloco::gpu::test {

/// 2 layers × 128 (2 heads of 64), vocabulary 256, batches of 4 × 64 tokens.
inline Config small_unit_config(const char* device, const char* attention = "auto") {
  Config c;
  c.model.vocab_size = 256;
  c.model.seq_len = 64;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.n_embd = 128;  // head size 64: flash runs (auto picks cublas)
  c.train.batch_size = 4;
  c.train.steps = 100;
  c.train.warmup_steps = 2;
  c.train.lr = 3e-3;
  c.run.device = device;
  c.run.gpu_attention = attention;
  return c;
}

/// n tokens uniform in [0, 256) from `seed`.
inline std::vector<int32_t> random_tokens(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng.next_u64() % 256);
  return t;
}

}  // namespace ddiloco::gpu::test
