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
#include <cstring>
#include <algorithm>
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

// Known finding in libhdf5 1.10.8 (Debian 12), not in ddiloco: reading a variable-length
// string (every string attribute of ours) loads its global heap collection ("GCOL"), and
// H5HG__cache_heap_deserialize loops forever on an object of index 0 and size 0 inside it
// (it steps by the object's size). A corrupt file thus hangs the readers; HDF5 ≥ 1.14 refuses
// it. Inputs with such a collection are skipped so that the target finds anything else.
bool hangs_libhdf5(const uint8_t* data, size_t size) {
  auto u16 = [&](size_t i) { return static_cast<uint64_t>(data[i] | (data[i + 1] << 8)); };
  auto u64 = [&](size_t i) {
    uint64_t v = 0;
    for (int k = 7; k >= 0; --k) v = (v << 8) | data[i + k];
    return v;
  };
  for (size_t at = 0; at + 16 <= size; ++at) {
    if (std::memcmp(data + at, "GCOL", 4) != 0) continue;
    const uint64_t end = at + std::min<uint64_t>(u64(at + 8), size - at);
    for (uint64_t p = at + 16; p + 16 <= end;) {
      const uint64_t idx = u16(p), obj = u64(p + 8);
      const uint64_t need = idx > 0 ? 16 + ((obj + 7) & ~uint64_t{7}) : obj;
      if (need == 0) return true;
      if (need > end - p) break;
      p += need;
    }
  }
  return false;
}

// Known finding in libhdf5, not in ddiloco (docs/fuzzing.md): H5Aread of a variable-length
// string allocates and touches the length its heap ID declares (a uint32 before the 8-byte
// address of its global heap collection) before it reads the heap. Inputs with a reference to
// a collection that declares more than the collection holds are skipped, so that the target
// is not stopped by this one again and again (-rss_limit_mb).
bool overallocates_libhdf5(const uint8_t* data, size_t size) {
  auto u32 = [&](size_t i) { uint32_t v; std::memcpy(&v, data + i, 4); return v; };
  auto u64 = [&](size_t i) { uint64_t v; std::memcpy(&v, data + i, 8); return v; };
  for (size_t at = 0; at + 16 <= size; ++at) {
    if (std::memcmp(data + at, "GCOL", 4) != 0) continue;
    const uint64_t collection = u64(at + 8);
    // Heap IDs in attribute data (8-aligned in ddiloco's files): length, address, index ≥ 1.
    for (size_t i = 4; i + 12 <= size; i += 8)
      if (u64(i) == at && u32(i - 4) > collection && u32(i + 8) >= 1) return true;
  }
  return false;
}

}  // namespace

// libhdf5 allocates a variable-length string's conversion buffer at the length its heap ID
// declares before it reads the heap: a corrupt length of terabytes makes that malloc fail,
// which libhdf5 reports as a failed H5Aread (ddiloco: Error "cannot read attribute"). ASan
// aborts on such a request by default; here it returns null, as glibc does. (A request over
// -rss_limit_mb that does succeed is still reported by libFuzzer.)
extern "C" const char* __asan_default_options() {
  // and a small quarantine: libhdf5 frees such a buffer at once, and the default quarantine
  // would keep its gigabytes resident across inputs until -rss_limit_mb stops the run.
  return "allocator_may_return_null=1:quarantine_size_mb=16";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (hangs_libhdf5(data, size) || overallocates_libhdf5(data, size)) return 0;
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
