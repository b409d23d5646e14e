// Fuzz target: the HDF5 readers of model files and checkpoints (load_model,
// include/ddiloco/model_io.hpp; checkpoint::read_syncer and read_unit,
// include/ddiloco/checkpoint.hpp), i.e. `ddiloco eval/sample`, resume and `ddiloco inspect`.
//
// Feeds: the input as an HDF5 file image, opened in memory (h5::open_image: the core driver,
// no temporary file). As `ddiloco inspect` does (checkpoint::describe), the target reads the
// root's `format` (and, of a checkpoint, `role`) first and gives a fresh open of the image to
// the one reader that takes that file: load_model, read_syncer, or read_unit with the
// fragment count `ddiloco inspect` takes, the length of /outer/c_steps (1 when absent or not
// 1-d; at most 64). Every reader starts with that same check of `format` and `role`, so the
// others would refuse the file at once; the target just skips their opens (HDF5's per-file
// set-up is most of an execution's time).
// Checks: no crash or sanitizer report, no allocation beyond -rss_limit_mb (a small file must
// not make a reader allocate gigabytes); the only exception is ddiloco::Error. ddiloco's
// string attributes are fixed-length, and the readers refuse a variable-length one before
// libhdf5 reads its global heap (whose 1.10 code hangs, overflows and allocates gigabytes on
// corrupt input: docs/fuzzing.md). One kind of input is skipped: a libhdf5 bug that ddiloco
// cannot steer around (divides_by_zero_in_libhdf5, below).
#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "ddiloco/checkpoint.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/model_io.hpp"
#include "io/h5.hpp"
#include "io/readers.hpp"

using namespace ddiloco;

namespace {

int fragments_of(hid_t file) {
  try {
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

// Known finding in libhdf5 1.10.8 (Debian 12), not in ddiloco (docs/fuzzing.md): H5Dopen2 of a
// chunked dataset whose layout message is of version 1 or 2 (ddiloco's files hold version 3)
// with a chunk dimension of 0 divides by zero in H5D__chunk_set_info (SIGFPE); the library
// checks the dimensions of version 3 only, and nothing in its API reads a layout before
// H5Dopen2. Inputs with such a message are skipped so that the target finds anything else.
// The message, in a version-1 object header (ddiloco's): type 0x0008 (2 bytes), size (2),
// flags (1), 3 reserved (0); then version, rank + 1, class (2: chunked), 5 reserved, the
// 8-byte address and rank + 1 dimensions of 4 bytes.
bool divides_by_zero_in_libhdf5(const uint8_t* data, size_t size) {
  auto u32 = [&](size_t i) { uint32_t v; std::memcpy(&v, data + i, 4); return v; };
  for (size_t at = 0; at + 24 <= size; ++at) {
    const uint8_t* m = data + at;
    if (m[0] != 8 || m[1] != 0 || m[5] != 0 || m[6] != 0 || m[7] != 0) continue;
    if ((m[8] != 1 && m[8] != 2) || m[10] != 2) continue;
    for (size_t k = 0, p = at + 24; k < m[9] && p + 4 <= size; ++k, p += 4)
      if (u32(p) == 0) return true;
  }
  return false;
}

}  // namespace

// libhdf5 allocates some metadata (H5C_protect: an object's size as the file declares it)
// before it reads it: a corrupt size of exabytes makes that malloc fail, which libhdf5 reports
// as a failed open or read (ddiloco: an Error). ASan aborts on such a request by default; here
// it returns null, as glibc does. (A request over -rss_limit_mb that does succeed is still
// reported by libFuzzer.) A small quarantine keeps such freed blocks from staying resident
// across inputs until -rss_limit_mb stops the run.
extern "C" const char* __asan_default_options() {
  return "allocator_may_return_null=1:quarantine_size_mb=16";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (divides_by_zero_in_libhdf5(data, size)) return 0;
  const auto image = std::as_bytes(std::span(data, size));
  try {
    std::string role;
    int fragments = 1;
    {
      h5::Handle file = h5::open_image(image, "fuzz.h5");
      const std::string format = h5::read_attr_string(file, "format", "fuzz.h5");
      if (format == "ddiloco-model") {
        role = "model";
      } else if (format == "ddiloco-checkpoint") {
        role = h5::read_attr_string(file, "role", "fuzz.h5");
        if (role == "unit") fragments = fragments_of(file);
      }
    }
    if (role == "model") load_model(h5::open_image(image, "fuzz.h5"), "fuzz.h5");
    if (role == "syncer") checkpoint::read_syncer(h5::open_image(image, "fuzz.h5"), "fuzz.h5");
    if (role == "unit")
      checkpoint::read_unit(h5::open_image(image, "fuzz.h5"), "fuzz.h5", fragments);
  } catch (const Error&) {
  }
  return 0;
}
