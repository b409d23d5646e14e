// ZeRO stage 1 inside a learner unit (units.zero = 1; Rajbhandari et al. 2020, "ZeRO: Memory
// Optimizations Toward Training Trillion Parameter Models", §5.1): each of the unit's R ranks
// owns the AdamW moments of one shard of the flat parameter buffer, so that the optimizer state
// per rank falls from 8 to 8/R bytes per parameter (fp32 m and v). One inner step:
//   1. the gradients are reduce-scattered (a ring of MPI_Sendrecv of one shard each, sum: no
//      buffer of the whole gradient): each rank gets its shard's sum and scales it by 1/R, the
//      unit's mean gradient;
//   2. clipping by global norm stays exact: each rank sums g² over its shard's blocks of
//      kNormBlock elements, the block sums are all-gathered and added in order on every rank,
//      exactly as global_norm adds them for the whole buffer (shards start on block
//      boundaries);
//   3. each rank runs AdamW on its shard (AdamW(layout, config, shard));
//   4. the updated shards are all-gathered in place (the ring's second half), and every rank
//      again holds the whole θ.
// Every message is at most 1 MiB (ring_segment), so no MPI count exceeds an int whatever the
// model's size, and the ring needs no buffer of the whole gradient.
// Against units.zero = 0 (all-reduce, then AdamW on every rank): the same update, and
// bit-identical wherever the reduce-scatter adds each element's R terms in the all-reduce's
// order, which with R = 2 always holds (one addition, commutative); with R ≥ 3 the MPI
// library's algorithms may associate differently (equal to fp32 rounding). tests/mpi/test_zero.cpp.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <span>
#include <vector>

#include "ddiloco/optim.hpp"

namespace ddiloco {

/// Rank `rank`'s shard of a buffer of n elements split over `ranks`: ⌈⌈n/R⌉ / kNormBlock⌉
/// blocks of kNormBlock each, in rank order; the last shards are shorter or empty when n is
/// small (a model of fewer than R·kNormBlock parameters leaves some ranks none).
StateShard zero_shard(size_t n, int rank, int ranks);

/// One rank's part of the sharded update (the steps above). Collective over `comm`.
class ZeroStep {
 public:
  /// n: the flat buffer's elements (up to 2^31 − 1 norm blocks). ring_segment: elements per
  /// message of the rings, their only buffer (1 MiB of float32 by default; tests make it small
  /// so that messages end mid-shard).
  ZeroStep(size_t n, MPI_Comm comm, size_t ring_segment = size_t{1} << 18);

  StateShard shard() const { return shard_; }

  /// grads: this rank's gradient of the whole buffer (float32, n; scratch: partly summed,
  /// its shard left holding the clipped mean gradient); params: θ (n), of which every rank's shard is updated by `opt` (whose shard
  /// is shard()) and then all-gathered. Returns the global norm of the mean gradient before
  /// clipping (max_norm ≤ 0: no clipping).
  double step(std::span<float> params, std::span<float> grads, AdamW<float>& opt, double lr, double max_norm);
  /// Steps 3 and 4 alone, for gradients every rank already holds reduced and clipped (mode
  /// ddp, whose reducer averages them across units: ddp_reducer.hpp): `opt` updates this
  /// rank's shard of params from grads' (both n), then the shards are all-gathered. The same
  /// update as AdamW on the whole buffer on every rank, bit for bit.
  void step_reduced(std::span<float> params, std::span<const float> grads, AdamW<float>& opt, double lr);

  /// The whole buffer of a shard-sized vector on rank 0 (in messages of ring_segment; empty on
  /// the others).
  std::vector<float> gather(std::span<const float> mine) const;

 private:
  // Throws Error unless `opt` updates shard() and both spans are the whole buffer.
  void check(size_t params, size_t grads, const AdamW<float>& opt) const;
  MPI_Comm comm_;
  int rank_, ranks_;
  StateShard shard_;
  std::vector<StateShard> shards_;                // every rank's
  std::vector<int> block_counts_, block_displs_;  // their norm blocks
  std::vector<float> piece_;                      // the ring's incoming message
  std::vector<double> partials_;                  // every block's Σ g²
  void exchange(const float* send, size_t count, int to, float* recv, size_t count_in, int from, bool add);
  void reduce_scatter(std::span<float> grads);
  void all_gather(std::span<float> params);
};

}  // namespace ddiloco
