// Minimal RAII and typed helpers over HDF5's C API (serial library, one writer per file).
// Every failure throws ddiloco::Error naming the file and the object.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace ddiloco::h5 {

/// Owns an hid_t and closes it with the matching H5*close.
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Handle(Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  void reset();
  /// Gives up ownership without closing.
  void release() { id_ = H5I_INVALID_HID; }
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

/// Creates `path` afresh (a temporary): removes whatever entry is there, then creates it with
/// H5F_ACC_EXCL, so that a symlink or file planted at the name is never written through.
/// Throws Error naming the file when it cannot be created or reappeared meanwhile.
Handle create_file(const std::filesystem::path& path);
/// Opens read-only; throws Error("<path>: not an HDF5 file or unreadable") on failure.
Handle open_file(const std::filesystem::path& path);
/// Opens an HDF5 file image held in memory read-only, as open_file opens a file (HDF5's core
/// driver over a copy of `image`, no backing file); `label` names it in errors. Used by the
/// fuzz targets (fuzz/h5_readers.cpp) to feed the readers without temporary files.
Handle open_image(std::span<const std::byte> image, const std::string& label);
/// Throws Error unless `bytes`, what a reader is about to allocate for `what` (a count read
/// from the file: a shape, a dimension), fit in the file that holds `obj`: ddiloco never
/// compresses, so a corrupt or planted count must not make it allocate more than the file holds.
void check_fits_file(hid_t obj, uint64_t bytes, const std::string& what, const std::string& label);
Handle create_group(hid_t parent, const std::string& name, const std::string& label);
Handle open_group(hid_t parent, const std::string& name, const std::string& label);
bool exists(hid_t parent, const std::string& name);
/// Whether `obj` has an attribute `name`.
bool has_attr(hid_t obj, const std::string& name);
/// Number of members of a group.
size_t link_count(hid_t group);

/// The most bytes a string attribute may hold, written or read: HDF5 itself refuses an
/// attribute over 64 KiB in the file format ddiloco writes, and a reader allocates what a
/// (corrupt) file declares only below this bound.
inline constexpr size_t kMaxStringAttrBytes = size_t{1} << 20;

void write_attr(hid_t obj, const std::string& name, int64_t value);
void write_attr(hid_t obj, const std::string& name, double value);
/// Writes a scalar fixed-length string attribute (H5T_C_S1, UTF-8, null-padded, size = the
/// string's bytes, at least 1; never variable-length, so no global heap). Throws Error naming
/// the attribute when `value` is over kMaxStringAttrBytes or HDF5 cannot store it (over 64 KiB).
void write_attr(hid_t obj, const std::string& name, const std::string& value);
int64_t read_attr_int(hid_t obj, const std::string& name, const std::string& label);
double read_attr_double(hid_t obj, const std::string& name, const std::string& label);
/// Reads a scalar fixed-length string attribute (any padding, ASCII or UTF-8), up to its first
/// null byte. Throws Error naming `label` and `name` when it is missing, not a scalar string,
/// declares over kMaxStringAttrBytes or more than the file holds, or is variable-length (the
/// format of files written by earlier ddiloco versions, which libhdf5 1.10 cannot read safely:
/// the message says to convert them with scripts/h5_fixed_strings.py).
std::string read_attr_string(hid_t obj, const std::string& name, const std::string& label);

/// Writes an N-d dataset (row-major dims) of float32 / float64 / int64, chunked with a
/// Fletcher-32 checksum so that corruption on disk fails the read.
void write_dataset(hid_t loc, const std::string& name, const float* data,
                   const std::vector<hsize_t>& dims);
void write_dataset(hid_t loc, const std::string& name, const double* data,
                   const std::vector<hsize_t>& dims);
void write_dataset(hid_t loc, const std::string& name, const int64_t* data,
                   const std::vector<hsize_t>& dims);
/// Reads a dataset whose shape must equal `dims`, converting its elements to the buffer's
/// type; throws Error naming label/name, the shape found and the shape expected. It also
/// throws, before reading, for storage ddiloco never writes: anything but contiguous or
/// chunked in write_dataset's own chunk shape with Fletcher-32 (or no filter), each chunk
/// holding exactly its bytes (libhdf5 1.10 reads past a chunk that holds fewer).
void read_dataset(hid_t loc, const std::string& name, float* data,
                  const std::vector<hsize_t>& dims, const std::string& label);
void read_dataset(hid_t loc, const std::string& name, double* data,
                  const std::vector<hsize_t>& dims, const std::string& label);
void read_dataset(hid_t loc, const std::string& name, int64_t* data,
                  const std::vector<hsize_t>& dims, const std::string& label);
/// Shape of a dataset.
std::vector<hsize_t> dataset_dims(hid_t loc, const std::string& name, const std::string& label);

/// Writes `write(file)` into `<path>.tmp`, closes and fsyncs it, then renames it over `path`:
/// readers see the old file or the complete new one, never a partial one. With `replace`
/// false an existing `path` wins: nothing is written and false is returned (write-once files:
/// the first complete one stays).
template <typename Fn>
bool write_atomically(const std::filesystem::path& path, Fn&& write, bool replace = true);
/// fsync, then rename over `path` (or, without `replace`, link to `path` unless it exists:
/// false then), then fsync of the directory.
bool fsync_and_publish(const std::filesystem::path& tmp, const std::filesystem::path& path,
                       bool replace);

/// Closes a file, reporting a failed final flush (which the destructor cannot).
void close_file(Handle& file, const std::filesystem::path& path);

template <typename Fn>
bool write_atomically(const std::filesystem::path& path, Fn&& write, bool replace) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  try {
    Handle file = create_file(tmp);
    write(file.get());
    close_file(file, tmp);
    return fsync_and_publish(tmp, path, replace);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);  // never leave a partial file behind
    throw;
  }
}

}  // namespace ddiloco::h5
