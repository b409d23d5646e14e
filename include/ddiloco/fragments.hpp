// Fragments: the parameter vector split into P groups of whole tensors, each synchronised on
// its own staggered schedule (Streaming DiLoCo, Douillard et al. 2025; docs/algorithm.md,
// "Fragments and schedule").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ddiloco/model.hpp"

namespace ddiloco::protocol {

/// One fragment: a set of whole tensors (indices into ParameterLayout::tensors(), in layout
/// order) and its place on the schedule.
struct Fragment {
  int index = 0;
  std::vector<int> tensors;
  size_t numel = 0;  ///< elements (fp32 parameters) over all its tensors
  int offset = 0;    ///< schedule offset in inner steps, ⌊index·H/P⌋
};

/// The split of a model into P fragments and when each is due.
///
/// Split: greedy balanced bin-packing — tensors sorted by size (largest first, ties by layout
/// order) each go into the fragment with the fewest elements so far (ties: lowest index).
/// Schedule: fragment p is due after inner step t (t counted from 1) when t ≥ H and
/// (t − offset_p) mod H = 0, i.e. at t = offset_p + k·H, k ≥ 1: every fragment gets at least
/// H steps before its first synchronisation, and with P = H exactly one fragment is due per
/// step. P = 1 is plain DiLoCo (due every H steps).
/// With a warm-up of W steps (outer.warmup_steps, post-local SGD) every fragment is due after
/// every step t ≤ W, and the schedule above runs on t − W after it.
class FragmentPlan {
 public:
  /// Throws Error when P < 1, P > number of tensors, H < 1 or W < 0.
  FragmentPlan(const ParameterLayout& layout, int fragments, int h, int64_t warmup = 0);

  const std::vector<Fragment>& fragments() const { return fragments_; }
  /// The parameter layout it splits (it must outlive the plan).
  const ParameterLayout& layout() const { return *layout_; }
  int size() const { return static_cast<int>(fragments_.size()); }
  /// Elements of each fragment, in index order.
  std::vector<size_t> numels() const;
  int h() const { return h_; }
  /// Is inner step t (t ≥ 1) in the warm-up, where every step is synchronised and applied at once?
  bool warm(int64_t t) const { return t <= warmup_; }
  /// Is fragment p due after inner step t (t ≥ 1)?
  bool due(int p, int64_t t) const;
  /// The inner step after which fragment p's k-th synchronisation is due (k ≥ 0; 0 → 0).
  int64_t step_of_sync(int p, int64_t k) const;
  /// Fragments due after inner step t, in index order.
  std::vector<int> due_after(int64_t t) const;

  /// Copies fragment p's tensors out of a flat parameter buffer into `packed` (numel elems),
  /// in the fragment's tensor order, and back.
  void pack(int p, std::span<const float> flat, std::span<float> packed) const;
  void unpack(int p, std::span<const float> packed, std::span<float> flat) const;

  /// Byte ranges of fragment p's tensors inside its packed buffer: (offset, numel, embedding).
  struct Segment {
    size_t packed_offset, numel;
    bool embedding;
  };
  const std::vector<Segment>& segments(int p) const { return segments_[p]; }

 private:
  const ParameterLayout* layout_;
  std::vector<Fragment> fragments_;
  std::vector<std::vector<Segment>> segments_;
  int h_;
  int64_t warmup_;
};

}  // namespace ddiloco::protocol
