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
// corrupt input: docs/fuzzing.md). The target links HDF5 1.14 (scripts/hdf5_fuzz_lib.sh): the
// inputs of fuzz/libhdf5/ are Debian 12's libhdf5 1.10.8 failing on its own.
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

}  // namespace

// libhdf5 allocates some metadata (H5C__load_entry: an object header chunk of the size the
// file declares) before it reads it, and the read then fails against the end of the file: a
// failed open or read (ddiloco: an Error). glibc hands out a declared 20 GB as untouched
// pages; ASan aborts on such a request by default, and when told to return null it still
// maps and poisons a shadow of an eighth of it (2.6 GB resident for 20 GB, 5 s: the input
// fuzz/libhdf5/open_2600mb_20s.h5). Here a request of more than 2 GiB returns null, which
// libhdf5 also reports as a failed open; ddiloco's own readers allocate what they read only
// after check_fits_file. A small quarantine keeps freed blocks from staying resident across
// inputs until -rss_limit_mb stops the run.
extern "C" const char* __asan_default_options() {
  return "allocator_may_return_null=1:max_allocation_size_mb=2048:quarantine_size_mb=16";
}

// libhdf5 1.14.5's own leaks, with no ddiloco object in them: when H5Dopen2 fails in reading
// a corrupt layout or filter pipeline message (H5D__layout_oh_read), what it had allocated
// is lost (the pipeline copied by H5O__pline_copy, 64 bytes; H5D__chunk_init's chunk cache
// and B-tree info, 4 KB: fuzz/libhdf5/dataset_open_*_leak.h5). Those allocations are let
// through; any other leak, ddiloco's or the library's, is reported. (A dataset ddiloco opened
// and failed to close would be no leak: HDF5's identifier table still holds it.)
extern "C" const char* __lsan_default_suppressions() { return "leak:H5D__layout_oh_read\n"; }
extern "C" const char* __lsan_default_options() { return "print_suppressions=0"; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
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
