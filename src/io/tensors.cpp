#include "io/tensors.hpp"

#include <algorithm>
#include <climits>
#include <cmath>

#include "ddiloco/error.hpp"
#include <fmt/format.h>

namespace ddiloco::h5 {

void write_tensors(hid_t parent, const std::string& name, const ParameterLayout& layout,
                   std::span<const float> flat) {
  if (flat.size() != layout.size())
    fail("HDF5 group '{}': {} values given, the model has {}", name, flat.size(), layout.size());
  Handle group = create_group(parent, name, name);
  for (const auto& t : layout.tensors())
    write_dataset(group, t.name, flat.data() + t.offset,
                  std::vector<hsize_t>(t.shape.begin(), t.shape.end()));
}

void read_tensors(hid_t parent, const std::string& name, const ParameterLayout& layout,
                  std::span<float> flat, const std::string& label) {
  Handle group = open_group(parent, name, label);
  if (link_count(group) != layout.tensors().size())
    fail("{}: /{} holds {} tensors, the model shape in /model has {}", label, name,
         link_count(group), layout.tensors().size());
  for (const auto& t : layout.tensors()) {
    read_dataset(group, t.name, flat.data() + t.offset,
                 std::vector<hsize_t>(t.shape.begin(), t.shape.end()), label + ":/" + name);
    const float* p = flat.data() + t.offset;
    if (!std::all_of(p, p + t.numel, [](float x) { return std::isfinite(x); }))
      fail("{}: tensor '/{}/{}' holds NaN or infinite values", label, name, t.name);
  }
}

void write_model_shape(hid_t file, const GptConfig& config, const std::string& label) {
  Handle model = create_group(file, "model", label);
  write_attr(model, "vocab_size", int64_t{config.vocab_size});
  write_attr(model, "seq_len", int64_t{config.seq_len});
  write_attr(model, "n_layer", int64_t{config.n_layer});
  write_attr(model, "n_head", int64_t{config.n_head});
  write_attr(model, "n_embd", int64_t{config.n_embd});
}

GptConfig read_model_shape(hid_t file, const std::string& label) {
  Handle model = open_group(file, "model", label);
  auto dim = [&](const char* name) {
    const int64_t v = read_attr_int(model, name, label + ":/model");
    if (v < 1 || v > INT32_MAX) fail("{}: /model attribute {} = {} is out of range", label, name, v);
    return static_cast<int>(v);
  };
  GptConfig config{dim("vocab_size"), dim("seq_len"), dim("n_layer"), dim("n_head"), dim("n_embd")};
  try {
    config.validate();
  } catch (const Error& e) {
    fail("{}: invalid model shape: {}", label, e.what());
  }
  // Before any reader allocates the parameters: a 64 KiB file whose /model says n_embd 131072
  // made load_model ask for 48 TB (found by fuzz/h5_readers.cpp).
  const size_t n = ParameterLayout::gpt2(config).size();
  check_fits_file(file, uint64_t{n} * sizeof(float),
                  fmt::format("the {} float32 parameters of the shape in /model (n_layer {}, "
                              "n_embd {}, vocab_size {}, seq_len {})",
                              n, config.n_layer, config.n_embd, config.vocab_size, config.seq_len),
                  label);
  return config;
}

}  // namespace ddiloco::h5
