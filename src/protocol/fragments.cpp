#include "ddiloco/fragments.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "ddiloco/error.hpp"

namespace ddiloco::protocol {

FragmentPlan::FragmentPlan(const ParameterLayout& layout, int fragments, int h, int64_t warmup)
    : layout_(&layout), h_(h), warmup_(warmup) {
  const auto& tensors = layout.tensors();
  if (fragments < 1 || fragments > static_cast<int>(tensors.size()))
    fail("outer.fragments: must be in [1, {}] (the model's tensors), got {}", tensors.size(),
         fragments);
  if (h < 1) fail("outer.h: must be ≥ 1, got {}", h);
  if (warmup < 0) fail("outer.warmup_steps: must be ≥ 0, got {}", warmup);

  std::vector<int> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return tensors[a].numel > tensors[b].numel; });
  fragments_.resize(fragments);
  for (int p = 0; p < fragments; ++p) {
    fragments_[p].index = p;
    fragments_[p].offset = static_cast<int>(static_cast<int64_t>(p) * h / fragments);
  }
  for (int t : order) {
    auto smallest = std::min_element(fragments_.begin(), fragments_.end(),
                                     [](const Fragment& a, const Fragment& b) {
                                       return a.numel < b.numel;  // first minimum: lowest index
                                     });
    smallest->tensors.push_back(t);
    smallest->numel += tensors[t].numel;
  }
  segments_.resize(fragments);
  for (auto& f : fragments_) {
    std::sort(f.tensors.begin(), f.tensors.end());
    size_t off = 0;
    for (int t : f.tensors) {
      segments_[f.index].push_back({off, tensors[t].numel, tensors[t].embedding});
      off += tensors[t].numel;
    }
  }
}

std::vector<size_t> FragmentPlan::numels() const {
  std::vector<size_t> out;
  for (const Fragment& f : fragments_) out.push_back(f.numel);
  return out;
}

bool FragmentPlan::due(int p, int64_t t) const {
  if (warm(t)) return true;
  t -= warmup_;
  const int64_t offset = fragments_[p].offset;
  return t >= offset + h_ && (t - offset) % h_ == 0;
}

int64_t FragmentPlan::step_of_sync(int p, int64_t k) const {
  if (k <= warmup_) return k;
  return warmup_ + fragments_[p].offset + (k - warmup_) * h_;
}

std::vector<int> FragmentPlan::due_after(int64_t t) const {
  std::vector<int> out;
  for (int p = 0; p < size(); ++p)
    if (due(p, t)) out.push_back(p);
  return out;
}

void FragmentPlan::pack(int p, std::span<const float> flat, std::span<float> packed) const {
  const auto& tensors = layout_->tensors();
  size_t off = 0;
  for (int t : fragments_[p].tensors) {
    std::memcpy(packed.data() + off, flat.data() + tensors[t].offset,
                tensors[t].numel * sizeof(float));
    off += tensors[t].numel;
  }
}

void FragmentPlan::unpack(int p, std::span<const float> packed, std::span<float> flat) const {
  const auto& tensors = layout_->tensors();
  size_t off = 0;
  for (int t : fragments_[p].tensors) {
    std::memcpy(flat.data() + tensors[t].offset, packed.data() + off,
                tensors[t].numel * sizeof(float));
    off += tensors[t].numel;
  }
}

}  // namespace ddiloco::protocol
