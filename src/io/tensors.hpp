// HDF5 groups of named model tensors and the /model shape attributes, shared by model files
// and checkpoints (so that h5py sees the same layout in both).
#pragma once

#include <span>
#include <string>

#include "ddiloco/model.hpp"
#include "io/h5.hpp"

namespace ddiloco::h5 {

/// Writes group `name` under `parent` with one float32 dataset per tensor of `layout`
/// (GPT-2 names and shapes), taken from the flat buffer `flat` (layout.size() elements).
void write_tensors(hid_t parent, const std::string& name, const ParameterLayout& layout,
                   std::span<const float> flat);
/// Reads such a group into `flat`; throws Error naming `label`, the tensor and the shapes when
/// a tensor is missing, extra or of another shape, or holds NaN/Inf.
void read_tensors(hid_t parent, const std::string& name, const ParameterLayout& layout,
                  std::span<float> flat, const std::string& label);

/// /model attributes: vocab_size, seq_len, n_layer, n_head, n_embd (int64).
void write_model_shape(hid_t file, const GptConfig& config, const std::string& label);
/// Reads and validates them; throws Error naming `label` and the attribute.
GptConfig read_model_shape(hid_t file, const std::string& label);

}  // namespace ddiloco::h5
