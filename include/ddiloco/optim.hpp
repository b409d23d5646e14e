// The inner optimizer: AdamW, gradient clipping by global norm, warm-up + cosine schedule.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ddiloco/model.hpp"

namespace ddiloco {

/// AdamW hyper-parameters (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization").
struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  ///< decoupled; applied only to tensors with weight_decay = true
};

/// A contiguous range [lo, hi) of the flat parameter buffer: the part of the optimizer state one
/// rank of a unit owns with units.zero = 1 (ZeRO stage 1, Rajbhandari et al. 2020, "ZeRO:
/// Memory Optimizations Toward Training Trillion Parameter Models", §5.1).
struct StateShard {
  size_t lo = 0, hi = 0;
  size_t size() const { return hi - lo; }
  bool operator==(const StateShard&) const = default;
};

/// AdamW over a flat parameter buffer laid out by a ParameterLayout. With bias correction
/// (t counts from 1):
///   m ← β1·m + (1−β1)·g,  v ← β2·v + (1−β2)·g²,
///   θ ← θ − lr·( m/(1−β1ᵗ) / (√(v/(1−β2ᵗ)) + ε) + λ·θ )     (λ only for decayed tensors)
/// which is torch.optim.AdamW's update. Moments are kept in S (fp32 in training).
template <typename S>
class AdamW {
 public:
  AdamW(const ParameterLayout& layout, const AdamWConfig& config);
  /// The state of `shard` only (its moments: shard.size() elements each); throws Error when
  /// the shard is not within the layout.
  AdamW(const ParameterLayout& layout, const AdamWConfig& config, StateShard shard);

  /// One update with learning rate lr (> 0). params has layout.size() elements, of which the
  /// shard's are updated; grads has the shard's (the whole buffer's when unsharded), the
  /// gradient of params[shard.lo + i] at i. Throws Error on other sizes.
  void step(std::span<S> params, std::span<const S> grads, double lr);
  /// The range of the flat buffer this optimizer's state covers ([0, layout.size()) unsharded).
  StateShard shard() const { return shard_; }
  /// Forget the moments and the step count (a unit that lost its state, a fresh start).
  void reset();

  int64_t step_count() const { return t_; }
  void set_step_count(int64_t t) { t_ = t; }
  std::span<S> first_moment() { return m_; }
  std::span<S> second_moment() { return v_; }
  const AdamWConfig& config() const { return config_; }

 private:
  struct Range {
    size_t offset, numel;
    bool decay;
  };
  AdamWConfig config_;
  size_t numel_ = 0;  // the whole buffer's
  StateShard shard_;
  std::vector<Range> ranges_;  // the layout's tensors within the shard, offsets in the whole buffer
  std::vector<S> m_, v_;
  int64_t t_ = 0;
};

extern template class AdamW<float>;
extern template class AdamW<double>;

/// Learning rate at an inner step: linear warm-up to peak over warmup_steps (step 0 gets
/// peak/warmup_steps), then a half cosine from peak down to peak·min_lr_frac at total_steps,
/// constant after that (the GPT-2/nanoGPT schedule).
struct LrSchedule {
  double peak_lr = 1e-3;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_frac = 0.1;

  double at(int64_t step) const;
};

/// global_norm's block: Σ g² is summed in double over blocks of this many elements, and the
/// block sums are added in order, so that the norm does not depend on the thread count, nor on
/// how the buffer is split over ranks at block boundaries (units.zero = 1).
inline constexpr size_t kNormBlock = 1024;

/// The sums of squares of `grads` per block of kNormBlock (the last may be shorter), in
/// double: out has ⌈grads.size() / kNormBlock⌉ elements.
template <typename S>
void norm_partials(std::span<const S> grads, std::span<double> out);

/// √(Σ g²), accumulated in double: the block sums of norm_partials, added in order.
template <typename S>
double global_norm(std::span<const S> grads);

/// Scales grads by min(1, max_norm / (norm + 1e-6)) like torch.nn.utils.clip_grad_norm_;
/// max_norm ≤ 0 disables clipping. Returns the norm before clipping.
template <typename S>
double clip_grad_norm(std::span<S> grads, double max_norm);

}  // namespace ddiloco
