// The readers of model files and checkpoints on an HDF5 file already open (a file, or an
// in-memory image: h5::open_image): what load_model, read_syncer and read_unit do after
// opening their path. Internal: the fuzz targets (fuzz/h5_readers.cpp) feed them images.
#pragma once

#include <span>
#include <string>

#include "ddiloco/checkpoint.hpp"
#include "ddiloco/model_io.hpp"
#include "io/h5.hpp"

namespace ddiloco {

/// load_model(path) on `file`; `label` names it in errors.
LoadedModel load_model(h5::Handle file, const std::string& label);

namespace checkpoint {
/// read_syncer(path) and read_unit(path, ...) on `file`; `label` names it in errors.
SyncerState read_syncer(h5::Handle file, const std::string& label);
UnitState read_unit(h5::Handle file, const std::string& label, int fragments,
                    std::span<const size_t> fragment_numel = {});
}  // namespace checkpoint

}  // namespace ddiloco
