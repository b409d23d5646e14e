// The run directory (run.dir): where a training job writes its outputs.
#pragma once

#include <filesystem>
#include <string>

namespace ddiloco {

/// Checks that `dir` can hold a new run: creates it if missing; throws Error (naming run.dir)
/// when it is not a directory, cannot be created or written, or already holds a run
/// (metrics.jsonl) and `overwrite` is false. Touches nothing else.
void check_run_dir(const std::filesystem::path& dir, bool overwrite);

/// Removes a previous run's outputs from `dir` (metrics, unit logs, config, model, plots);
/// called once every input has been validated.
void clear_run_outputs(const std::filesystem::path& dir);

/// Writes `text` to `path` atomically: temporary file, fsync, rename, fsync of the directory.
/// Throws Error naming the file when any step fails; the old file is then untouched.
void write_text_atomically(const std::filesystem::path& path, const std::string& text);

/// fsync of a directory, so that a rename inside it survives a crash.
void sync_directory(const std::filesystem::path& dir);

}  // namespace ddiloco
