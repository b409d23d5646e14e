// Trained-model files (HDF5), the input of `ddiloco eval` and `ddiloco sample`.
//
// Layout, readable with h5py:
//   /                attrs: format = "ddiloco-model", format_version = 1, metadata (JSON text:
//                    step, tokens, val_loss, ... whatever the writer recorded)
//   /model           attrs: vocab_size, seq_len, n_layer, n_head, n_embd (int64)
//   /params/<name>   float32 dataset per tensor, GPT-2 names and shapes (TensorView)
// String attributes are fixed-length (h5::write_attr); a file of an earlier version, whose
// strings were variable-length, is refused (scripts/h5_fixed_strings.py converts one).
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "ddiloco/model.hpp"

namespace ddiloco {

inline constexpr int64_t kModelFormatVersion = 1;

/// Writes atomically (temporary file, fsync, rename). Throws Error on I/O failure.
void save_model(const std::filesystem::path& path, const GptConfig& config,
                std::span<const float> params, const nlohmann::json& metadata);

struct LoadedModel {
  GptConfig config;
  std::vector<float> params;  ///< flat, in ParameterLayout::gpt2(config) order
  nlohmann::json metadata;
};

/// Reads and validates a model file: format and version, a valid shape, and every tensor
/// present with its expected shape. Throws Error naming the file and what is wrong (also for
/// a variable-length string attribute: a file written by an earlier ddiloco).
LoadedModel load_model(const std::filesystem::path& path);

}  // namespace ddiloco
