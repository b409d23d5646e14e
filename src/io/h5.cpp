#include "io/h5.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>

#include "ddiloco/error.hpp"
#include "ddiloco/run_dir.hpp"

namespace ddiloco::h5 {

namespace {

// HDF5 prints its error stack to stderr by default; we report our own one-line errors.
struct SilenceHdf5 {
  SilenceHdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }
};
void silence() { static SilenceHdf5 once; }

std::string dims_text(const std::vector<hsize_t>& d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + (d.size() == 1 ? ",)" : ")");
}

// `why`: what to add to the error when HDF5 refuses it.
void write_attr_scalar(hid_t obj, const std::string& name, hid_t file_type, hid_t mem_type,
                       const void* value, const std::string& why = "") {
  silence();
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  Handle attr(H5Acreate2(obj, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT),
              H5Aclose);
  if (attr.get() < 0 || H5Awrite(attr, mem_type, value) < 0)
    fail("HDF5: cannot write attribute '{}'{}", name, why);
}

// A scalar attribute: one element. Every attribute ddiloco writes is one, and a reader that
// trusted the file would let an array overflow the single value it reads into.
Handle open_attr(hid_t obj, const std::string& name, const std::string& label) {
  silence();
  if (H5Aexists(obj, name.c_str()) <= 0) fail("{}: missing attribute '{}'", label, name);
  Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
  if (attr.get() < 0) fail("{}: cannot open attribute '{}'", label, name);
  Handle space(H5Aget_space(attr), H5Sclose);
  const hssize_t n = space.get() < 0 ? -1 : H5Sget_simple_extent_npoints(space);
  if (n != 1) fail("{}: attribute '{}' has {} elements, expected a scalar", label, name, static_cast<int64_t>(n));
  return attr;
}

// The chunk shape ddiloco writes for `dims`: at most 2^24 elements along the first dimension
// (HDF5 caps a chunk at 4 GiB), whole along the others. Empty when the dataset is not chunked
// (a scalar, or a dimension of 0: contiguous storage).
std::vector<hsize_t> chunk_shape(const std::vector<hsize_t>& dims) {
  for (auto d : dims)
    if (d == 0) return {};
  if (dims.empty()) return {};
  std::vector<hsize_t> chunk = dims;
  hsize_t row = 1;
  for (size_t i = 1; i < dims.size(); ++i) row *= dims[i];
  chunk[0] = std::max<hsize_t>(1, std::min<hsize_t>(dims[0], (hsize_t{1} << 24) / row));
  return chunk;
}

// Chunked storage with HDF5's Fletcher-32 checksum filter: a flipped byte on disk makes the
// read fail instead of returning wrong numbers.
Handle checksummed_layout(const std::vector<hsize_t>& dims) {
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  const std::vector<hsize_t> chunk = chunk_shape(dims);
  if (chunk.empty()) return dcpl;
  H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
  H5Pset_fletcher32(dcpl);
  return dcpl;
}

template <typename T>
void write_data(hid_t loc, const std::string& name, const T* data,
                const std::vector<hsize_t>& dims, hid_t file_type, hid_t mem_type) {
  silence();
  Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  Handle dcpl = checksummed_layout(dims);
  Handle set(H5Dcreate2(loc, name.c_str(), file_type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT),
             H5Dclose);
  if (set.get() < 0 || H5Dwrite(set, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    fail("HDF5: cannot write dataset '{}'", name);
}

// Refuses a dataset stored in a way ddiloco never writes, before H5Dread: ddiloco writes
// contiguous storage (and h5repack -l CONTI makes it), or chunks of chunk_shape(dims) with
// Fletcher-32 or no filter, each holding the chunk's bytes (+ 4 for the checksum). libhdf5
// 1.10.8 copies a chunk's declared size out of what its filters returned without comparing
// the two, so a chunk that declares more than it holds is read out of bounds (a SEGV, a
// heap-buffer-overflow in H5Dread: a corrupt chunk shape or element size, or a planted chunk
// whose checksum or compressed stream covers fewer bytes); compact, virtual or external
// storage would read what the file declares, other files included.
void check_storage(hid_t set, const std::string& name, const std::vector<hsize_t>& dims,
                   const std::string& label) {
  Handle dcpl(H5Dget_create_plist(set), H5Pclose);
  const H5D_layout_t layout = dcpl.get() < 0 ? H5D_LAYOUT_ERROR : H5Pget_layout(dcpl);
  if (layout != H5D_CHUNKED && layout != H5D_CONTIGUOUS)
    fail("{}: dataset '{}' has storage layout {}, expected chunked or contiguous (corrupt or not "
         "written by ddiloco)",
         label, name, static_cast<int>(layout));
  if (H5Pget_external_count(dcpl) != 0)
    fail("{}: dataset '{}' is stored in external files, expected in the file itself", label, name);
  if (layout != H5D_CHUNKED) return;
  const std::vector<hsize_t> expected = chunk_shape(dims);
  std::vector<hsize_t> chunk(dims.size() + 1);
  const int rank = H5Pget_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
  chunk.resize(std::max(rank, 0));
  if (expected.empty() || chunk != expected)
    fail("{}: dataset '{}' has chunks of shape {}, expected {} for shape {} (corrupt or not "
         "written by ddiloco)",
         label, name, dims_text(chunk), expected.empty() ? "none" : dims_text(expected),
         dims_text(dims));
  bool checksum = false;
  const int filters = H5Pget_nfilters(dcpl);
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0;
    size_t n_values = 0;
    const H5Z_filter_t filter = H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &n_values,
                                               nullptr, 0, nullptr, nullptr);
    if (filter != H5Z_FILTER_FLETCHER32 || checksum)
      fail("{}: dataset '{}' has filter {}, expected only Fletcher-32 (corrupt or not written by "
           "ddiloco)",
           label, name, static_cast<int>(filter));
    checksum = true;
  }
  if (filters < 0) fail("{}: dataset '{}' has an unreadable filter pipeline", label, name);
  Handle type(H5Dget_type(set), H5Tclose);
  const size_t element = type.get() < 0 ? 0 : H5Tget_size(type);
  hsize_t bytes = element;
  for (auto c : chunk) bytes *= c;
  // Chunks lie along the first dimension only (chunk_shape); at most 2^24-element steps.
  std::vector<hsize_t> at(dims.size(), 0);
  for (hsize_t row = 0; row < dims[0]; row += chunk[0]) {
    at[0] = row;
    unsigned mask = 0;
    haddr_t addr = HADDR_UNDEF;
    hsize_t stored = 0;
    if (H5Dget_chunk_info_by_coord(set, at.data(), &mask, &addr, &stored) < 0 ||
        addr == HADDR_UNDEF)
      fail("{}: dataset '{}' has no chunk at row {} (corrupt or truncated)", label, name, row);
    const hsize_t want = bytes + (checksum && (mask & 1u) == 0 ? 4 : 0);
    if (element == 0 || stored != want)
      fail("{}: dataset '{}' has a chunk at row {} of {} bytes, expected {} (corrupt or not "
           "written by ddiloco)",
           label, name, row, static_cast<uint64_t>(stored), static_cast<uint64_t>(want));
  }
}

template <typename T>
void read_data(hid_t loc, const std::string& name, T* data, const std::vector<hsize_t>& dims,
               const std::string& label, hid_t mem_type) {
  const auto found = dataset_dims(loc, name, label);
  if (found != dims)
    fail("{}: dataset '{}' has shape {}, expected {}", label, name, dims_text(found),
         dims_text(dims));
  Handle set(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (set.get() < 0) fail("{}: cannot open dataset '{}'", label, name);
  check_storage(set, name, dims, label);
  if (H5Dread(set, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    fail("{}: cannot read dataset '{}' (corrupt: its checksum does not match, or the file is "
         "truncated)",
         label, name);
}

}  // namespace

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    close_ = o.close_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void Handle::reset() {
  if (id_ >= 0 && close_ != nullptr) close_(id_);
  id_ = H5I_INVALID_HID;
}

namespace {
// Closing a file also closes every object still open in it, so that an error in the middle of
// writing leaves nothing for the library's exit handler to trip over.
Handle strong_close_access() {
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);
  return fapl;
}
}  // namespace

Handle create_file(const std::filesystem::path& path) {
  silence();
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  Handle fapl = strong_close_access();
  // HDF5 opens by name and follows symlinks: with H5F_ACC_TRUNC a symlink planted at `path`
  // would have it truncate and overwrite the file it points to. So: remove whatever is there,
  // then H5F_ACC_EXCL, which the sec2 driver opens with O_CREAT | O_EXCL (fails on any entry,
  // a symlink included, never follows it). Residual race, harmless: something planted between
  // the two may be opened by HDF5's tentative open (read-write, no create, no truncate, no
  // write), after which the O_EXCL open fails and we report it.
  remove_entry(path);
  Handle f(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl), H5Fclose);
  std::error_code ec;
  if (f.get() < 0 && std::filesystem::exists(std::filesystem::symlink_status(path, ec)))
    fail("{}: reappeared right after it was removed; refusing to write through it (another "
         "process writes there: check who can write to {})",
         path.string(), path.parent_path().string());
  if (f.get() < 0) fail("{}: cannot create HDF5 file", path.string());
  return f;
}

void close_file(Handle& file, const std::filesystem::path& path) {
  const hid_t id = file.get();
  file.release();
  if (H5Fclose(id) < 0) fail("{}: writing the file failed (disk full?)", path.string());
}

Handle open_file(const std::filesystem::path& path) {
  silence();
  if (!std::filesystem::exists(path)) fail("{}: file not found", path.string());
  Handle fapl = strong_close_access();
  Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), H5Fclose);
  if (f.get() < 0) fail("{}: not an HDF5 file, or truncated/corrupt", path.string());
  return f;
}

Handle open_image(std::span<const std::byte> image, const std::string& label) {
  silence();
  if (image.empty()) fail("{}: not an HDF5 file (empty)", label);
  Handle fapl = strong_close_access();
  // The core driver over a copy of the image (H5Pset_file_image copies it), never written back.
  if (H5Pset_fapl_core(fapl, 1 << 16, /*backing_store=*/false) < 0 ||
      H5Pset_file_image(fapl, const_cast<std::byte*>(image.data()), image.size()) < 0)
    fail("{}: cannot set up HDF5's in-memory file driver", label);
  Handle f(H5Fopen(label.c_str(), H5F_ACC_RDONLY, fapl), H5Fclose);
  if (f.get() < 0) fail("{}: not an HDF5 file, or truncated/corrupt", label);
  return f;
}

void check_fits_file(hid_t obj, uint64_t bytes, const std::string& what, const std::string& label) {
  Handle file(H5Iget_file_id(obj), H5Fclose);
  hsize_t size = 0;
  if (file.get() < 0 || H5Fget_filesize(file, &size) < 0)
    fail("{}: cannot get the size of the file", label);
  if (bytes > size)
    fail("{}: {} take {} bytes, more than the whole file ({} bytes): corrupt or not written by "
         "ddiloco",
         label, what, bytes, static_cast<uint64_t>(size));
}

Handle create_group(hid_t parent, const std::string& name, const std::string& label) {
  silence();
  Handle g(H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (g.get() < 0) fail("{}: cannot create group '{}'", label, name);
  return g;
}

Handle open_group(hid_t parent, const std::string& name, const std::string& label) {
  silence();
  if (!exists(parent, name)) fail("{}: missing group '{}'", label, name);
  Handle g(H5Gopen2(parent, name.c_str(), H5P_DEFAULT), H5Gclose);
  if (g.get() < 0) fail("{}: cannot open group '{}'", label, name);
  return g;
}

size_t link_count(hid_t group) {
  H5G_info_t info{};
  if (H5Gget_info(group, &info) < 0) return 0;
  return static_cast<size_t>(info.nlinks);
}

bool has_attr(hid_t obj, const std::string& name) {
  silence();
  return H5Aexists(obj, name.c_str()) > 0;
}

bool exists(hid_t parent, const std::string& name) {
  silence();
  return H5Lexists(parent, name.c_str(), H5P_DEFAULT) > 0;
}

void write_attr(hid_t obj, const std::string& name, int64_t value) {
  write_attr_scalar(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}
void write_attr(hid_t obj, const std::string& name, double value) {
  write_attr_scalar(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}
void write_attr(hid_t obj, const std::string& name, const std::string& value) {
  silence();
  // Fixed-length (the string's own bytes, null-padded; at least 1), never H5T_VARIABLE: a
  // variable-length string lives in a global heap, whose readers in libhdf5 1.10 hang,
  // overflow or allocate gigabytes on a corrupt file (docs/fuzzing.md).
  if (value.size() > kMaxStringAttrBytes)
    fail("HDF5: attribute '{}' is {} bytes, more than the {} a string attribute may hold", name,
         value.size(), kMaxStringAttrBytes);
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  if (type.get() < 0 || H5Tset_size(type, std::max<size_t>(value.size(), 1)) < 0 ||
      H5Tset_strpad(type, H5T_STR_NULLPAD) < 0 || H5Tset_cset(type, H5T_CSET_UTF8) < 0)
    fail("HDF5: cannot make the string type of attribute '{}'", name);
  // c_str(): an empty string still gives the one byte (its terminator) the type holds.
  write_attr_scalar(
      obj, name, type, type, value.c_str(),
      fmt::format(" ({} bytes; an HDF5 attribute holds at most 64 KiB)", value.size()));
}

int64_t read_attr_int(hid_t obj, const std::string& name, const std::string& label) {
  Handle attr = open_attr(obj, name, label);
  Handle type(H5Aget_type(attr), H5Tclose);
  if (H5Tget_class(type) != H5T_INTEGER)
    fail("{}: attribute '{}' must be an integer", label, name);
  int64_t v = 0;
  if (H5Aread(attr, H5T_NATIVE_INT64, &v) < 0)
    fail("{}: attribute '{}' is not an integer", label, name);
  return v;
}

double read_attr_double(hid_t obj, const std::string& name, const std::string& label) {
  Handle attr = open_attr(obj, name, label);
  Handle type(H5Aget_type(attr), H5Tclose);
  if (H5Tget_class(type) != H5T_FLOAT && H5Tget_class(type) != H5T_INTEGER)
    fail("{}: attribute '{}' must be a number", label, name);
  double v = 0;
  if (H5Aread(attr, H5T_NATIVE_DOUBLE, &v) < 0)
    fail("{}: attribute '{}' is not a number", label, name);
  return v;
}

std::string read_attr_string(hid_t obj, const std::string& name, const std::string& label) {
  Handle attr = open_attr(obj, name, label);
  Handle file_type(H5Aget_type(attr), H5Tclose);
  if (file_type.get() < 0 || H5Tget_class(file_type) != H5T_STRING)
    fail("{}: attribute '{}' is not a string", label, name);
  // libhdf5 1.10 cannot read a variable-length string of an untrusted file safely (its global
  // heap reader hangs, reads out of bounds, or allocates what the corrupt file declares), and
  // nothing tells a file ddiloco wrote from a planted one; such files are refused, unread.
  if (H5Tis_variable_str(file_type) != 0)
    fail("{}: attribute '{}' is a variable-length string: the file was written by a ddiloco "
         "before fixed-length string attributes, a format this version no longer reads (libhdf5 "
         "cannot read it safely); convert a file you trust with scripts/h5_fixed_strings.py {}",
         label, name, label);
  const size_t n = H5Tget_size(file_type);
  const H5T_cset_t cset = H5Tget_cset(file_type);
  if (n == 0 || (cset != H5T_CSET_ASCII && cset != H5T_CSET_UTF8))
    fail("{}: attribute '{}' has a corrupt string type (size {}, character set {})", label, name,
         n, static_cast<int>(cset));
  if (n > kMaxStringAttrBytes)
    fail("{}: attribute '{}' declares a string of {} bytes, over the {} bytes a string "
         "attribute may hold: corrupt or not written by ddiloco",
         label, name, n, kMaxStringAttrBytes);
  check_fits_file(obj, n, fmt::format("attribute '{}'", name), label);
  // Read into a null-terminated type one byte longer than the file's, of its character set
  // (HDF5 converts no other), whatever its padding: HDF5 ends the string with a terminator.
  Handle mem_type(H5Tcopy(H5T_C_S1), H5Tclose);
  if (mem_type.get() < 0 || H5Tset_size(mem_type, n + 1) < 0 ||
      H5Tset_strpad(mem_type, H5T_STR_NULLTERM) < 0 || H5Tset_cset(mem_type, cset) < 0)
    fail("{}: cannot make a type to read attribute '{}'", label, name);
  std::string s(n + 1, '\0');
  if (H5Aread(attr, mem_type, s.data()) < 0) fail("{}: cannot read attribute '{}'", label, name);
  s.resize(std::strlen(s.c_str()));
  return s;
}

void write_dataset(hid_t loc, const std::string& name, const float* data,
                   const std::vector<hsize_t>& dims) {
  write_data(loc, name, data, dims, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT);
}
void write_dataset(hid_t loc, const std::string& name, const double* data,
                   const std::vector<hsize_t>& dims) {
  write_data(loc, name, data, dims, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE);
}
void write_dataset(hid_t loc, const std::string& name, const int64_t* data,
                   const std::vector<hsize_t>& dims) {
  write_data(loc, name, data, dims, H5T_STD_I64LE, H5T_NATIVE_INT64);
}

void read_dataset(hid_t loc, const std::string& name, float* data,
                  const std::vector<hsize_t>& dims, const std::string& label) {
  read_data(loc, name, data, dims, label, H5T_NATIVE_FLOAT);
}
void read_dataset(hid_t loc, const std::string& name, double* data,
                  const std::vector<hsize_t>& dims, const std::string& label) {
  read_data(loc, name, data, dims, label, H5T_NATIVE_DOUBLE);
}
void read_dataset(hid_t loc, const std::string& name, int64_t* data,
                  const std::vector<hsize_t>& dims, const std::string& label) {
  read_data(loc, name, data, dims, label, H5T_NATIVE_INT64);
}

std::vector<hsize_t> dataset_dims(hid_t loc, const std::string& name, const std::string& label) {
  silence();
  if (!exists(loc, name)) fail("{}: missing dataset '{}'", label, name);
  Handle set(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (set.get() < 0) fail("{}: cannot open dataset '{}'", label, name);
  Handle space(H5Dget_space(set), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank < 0) fail("{}: dataset '{}' has no simple shape", label, name);
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  return dims;
}

bool fsync_and_publish(const std::filesystem::path& tmp, const std::filesystem::path& path,
                       bool replace) {
  const int fd = ::open(tmp.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot reopen to sync: {}", tmp.string(), std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail("{}: fsync failed: {}", tmp.string(), std::strerror(errno));
  // Neither rename() nor link() follows a symlink at `path`: rename replaces the entry, link
  // fails on it. Only the temporary had to be created with care (create_file).
  if (replace) {
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) fail("{}: cannot rename from {}: {}", path.string(), tmp.string(), ec.message());
  } else {
    // link() never replaces: of two writers, the first complete file stays.
    const bool linked = ::link(tmp.c_str(), path.c_str()) == 0;
    const int err = errno;
    ::unlink(tmp.c_str());
    if (!linked && err == EEXIST) return false;
    if (!linked) fail("{}: cannot link from {}: {}", path.string(), tmp.string(), std::strerror(err));
  }
  sync_directory(path.parent_path());
  return true;
}

}  // namespace ddiloco::h5
