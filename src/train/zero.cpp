// ZeRO stage 1 inside a unit (zero.hpp): reduce-scatter, exact global norm, AdamW on the
// shard, all-gather.
#include "ddiloco/zero.hpp"

#include <algorithm>
#include <climits>
#include <cmath>

#include "ddiloco/error.hpp"
#include "ddiloco/mpi.hpp"

namespace ddiloco {

StateShard zero_shard(size_t n, int rank, int ranks) {
  if (ranks < 1 || rank < 0 || rank >= ranks) fail("zero_shard: rank {} of {}", rank, ranks);
  const size_t per_rank = (n + static_cast<size_t>(ranks) - 1) / static_cast<size_t>(ranks);
  const size_t chunk = (per_rank + kNormBlock - 1) / kNormBlock * kNormBlock;
  const size_t lo = std::min(n, chunk * static_cast<size_t>(rank));
  return {lo, std::min(n, lo + chunk)};
}

ZeroStep::ZeroStep(size_t n, MPI_Comm comm)
    : comm_(comm), rank_(mpi::rank(comm)), ranks_(mpi::size(comm)), shard_(zero_shard(n, rank_, ranks_)) {
  // MPI-3's counts and displacements are ints, in elements.
  if (n > static_cast<size_t>(INT_MAX))
    fail("units.zero: 1 shards at most {} parameters over MPI (its counts and offsets are ints), the model "
         "has {}: use units.zero: 0",
         INT_MAX, n);
  for (int r = 0; r < ranks_; ++r) {
    const StateShard s = zero_shard(n, r, ranks_);
    counts_.push_back(static_cast<int>(s.size()));
    displs_.push_back(static_cast<int>(s.lo));
    block_counts_.push_back(static_cast<int>((s.size() + kNormBlock - 1) / kNormBlock));
    block_displs_.push_back(static_cast<int>(s.lo / kNormBlock));
  }
  mean_.resize(shard_.size());
  partials_.resize((n + kNormBlock - 1) / kNormBlock);
}

double ZeroStep::step(std::span<float> params, std::span<float> grads, AdamW<float>& opt, double lr,
                      double max_norm) {
  if (opt.shard() != shard_) fail("ZeroStep: the optimizer's shard is not this rank's");
  if (params.size() != grads.size() || partials_.size() != (grads.size() + kNormBlock - 1) / kNormBlock)
    fail("ZeroStep: {} parameters and {} gradients for a buffer of {} blocks", params.size(), grads.size(),
         partials_.size());
  // 1. This shard's sum over the unit, then its mean (as the all-reduce path scales).
  mpi::check(MPI_Reduce_scatter(grads.data(), mean_.data(), counts_.data(), MPI_FLOAT, MPI_SUM, comm_),
             "Reduce_scatter(gradients)");
  const float inv = 1.0f / static_cast<float>(ranks_);
  const long n = static_cast<long>(mean_.size());
#pragma omp parallel for schedule(static)
  for (long i = 0; i < n; ++i) mean_[i] *= inv;
  // 2. Every block's Σ g², added in global_norm's order.
  const int my_blocks = block_counts_[static_cast<size_t>(rank_)];
  std::span<double> mine(partials_.data() + block_displs_[static_cast<size_t>(rank_)], static_cast<size_t>(my_blocks));
  norm_partials(std::span<const float>(mean_), mine);
  mpi::check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, partials_.data(), block_counts_.data(),
                            block_displs_.data(), MPI_DOUBLE, comm_),
             "Allgatherv(norm blocks)");
  double sum = 0;
  for (double s : partials_) sum += s;
  const double norm = std::sqrt(sum);
  if (max_norm > 0 && max_norm / (norm + 1e-6) < 1.0) {  // clip_grad_norm's rule
    const float c = static_cast<float>(max_norm / (norm + 1e-6));
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) mean_[i] *= c;
  }
  // 3. and 4.
  opt.step(params, mean_, lr);
  mpi::check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, params.data(), counts_.data(), displs_.data(),
                            MPI_FLOAT, comm_),
             "Allgatherv(parameters)");
  return norm;
}

std::vector<float> ZeroStep::gather(std::span<const float> mine) const {
  if (mine.size() != shard_.size()) fail("ZeroStep::gather: {} values for a shard of {}", mine.size(), shard_.size());
  std::vector<float> all(rank_ == 0 ? static_cast<size_t>(displs_.back()) + static_cast<size_t>(counts_.back()) : 0);
  mpi::check(MPI_Gatherv(mine.data(), counts_[static_cast<size_t>(rank_)], MPI_FLOAT, all.data(), counts_.data(),
                         displs_.data(), MPI_FLOAT, 0, comm_),
             "Gatherv(optimizer state)");
  return all;
}

}  // namespace ddiloco
