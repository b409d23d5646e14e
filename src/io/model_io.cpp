#include "ddiloco/model_io.hpp"

#include <algorithm>
#include <climits>
#include <cmath>

#include "ddiloco/error.hpp"
#include "io/h5.hpp"

namespace ddiloco {

namespace fs = std::filesystem;

void save_model(const fs::path& path, const GptConfig& config, std::span<const float> params,
                const nlohmann::json& metadata) {
  const ParameterLayout layout = ParameterLayout::gpt2(config);
  if (params.size() != layout.size())
    fail("save_model: {} parameters given, the model has {}", params.size(), layout.size());
  h5::write_atomically(path, [&](hid_t file) {
    h5::write_attr(file, "format", std::string("ddiloco-model"));
    h5::write_attr(file, "format_version", kModelFormatVersion);
    h5::write_attr(file, "metadata", metadata.dump());
    h5::Handle model = h5::create_group(file, "model", path.string());
    h5::write_attr(model, "vocab_size", int64_t{config.vocab_size});
    h5::write_attr(model, "seq_len", int64_t{config.seq_len});
    h5::write_attr(model, "n_layer", int64_t{config.n_layer});
    h5::write_attr(model, "n_head", int64_t{config.n_head});
    h5::write_attr(model, "n_embd", int64_t{config.n_embd});
    h5::Handle group = h5::create_group(file, "params", path.string());
    for (const auto& t : layout.tensors())
      h5::write_dataset(group, t.name, params.data() + t.offset,
                        std::vector<hsize_t>(t.shape.begin(), t.shape.end()));
  });
}

LoadedModel load_model(const fs::path& path) {
  const std::string label = path.string();
  h5::Handle file = h5::open_file(path);
  const std::string format = h5::read_attr_string(file, "format", label);
  if (format != "ddiloco-model")
    fail("{}: format is '{}', expected 'ddiloco-model' (a checkpoint? pass its model file)",
         label, format);
  const int64_t version = h5::read_attr_int(file, "format_version", label);
  if (version != kModelFormatVersion)
    fail("{}: format_version {} is not supported (expected {})", label, version,
         kModelFormatVersion);
  LoadedModel loaded;
  h5::Handle model = h5::open_group(file, "model", label);
  auto dim = [&](const char* name) {
    const int64_t v = h5::read_attr_int(model, name, label + ":/model");
    if (v < 1 || v > INT32_MAX) fail("{}: /model attribute {} = {} is out of range", label, name, v);
    return static_cast<int>(v);
  };
  loaded.config = {dim("vocab_size"), dim("seq_len"), dim("n_layer"), dim("n_head"),
                   dim("n_embd")};
  try {
    loaded.config.validate();
  } catch (const Error& e) {
    fail("{}: invalid model shape: {}", label, e.what());
  }
  const ParameterLayout layout = ParameterLayout::gpt2(loaded.config);
  loaded.params.resize(layout.size());
  h5::Handle group = h5::open_group(file, "params", label);
  if (h5::link_count(group) != layout.tensors().size())
    fail("{}: /params holds {} tensors, the shape in /model (n_layer = {}) has {}", label,
         h5::link_count(group), loaded.config.n_layer, layout.tensors().size());
  for (const auto& t : layout.tensors()) {
    h5::read_dataset(group, t.name, loaded.params.data() + t.offset,
                     std::vector<hsize_t>(t.shape.begin(), t.shape.end()), label + ":/params");
    const float* p = loaded.params.data() + t.offset;
    if (!std::all_of(p, p + t.numel, [](float x) { return std::isfinite(x); }))
      fail("{}: tensor '{}' holds NaN or infinite values", label, t.name);
  }
  try {
    loaded.metadata = nlohmann::json::parse(h5::read_attr_string(file, "metadata", label));
  } catch (const nlohmann::json::exception&) {
    fail("{}: attribute 'metadata' is not valid JSON", label);
  }
  return loaded;
}

}  // namespace ddiloco
