#include "ddiloco/model_io.hpp"


#include "ddiloco/error.hpp"
#include "io/h5.hpp"
#include "io/readers.hpp"
#include "io/tensors.hpp"

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
    h5::write_model_shape(file, config, path.string());
    h5::write_tensors(file, "params", layout, params);
  });
}

LoadedModel load_model(const fs::path& path) { return load_model(h5::open_file(path), path.string()); }

LoadedModel load_model(h5::Handle file, const std::string& label) {
  const std::string format = h5::read_attr_string(file, "format", label);
  if (format != "ddiloco-model")
    fail("{}: format is '{}', expected 'ddiloco-model' (a checkpoint? pass its directory or its "
         "syncer.h5)",
         label, format);
  const int64_t version = h5::read_attr_int(file, "format_version", label);
  if (version != kModelFormatVersion)
    fail("{}: format_version {} is not supported (expected {})", label, version,
         kModelFormatVersion);
  LoadedModel loaded;
  loaded.config = h5::read_model_shape(file, label);
  const ParameterLayout layout = ParameterLayout::gpt2(loaded.config);
  loaded.params.resize(layout.size());
  h5::read_tensors(file, "params", layout, loaded.params, label);
  try {
    loaded.metadata = nlohmann::json::parse(h5::read_attr_string(file, "metadata", label));
  } catch (const nlohmann::json::exception&) {
    fail("{}: attribute 'metadata' is not valid JSON", label);
  }
  return loaded;
}

}  // namespace ddiloco
