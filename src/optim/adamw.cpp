#include <algorithm>
#include <cmath>
#include <numbers>

#include "ddiloco/error.hpp"
#include "ddiloco/optim.hpp"

namespace ddiloco {

template <typename S>
AdamW<S>::AdamW(const ParameterLayout& layout, const AdamWConfig& config)
    : AdamW(layout, config, StateShard{0, layout.size()}) {}

template <typename S>
AdamW<S>::AdamW(const ParameterLayout& layout, const AdamWConfig& config, StateShard shard)
    : config_(config), numel_(layout.size()), shard_(shard) {
  if (shard.lo > shard.hi || shard.hi > numel_)
    fail("AdamW: shard [{}, {}) is not within the {} parameters", shard.lo, shard.hi, numel_);
  for (const auto& t : layout.tensors()) {
    const size_t lo = std::max(t.offset, shard.lo), hi = std::min(t.offset + t.numel, shard.hi);
    if (lo < hi) ranges_.push_back({lo, hi - lo, t.weight_decay});
  }
  m_.assign(shard.size(), S(0));
  v_.assign(shard.size(), S(0));
}

template <typename S>
void AdamW<S>::reset() {
  std::fill(m_.begin(), m_.end(), S(0));
  std::fill(v_.begin(), v_.end(), S(0));
  t_ = 0;
}

template <typename S>
void AdamW<S>::step(std::span<S> params, std::span<const S> grads, double lr) {
  if (params.size() != numel_ || grads.size() != m_.size())
    fail("AdamW: expected {} parameters and {} gradients, got {} and {}", numel_, m_.size(), params.size(),
         grads.size());
  if (!(lr > 0)) fail("AdamW: learning rate must be > 0, got {}", lr);
  ++t_;
  const S b1 = static_cast<S>(config_.beta1), b2 = static_cast<S>(config_.beta2);
  const S bc1 = static_cast<S>(1.0 - std::pow(config_.beta1, static_cast<double>(t_)));
  const S bc2 = static_cast<S>(1.0 - std::pow(config_.beta2, static_cast<double>(t_)));
  const S eps = static_cast<S>(config_.eps), slr = static_cast<S>(lr);
  for (const Range& r : ranges_) {
    const S decay = r.decay ? static_cast<S>(config_.weight_decay) : S(0);
    S* p = params.data() + r.offset;
    const size_t local = r.offset - shard_.lo;
    const S* g = grads.data() + local;
    S* m = m_.data() + local;
    S* v = v_.data() + local;
    const long n = static_cast<long>(r.numel);
#pragma omp parallel for schedule(static) if (n > 4096)
    for (long i = 0; i < n; ++i) {
      m[i] = b1 * m[i] + (S(1) - b1) * g[i];
      v[i] = b2 * v[i] + (S(1) - b2) * g[i] * g[i];
      const S mhat = m[i] / bc1;
      const S vhat = v[i] / bc2;
      p[i] -= slr * (mhat / (std::sqrt(vhat) + eps) + decay * p[i]);
    }
  }
}

template class AdamW<float>;
template class AdamW<double>;

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return peak_lr * static_cast<double>(step + 1) / warmup_steps;
  const double min_lr = peak_lr * min_lr_frac;
  if (step >= total_steps || total_steps <= warmup_steps) return min_lr;
  const double ratio =
      static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  return min_lr + coeff * (peak_lr - min_lr);
}

template <typename S>
void norm_partials(std::span<const S> grads, std::span<double> out) {
  const size_t blocks = (grads.size() + kNormBlock - 1) / kNormBlock;
  if (out.size() != blocks) fail("norm_partials: {} blocks, {} sums", blocks, out.size());
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < blocks; ++b) {
    double s = 0;
    const size_t end = std::min(grads.size(), (b + 1) * kNormBlock);
    for (size_t i = b * kNormBlock; i < end; ++i) s += static_cast<double>(grads[i]) * grads[i];
    out[b] = s;
  }
}

template <typename S>
double global_norm(std::span<const S> grads) {
  // Partial sums over fixed blocks, added in order: the result does not depend on the number
  // of threads, so ranks with different thread counts clip identically.
  std::vector<double> partial((grads.size() + kNormBlock - 1) / kNormBlock, 0.0);
  norm_partials(grads, std::span<double>(partial));
  double sum = 0;
  for (double s : partial) sum += s;
  return std::sqrt(sum);
}

template <typename S>
double clip_grad_norm(std::span<S> grads, double max_norm) {
  const double norm = global_norm(std::span<const S>(grads));
  if (max_norm > 0) {
    const double coeff = max_norm / (norm + 1e-6);
    if (coeff < 1.0) {
      const S c = static_cast<S>(coeff);
      const long n = static_cast<long>(grads.size());
#pragma omp parallel for schedule(static)
      for (long i = 0; i < n; ++i) grads[i] *= c;
    }
  }
  return norm;
}

template void norm_partials<float>(std::span<const float>, std::span<double>);
template void norm_partials<double>(std::span<const double>, std::span<double>);
template double global_norm<float>(std::span<const float>);
template double global_norm<double>(std::span<const double>);
template double clip_grad_norm<float>(std::span<float>, double);
template double clip_grad_norm<double>(std::span<double>, double);

}  // namespace ddiloco
