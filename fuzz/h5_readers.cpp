// Fuzz target: the HDF5 readers of model files and checkpoints (load_model,
// include/ddiloco/model_io.hpp; checkpoint::read_syncer and read_unit,
// include/ddiloco/checkpoint.hpp), i.e. `ddiloco eval/sample`, resume and `ddiloco inspect`.
//
// Feeds: the input as an HDF5 file image, opened in memory (h5::open_image: the core driver,
// no temporary file) and given to each reader in turn (each refuses a file of another format
// or role at once): load_model, read_syncer, then read_unit with the fragment count that
// `ddiloco inspect` takes, the length of /outer/c_steps (1 when absent or not 1-d; at most 64).
// Checks: no crash or sanitizer report, no allocation beyond -rss_limit_mb (a small file must
// not make a reader allocate gigabytes); the only exception is ddiloco::Error.
#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "ddiloco/checkpoint.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/model_io.hpp"
#include "io/h5.hpp"
#include "io/readers.hpp"

using namespace ddiloco;

namespace {

int fragments_of(std::span<const std::byte> image) {
  try {
    h5::Handle file = h5::open_image(image, "fuzz.h5");
    if (!h5::exists(file, "outer")) return 1;
    h5::Handle outer = h5::open_group(file, "outer", "fuzz.h5");
    if (!h5::exists(outer, "c_steps")) return 1;
    const auto dims = h5::dataset_dims(outer, "c_steps", "fuzz.h5");
    if (dims.size() != 1 || dims[0] < 1 || dims[0] > 64) return 1;
    return static_cast<int>(dims[0]);
  } catch (const Error&) {
    return 1;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto image = std::as_bytes(std::span(data, size));
  try {
    load_model(h5::open_image(image, "fuzz.h5"), "fuzz.h5");
  } catch (const Error&) {
  }
  try {
    checkpoint::read_syncer(h5::open_image(image, "fuzz.h5"), "fuzz.h5");
  } catch (const Error&) {
  }
  try {
    checkpoint::read_unit(h5::open_image(image, "fuzz.h5"), "fuzz.h5", fragments_of(image));
  } catch (const Error&) {
  }
  return 0;
}
