// Named pointers into a flat GPT-2 buffer (parameters or gradients, any element type), in the
// order ParameterLayout::gpt2 lays the tensors out: wte, wpe, then 12 tensors per block, then
// the final LayerNorm. Shared by the CPU model (gpt.cpp) and the GPU model (gpu/gpt_cuda.cpp),
// so both read the one layout the same way.
#pragma once

#include <cstddef>
#include <vector>

#include "ddiloco/model.hpp"

namespace ddiloco::model_views {

constexpr int kTensorsPerLayer = 12;

template <typename T>
struct Block {
  T *ln1w, *ln1b, *qkvw, *qkvb, *projw, *projb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
};

template <typename T>
struct Weights {
  T *wte, *wpe, *lnfw, *lnfb;
  std::vector<Block<T>> blocks;

  Weights(const ParameterLayout& layout, T* base, int n_layer) {
    const auto& t = layout.tensors();
    auto at = [&](size_t i) { return base + t[i].offset; };
    wte = at(0);
    wpe = at(1);
    for (int l = 0; l < n_layer; ++l) {
      const size_t i = 2 + static_cast<size_t>(l) * kTensorsPerLayer;
      blocks.push_back({at(i), at(i + 1), at(i + 2), at(i + 3), at(i + 4), at(i + 5), at(i + 6),
                        at(i + 7), at(i + 8), at(i + 9), at(i + 10), at(i + 11)});
    }
    lnfw = at(t.size() - 2);
    lnfb = at(t.size() - 1);
  }
};

}  // namespace ddiloco::model_views
