// Run configuration: YAML files with `--set key=value` overrides, validated before use.
//
// Every key is declared once (name, type, default, documentation, range check) in
// src/config/config.cpp; `ddiloco config --list` prints them all. Loading rejects unknown keys,
// values of the wrong type and values out of range with a one-line message naming the source
// (file or --set), the key and what was expected, e.g.
//   configs/x.yaml: train.lr: must be > 0, got -0.001
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddiloco/model.hpp"

namespace ddiloco {

struct RunConfig {
  std::string dir = "runs/default";  ///< metrics.jsonl, config.yaml, model.h5 go here
  int64_t seed = 1337;               ///< model init and data order
  int threads = 0;                   ///< OpenMP threads per rank; 0 = cores / ranks per node
  int log_every = 10;                ///< steps between train-loss lines
  bool progress = true;              ///< progress bar on rank 0 when stdout is a terminal
  /// Where learner units train: cpu | cuda (one GPU per learner rank, chosen by node-local
  /// rank; needs a binary built with the cuda preset). The syncer always runs on the CPU.
  std::string device = "cpu";
  /// GPU attention kernels: auto (= cublas: 46.2 ms per step against flash's 55.7 ms for
  /// GPT-2 124M, B=16, T=1024 on an H200) | flash (head size 64, seq_len % 64 == 0; keeps no
  /// (B,NH,T,T) probabilities) | cublas. Only with device: cuda.
  std::string gpu_attention = "auto";
};

struct DataConfig {
  std::string train = "data/kjv/train_*.bin";  ///< glob of training shards
  std::string val = "data/kjv/val_*.bin";      ///< glob of validation shards
  bool shuffle = true;                         ///< permute shards and batches every epoch
};

struct TrainConfig {
  int batch_size = 16;       ///< sequences per rank per step
  int64_t steps = 2000;      ///< inner optimizer steps
  double lr = 3e-3;          ///< peak learning rate
  int64_t warmup_steps = 100;
  double min_lr_frac = 0.1;  ///< final lr = lr · min_lr_frac (cosine decay)
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  ///< max global gradient norm; 0 disables clipping
};

struct EvalConfig {
  int64_t every_steps = 200;        ///< validation loss cadence; 0 = only at the end
  int64_t val_tokens = 65536;       ///< size of the fixed validation set, tokens
  int64_t sample_every_steps = 0;   ///< text sample cadence; 0 = only at the end
  int sample_tokens = 200;          ///< tokens generated per sample
  std::string sample_prompt = "And God said";
  double temperature = 0.8;
};

/// How the ranks train together (see docs/training.md "Modes").
enum class Mode { single, ddp, diloco, streaming, decoupled };
const char* mode_name(Mode mode);

/// What each mode is, as data: the one table (config.cpp, mode_traits) that validation, the
/// outer plan (outer_plan.hpp), the command line and the deployments ask, in place of
/// comparisons of the mode scattered through the code.
struct ModeTraits {
  /// Learner units and a syncer process (single: one unit of all the job's ranks, none).
  bool has_syncer = true;
  /// An outer loop: snapshots, merges, checkpoints, rejoins (ddp all-reduces gradients
  /// every step across units instead; single has none).
  bool outer_steps = true;
  /// The units all-reduce gradients every step over the links between them (ddp): one MPI
  /// world, host buffers, fp32 or bf16 on the wire.
  bool gradient_ring = false;
  /// outer.fragments and outer.overlap apply (streaming, decoupled; the others use P = 1,
  /// τ = 0).
  bool fragments = false;
  /// A merge needs a quorum of K units and the grace window, not every unit (decoupled): a
  /// refused snapshot (debug.nan_unit) cannot stall the job.
  bool quorum = false;
  /// The job ends on a token budget counted over all units (decoupled), not train.steps.
  bool token_budget = false;
  /// Rounds are counted in steps and every unit ends on the same one, the syncer names it
  /// (diloco): a crashed unit redoes its round, and a train.steps that is not a whole number
  /// of rounds leaves an unsynchronised tail.
  bool rounds_in_steps = false;
  /// A unit that crashes or diverges starts over from Θ while the others go on (streaming
  /// cannot yet: its synchronous merges would wait for the lost snapshot).
  bool can_rejoin = false;
};
const ModeTraits& mode_traits(Mode mode);

/// Learner units: world rank 0 is the syncer, the others form units in order.
struct UnitsConfig {
  /// Most learner units a job may have: far beyond any job (each unit is a process or more), and
  /// low enough that what is kept or drawn per unit while a config is validated stays small.
  static constexpr int kMaxCount = 1 << 16;
  int count = 1;                 ///< M, in [1, kMaxCount]
  int ranks_per_unit = 1;        ///< used when `ranks` is empty
  std::vector<int> ranks;        ///< ranks of each unit (may differ); empty = ranks_per_unit
  std::vector<double> slowdown;  ///< per-unit compute slow-down factor ≥ 1 (straggler emulation)
  int zero = 0;                  ///< 1: AdamW's state sharded over a unit's ranks (ZeRO-1, zero.hpp)
};

/// The outer loop: fragments, schedule, merge and outer optimizer.
struct OuterConfig {
  int fragments = 1;          ///< P
  int h = 50;                 ///< inner steps between two synchronisations of a fragment
  int overlap = 0;            ///< τ: a merged fragment is applied τ steps after it was sent
  double lr = 0.7;            ///< η of outer Nesterov SGD
  double momentum = 0.9;      ///< μ
  std::string merge = "rda";  ///< rda | mean
  /// overwrite (θ ← Θ, docs/algorithm.md) | blend (θ ← α·θ + (1−α)·Θ) | carry
  /// (θ ← Θ + (θ − θ_sent): the τ steps made since the snapshot are kept, and the next
  /// snapshot carries them with their steps and tokens)
  std::string apply = "overwrite";
  double blend_alpha = 0.5;   ///< blend: θ ← α·θ + (1−α)·Θ
  /// What a unit's outer gradient is measured from: current (the syncer's Θ now,
  /// docs/algorithm.md) | base (the Θ version the unit last received; not with apply: blend) |
  /// reference (that version as the unit decoded it, the reference R its snapshot was sent
  /// against: Δ is then exactly the decoded message; needed where R lags Θ, wan.format: sparse).
  std::string anchor = "current";
  /// A merge of some of the units steps by their share of the live units' tokens per step
  /// (merge.hpp); no effect on merges of every unit (the synchronous modes, but for the final
  /// flush of an interrupted job).
  bool share_steps = true;
  /// Post-local SGD (Lin et al., "Don't use large mini-batches, use local SGD", ICLR 2020):
  /// over the first `warmup_steps` inner steps every fragment is synchronised after every
  /// step and applied at once (H = 1, τ = 0), and each such merge is a plain average
  /// (η = 1, μ = 0; the momentum stays untouched); H local steps start after it. 0 = off.
  int warmup_steps = 0;
};

struct SyncerConfig {
  int quorum = 1;               ///< K: minimum fresh units before a merge (decoupled)
  double grace_gamma = 0.5;     ///< γ of the adaptive grace window
  double grace_cap_steps = 1.0; ///< grace window cap, in (median) inner-step times
  int eval_every = 2;           ///< outer rounds (H inner steps) between global evaluations
  int poll_max_us = 20000;      ///< longest sleep between idle polls (they also stay ≤ step/16)
  double heartbeat_timeout_s = 5;  ///< silent this long (or 3 of its steps) → out of quorums
  /// A snapshot more than this many versions of its fragment behind is refused (0: any).
  int max_staleness = 0;
  /// In a merge of n ≥ 2 units, a unit weighs at most as if it had made this many times the
  /// others' median inner steps (0: no cap; merge.hpp cap_weights). Bounds one unit's share of
  /// a merge of equal-batch units at κ/(κ + n − 1).
  double max_weight_ratio = 4;
  /// A unit's outer gradient per inner step is scaled down to at most this many times the
  /// units' median vote (0: no bound; merge.hpp OuterGradientBound).
  double max_outer_grad_ratio = 8;
  /// Isolated deployment (`ddiloco syncer` / `ddiloco unit`, docs/deployments.md "Fault isolation"):
  std::string listen = "127.0.0.1:0";  ///< syncer: IPv4 address:port to listen on (0 = any port)
  /// syncer: where the status page and /metrics are served (docs/status_page.md), IPv4
  /// address:port; "" = off (under `ddiloco launch`: 127.0.0.1:0), "off" = off there too
  std::string http;
  std::string address;                 ///< unit: the syncer's ip:port; "" = run.dir/syncer.addr
  double connect_wait_s = 300;         ///< unit: how long to wait for the syncer, seconds
  double link_timeout_s = 10;          ///< syncer: an operation silent this long closes the link
  double link_min_mbit_s = 80;         ///< syncer: the slowest unit link its waits allow for
  bool signal_stops_units = true;      ///< syncer: a stop signal ends the units too
  /// syncer restarted mid-run: how long it waits for K units' copies of Θ before it goes on
  /// with the best it has (docs/deployments.md "The syncer dying"), seconds
  double recover_timeout_s = 60;
};

/// Fault injection (include/ddiloco/chaos.hpp has the model). Off unless a rate is > 0 or a
/// schedule file is given.
struct ChaosConfig {
  int64_t seed = 1;             ///< seed of the schedule (independent of run.seed)
  double horizon_s = 3600;      ///< faults are drawn over [0, horizon_s) seconds
  std::vector<int> units;       ///< units that may fail; empty = all
  double crash_mtbf_s = 0;      ///< mean up-time between crashes per unit, s; 0 = none
  double down_min_s = 5;        ///< down-time after a crash: uniform in [min, max], s
  double down_max_s = 15;
  double slow_mtbf_s = 0;       ///< mean gap between straggler episodes, s; 0 = none
  double slow_duration_s = 20;  ///< length of one episode, s
  double slow_factor = 3;       ///< inner steps take this many times as long
  double link_mtbf_s = 0;       ///< mean gap between link degradations, s; 0 = none
  double link_duration_s = 20;
  double link_factor = 0.1;     ///< fraction of the bandwidth left
  /// The bandwidth a link degradation scales where wan.* leaves a unit's link unlimited,
  /// Mbit/s (10 MB/s); a limited link's is its wan.bandwidth_mbit_s (unit_links.hpp).
  static constexpr double kNominalLinkMbitS = 80;
  std::string schedule_file;    ///< YAML schedule to replay instead of drawing one

  bool enabled() const {
    return crash_mtbf_s > 0 || slow_mtbf_s > 0 || link_mtbf_s > 0 || !schedule_file.empty();
  }
};

/// Emulated WAN links between each unit and the rest of the job (include/ddiloco/wan.hpp), and
/// the wire format of what crosses them (include/ddiloco/wire_format.hpp).
struct WanConfig {
  double bandwidth_mbit_s = 0;   ///< each unit's link, each direction, Mbit/s; 0 = unlimited
  double latency_ms = 0;         ///< one-way latency of each unit's link
  double jitter_ms = 0;          ///< extra one-way delay, uniform in [0, jitter_ms]
  double burst_kb = 64;          ///< token-bucket depth, KiB
  std::vector<double> unit_bandwidth_mbit_s;  ///< per-unit bandwidth (overrides; empty = all)
  std::vector<double> unit_latency_ms;        ///< per-unit latency (overrides; empty = all)
  /// What crosses the links: fp32 | bf16 | int8 | int4 | int2 | sparse (wire_format.hpp).
  /// Outer modes send θ − base and the merged Θ − what the unit holds (quantized against a
  /// base both sides hold); ddp sends its gradients (fp32 or bf16 only).
  std::string format = "bf16";
  /// The isolated deployment's link (link.hpp, docs/security.md): auto | trusted |
  /// authenticated | encrypted; auto is encrypted beyond loopback, else authenticated.
  std::string security = "auto";
  int block = 64;                ///< values per scale (int8, int4, int2)
  int chunk = 4096;              ///< sparse: values per chunk, [1, 2^24]
  int topk = 64;                 ///< sparse: values kept per chunk, [1, chunk]
  int down_topk = 0;             ///< sparse: values kept per chunk going down, [0, chunk]; 0 = topk
  int value_bits = 2;            ///< sparse: bits per kept value, 2 | 4 | 8
  /// Error-feedback decay β ∈ [0, 1]: a snapshot carries β × what the previous one's encoding
  /// lost (SparseLoCo, arXiv 2508.15706); 1 = all of it.
  double ef_decay = 1.0;

  /// Unit u's bandwidth (Mbit/s) and one-way latency (ms): its per-unit entry when the list
  /// is given, else the value for every unit (wan::link_spec makes its link of them).
  double bandwidth_of(int u) const {
    return unit_bandwidth_mbit_s.empty() ? bandwidth_mbit_s
                                         : unit_bandwidth_mbit_s[static_cast<size_t>(u)];
  }
  double latency_of(int u) const {
    return unit_latency_ms.empty() ? latency_ms : unit_latency_ms[static_cast<size_t>(u)];
  }
  /// Is the link of any of units 0 … units − 1 limited (a bandwidth, a latency or jitter
  /// set)? wan::emulated; here, beside the keys, so that validate() needs no transport.
  bool emulated(int units) const;
};

/// Checkpoints (docs/checkpoints.md "Checkpoints and resume"): HDF5 files per role under
/// <dir>/ckpt_<id>/, manifest.json written last. Modes diloco, streaming and decoupled.
struct CheckpointConfig {
  int64_t every = 0;     ///< merges (modes single and ddp: inner steps) between two checkpoints; 0 = only at a stop
  /// seconds between two checkpoints (the first merge after), besides `every`; 0 = none. On
  /// by default: what a syncer that loses every unit too can lose at most.
  double every_s = 60;
  std::string dir;       ///< where checkpoints go; empty = <run.dir>/checkpoints
  int keep = 3;          ///< complete checkpoints kept (older ones are deleted)
  bool at_stop = true;   ///< a checkpoint when the job stops (signal, token budget, last step)

  bool enabled() const { return every > 0 || every_s > 0 || at_stop; }
  /// The effective directory for a run directory.
  std::string directory(const std::string& run_dir) const {
    return dir.empty() ? run_dir + "/checkpoints" : dir;
  }
};

/// The isolated deployment's supervisor, `ddiloco launch` (include/ddiloco/launch.hpp): the
/// syncer and each unit's MPI job as separate processes, restarted when they fail.
struct LaunchConfig {
  int max_restarts = 10;       ///< restarts per process (syncer, each unit job); 0 = never
  double backoff_s = 1;        ///< wait before a process's first restart, s; doubled each time
  double backoff_max_s = 30;   ///< ... up to this
  double drain_s = 30;         ///< after the syncer ended, units may exit by themselves this long
  std::string mpirun = "mpirun";         ///< the MPI launcher of each unit job
  std::vector<std::string> mpirun_args;  ///< extra arguments, before -np
};

/// Hooks that only tests use: they make a unit stall or the syncer slow, deterministically.
struct DebugConfig {
  int stall_unit = -1;             ///< unit that stalls (−1: none)
  int64_t stall_at_step = 0;       ///< ... after this inner step
  int64_t stall_until_merges = 0;  ///< ... until the syncer has made this many merges (or a stop)
  int64_t stall_after_checkpoints = 0;  ///< ... once it has written this many checkpoint files
  int syncer_read_delay_ms = 0;    ///< syncer pauses between a snapshot's header and its data
  bool crash_during_read = false;  ///< a due crash waits until the syncer begins a read of ours
  int nan_unit = -1;               ///< unit whose leader's parameters turn NaN (−1: none) ...
  int64_t nan_at_step = 0;         ///< ... before its first snapshot from this step on
  int checkpoint_write_delay_ms = 0;  ///< the syncer pauses inside its checkpoint file's
                                      ///< write of checkpoint 2 (the run's second)
};

struct Config {
  Mode mode = Mode::single;
  RunConfig run;
  GptConfig model;
  DataConfig data;
  TrainConfig train;
  EvalConfig eval;
  UnitsConfig units;
  OuterConfig outer;
  SyncerConfig syncer;
  ChaosConfig chaos;
  CheckpointConfig checkpoint;
  WanConfig wan;
  LaunchConfig launch;
  DebugConfig debug;

  /// Ranks of unit u (units.ranks[u], or units.ranks_per_unit).
  int unit_ranks(int u) const;
  /// Tokens one inner step of unit u processes: batch_size · seq_len · its ranks.
  int64_t unit_tokens_per_step(int u) const;
  /// Tokens one inner step of every unit makes together (Σ_u unit_tokens_per_step(u)).
  int64_t job_tokens_per_step() const;
  /// A multi-unit job's token budget: train.steps · job_tokens_per_step().
  int64_t token_budget() const { return train.steps * job_tokens_per_step(); }
  /// World ranks the configuration needs: 1 syncer + Σ unit ranks; −1 for mode single, which
  /// runs on any number of ranks (they form the one unit).
  int world_size() const;
};

/// Reads `path` (may be empty: defaults only), applies "key=value" overrides in order, and
/// validates the result. Throws Error naming the file/--set, key and expected value.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

/// Like load_config, from YAML text (a checkpoint's effective configuration); `source` names
/// it in errors.
Config load_config_text(const std::string& yaml, const std::string& source,
                        const std::vector<std::string>& overrides = {});

/// Applies one "key=value" override (`source` names it in errors, e.g. "--set").
void apply_override(Config& config, const std::string& assignment, const std::string& source);

/// Cross-field checks (heads divide width, ...). Throws Error prefixed by `source`.
/// The checks of a section whose rules live above this layer are made here, in order, by the
/// functions its module exports: chaos::validate (chaos.hpp) and, for run.device: cuda, the
/// installed DeviceCheck (below).
void validate(const Config& config, const std::string& source);

/// What validate() checks when run.device is cuda (what a GPU learner unit cannot run). The
/// GPU unit backend installs it with itself (gpu::register_unit_backend,
/// include/ddiloco/unit_backend.hpp), so that the rules stay with the GPU code and this
/// layer knows none of them. None installed (a binary built without CUDA): validate() refuses
/// run.device: cuda. Throws Error (unprefixed; validate() adds the source). Set once at
/// start-up, before any configuration is read; nullptr uninstalls it.
using DeviceCheck = void (*)(const Config& config);
void set_cuda_check(DeviceCheck check);

/// The effective configuration as YAML (every key, defaults included): what load_config
/// would read back to the same Config.
std::string to_yaml(const Config& config);

/// Documentation of every key: name, default value, description.
struct ConfigKeyDoc {
  std::string key, default_value, doc;
};
/// Every key with its value in `config` (defaults when not given), and its meaning.
std::vector<ConfigKeyDoc> config_keys(const Config& config = Config{});

/// The keys `config` sets away from their defaults that its mode, or its wire format, does not
/// use, one line each naming the key, its value, the mode or format and why (e.g.
/// "outer.fragments = 4 is ignored in mode diloco: it synchronises all of θ every H steps
/// (P = 1)", "wan.topk = 48 is ignored with wan.format = int4: only wan.format: sparse uses
/// it"): a configuration written for one mode or format and run with another changes nothing
/// there without saying so otherwise.
std::vector<std::string> ignored_keys(const Config& config);
/// diloco only: when train.steps − outer.warmup_steps is not a multiple of outer.h, the steps
/// after the last merge (step W + k·H) are trained on and never merged into Θ, the model the
/// job evaluates and saves. Says how many and the nearest budgets without such a tail; empty
/// otherwise. (streaming and decoupled stagger their fragments, so some tail is inherent there.)
std::optional<std::string> unsynced_tail(const Config& config);
/// An outer mode sending `sparse` with outer.anchor: current: what the down link drops makes the
/// units' references lag Θ, and Δ measured from Θ counts that lag as progress (docs/results.md,
/// "Sparse outer gradients"). The line says so and names outer.anchor: reference; empty otherwise.
std::optional<std::string> sparse_anchor_note(const Config& config);
/// Prints ignored_keys(), unsynced_tail() and sparse_anchor_note() to stderr, one
/// "ddiloco: warning: ..." line each.
void warn_config(const Config& config);

}  // namespace ddiloco
