// Checkpoints of a multi-unit job: one HDF5 file per role (serial HDF5, one writing rank per
// file), a manifest written last (docs/checkpoints.md, "Checkpoints and resume").
//
// <checkpoint.dir>/ckpt_<id, 8 digits>/
//   unit_<u>.h5   written by unit u's leader at a step boundary (diloco: a round boundary)
//   syncer.h5     written by the syncer once every unit has written its file, so that the
//                 syncer's state is the newest part of the checkpoint
//   manifest.json written last, atomically: the checkpoint is complete once it exists and
//                 every file it lists has the size and checksum it records
// Every file goes to a temporary name, is fsynced and renamed. Layout (h5py-readable):
//   syncer.h5  attrs format = "ddiloco-checkpoint", format_version, role = "syncer", id, mode,
//              config (the effective YAML), units, fragments, h, merges, tokens, elapsed_s,
//              next_eval, run_seed, chaos_seed
//              /model (attrs, as in model files)  /params/<tensor> Θ (float32, GPT-2 shapes)
//              /outer_momentum/<tensor> v of outer Nesterov SGD (float32)
//              /outer/versions int64 (P): merges per fragment
//              /outer/merged_seq int64 (M, P): sequence number of the last snapshot of unit u
//                merged into Θ_p (0: none); numbers go on across resumed jobs
//              /outer/grace float64 (7): grace-window averages (GraceWindow::state)
//   unit_<u>.h5 attrs format, format_version, role = "unit", id, unit, ranks, step, tokens,
//              schedule_step, rejoins, lost (1: down after a crash, no parameters), run_seed,
//              sample_rng (mode single only: the sampler's generator, Rng::state text),
//              log_loss_sum, log_steps (the losses since the unit's last train event)
//              /model  /params/<tensor> θ  /adamw/m/<tensor>  /adamw/v/<tensor> (attr step)
//              /outer/{c_steps, c_tok, sent_step, last_seq, sent_c_steps, sent_c_tok} int64 (P)
//              /outer/sent_theta_<p> float32 (numel of fragment p; outer.apply = carry only)
//              /outer/wire_ref_version int64 (P), /outer/wire_ref_<p> float32: the unit's
//                wire-format reference R of each fragment and its version (−1: none; lossy
//                wan.format only; sync_window.hpp); /outer/wire_residual_<p> float32: its
//                error-feedback residual E (where it has one)
//              /data/cursor int64 (ranks, 2): epoch and batch of each rank's training stream
// Mode single (one unit, no syncer) writes unit_0.h5 (one fragment, its counters 0) and the
// manifest, no syncer.h5 (single_checkpoints.hpp).
// String attributes are fixed-length (h5::write_attr); the readers refuse a file of an
// earlier version, whose strings were variable-length, naming the file and the attribute.
// Random state: nothing random during training keeps hidden state. The data order is a
// function of (run.seed, epoch, position) — the cursor restores it exactly — the model's
// initialisation of run.seed, and the fault schedule of chaos.seed; both seeds are saved.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <span>
#include <vector>

#include "ddiloco/config.hpp"
#include "ddiloco/data_loader.hpp"
#include "ddiloco/model.hpp"

namespace ddiloco::checkpoint {

inline constexpr int64_t kFormatVersion = 1;

/// <root>/ckpt_<id as 8 digits>.
std::filesystem::path directory(const std::filesystem::path& root, int64_t id);
std::filesystem::path unit_file(const std::filesystem::path& dir, int unit);
std::filesystem::path syncer_file(const std::filesystem::path& dir);

/// The syncer's state. Flat buffers are in ParameterLayout::gpt2(model) order.
struct SyncerState {
  int64_t id = 0;
  std::string mode;
  std::string config_yaml;
  GptConfig model;
  int units = 0, fragments = 0, h = 0;
  std::vector<float> theta, momentum;  ///< Θ and the outer momentum v, flat
  std::vector<int64_t> versions;       ///< (P)
  std::vector<int64_t> merged_seq;     ///< (M × P), row-major
  std::vector<double> grace;           ///< (7)
  int64_t merges = 0, tokens = 0, next_eval = 0, run_seed = 0, chaos_seed = 0;
  double elapsed_s = 0;
  /// Every field (a read back file equals what was written, tests/unit/test_checkpoint.cpp).
  bool operator==(const SyncerState&) const = default;
};

/// A learner unit's state, written by its leader (every rank of a unit holds the same θ and
/// AdamW state; only the data cursors differ).
struct UnitState {
  int64_t id = 0;
  int unit = 0;
  GptConfig model;
  bool lost = false;  ///< down after a crash: no parameters (the unit restarts from Θ)
  int64_t step = 0, tokens = 0, schedule_step = -1, rejoins = 0, run_seed = 0;
  std::vector<float> params, adam_m, adam_v;  ///< flat; empty when lost
  int64_t adam_step = 0;
  /// Per fragment (P): inner steps and tokens since its last merge was applied; the step its
  /// snapshot in flight was sent (−1: none); the sequence number of its last snapshot; the
  /// counters that snapshot carried.
  std::vector<int64_t> c_steps, c_tok, sent_step, last_seq, sent_c_steps, sent_c_tok;
  std::vector<std::vector<float>> sent_theta;  ///< carry: each fragment as last sent
  /// Lossy wire formats: each fragment's reference R as the unit holds it and its version
  /// (−1: none); empty when the file has none.
  std::vector<int64_t> wire_ref_version;
  std::vector<std::vector<float>> wire_ref;
  std::vector<std::vector<float>> wire_residual;  ///< per fragment: E (empty: none)
  std::vector<DataCursor> cursors;             ///< per rank of the unit
  std::string sample_rng;  ///< mode single: the sampler's Rng::state (empty: none)
  /// The sum of the losses of the steps since the unit's last `train` event, and their count,
  /// so that a resumed run logs the same means (0 and 0: none).
  double log_loss_sum = 0;
  int64_t log_steps = 0;
  /// Every field (a read back file equals what was written, tests/unit/test_checkpoint.cpp).
  bool operator==(const UnitState&) const = default;
};

/// Write a state into `dir` atomically (temporary file, fsync, rename); `write_delay_ms` (a
/// test hook) pauses halfway through. Throw Error naming the file on failure.
void write_syncer(const std::filesystem::path& dir, const SyncerState& state,
                  int write_delay_ms = 0);
/// A unit file is written once: returns false, writing nothing, when `dir` already holds this
/// unit's file (the syncer linked in an older one while the unit was silent).
bool write_unit(const std::filesystem::path& dir, const UnitState& state);
/// The tokens a unit file records (its `tokens` attribute).
int64_t unit_tokens(const std::filesystem::path& file);
/// Its /outer/last_seq (P values).
std::vector<int64_t> unit_last_seq(const std::filesystem::path& file, int fragments);

/// Does the unit's file hold its wire-format reference of fragment p at `version` (the
/// checkpoint's version of Θ_p)? Then a resumed unit and the syncer both take it as R;
/// otherwise both take the checkpoint's Θ_p.
bool has_reference(const UnitState& unit, int p, int64_t version);

/// Read and validate a file (format, version, role, every shape against /model and the
/// fragment count). Throw Error naming the file and what is wrong. For a unit file,
/// `fragment_numel` (one per fragment, protocol::FragmentPlan's numel) makes every
/// per-fragment vector (sent_theta, wire_ref, wire_residual) exactly its fragment long, as a
/// resume needs: without it they need only agree with each other (inspect).
SyncerState read_syncer(const std::filesystem::path& file);
UnitState read_unit(const std::filesystem::path& file, int fragments, std::span<const size_t> fragment_numel = {});

/// Writes manifest.json last: id, the job's shape (mode, model, units and their ranks,
/// fragments) and every file of `dir` with its size (bytes) and checksum.
void write_manifest(const std::filesystem::path& dir, int64_t id, const Config& config,
                    const nlohmann::json& summary);

/// Checks a checkpoint directory: manifest present and valid, every listed file present with
/// its recorded size and checksum. Returns the manifest; throws Error naming the problem.
nlohmann::json verify(const std::filesystem::path& dir);

/// Throws Error naming the first field in which the checkpoint's job differs from `config`
/// (model shape, mode, run.seed, units.count, a unit's ranks, outer.fragments). Mode single runs on any
/// number of ranks: its caller compares them (single_checkpoints.hpp).
void check_compatible(const nlohmann::json& manifest, const Config& config,
                      const std::filesystem::path& dir);

/// The checkpoint that `resume` names, verified and checked against `config`: "auto" is the
/// newest complete one under checkpoint.dir (the skipped ones printed as warnings), or none
/// ("" returned, "starting fresh" printed); anything else is a checkpoint directory. Throws
/// Error naming the directory and what is wrong.
std::string choose(const Config& config, const std::string& resume);

/// The newest complete checkpoint under `root` (highest id whose verify() passes), or none;
/// every newer one that is incomplete or corrupt is skipped with a line in `warnings`.
/// Returns its directory and manifest.
struct Found {
  std::filesystem::path dir;
  nlohmann::json manifest;
};
std::optional<Found> find_latest(const std::filesystem::path& root, std::vector<std::string>& warnings);

/// Deletes all but the newest `keep` complete checkpoints under `root`, and incomplete ones
/// older than the newest complete one.
void prune(const std::filesystem::path& root, int keep);

/// Creates `root` if needed and checks that files can be written there; throws Error naming
/// checkpoint.dir otherwise (called at set-up, before training).
void check_directory(const std::filesystem::path& root);

/// Highest id of any ckpt_<id> directory under `root` (complete or not), 0 if none.
int64_t highest_id(const std::filesystem::path& root);

/// What `ddiloco inspect` prints: a checkpoints root (every checkpoint and its status), a
/// checkpoint directory (manifest, then each file's attributes and datasets), or one file.
std::string describe(const std::filesystem::path& path);

}  // namespace ddiloco::checkpoint
