// The `ddiloco` subcommands. Each returns the process exit status and throws ddiloco::Error
// for anything the user can fix.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ddiloco::cli {

struct PrepareDataOptions {
  std::string source = "kjv";  // kjv | brown | files
  std::string out;             // default data/<source>
  std::string raw_dir = "data/raw";
  double val_fraction = 0.05;
  int64_t shard_tokens = 100'000'000;
  std::vector<std::string> files;
};
int prepare_data(const PrepareDataOptions& options);

struct BenchModelOptions {
  std::string config;
  std::vector<std::string> overrides;
  int steps = 10;
  int warmup = 2;
};
/// Forward + backward + AdamW throughput on random tokens; last line "tokens_per_s=<n>".
int bench_model(const BenchModelOptions& options);

// bench gpu: include/ddiloco/gpu/bench_gpu.hpp (its options live with the GPU code that reads them).

struct BenchCheckpointOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::string dir;  // default: checkpoint.dir of the config
  int repeats = 3;
};
/// Checkpoint write/verify/read times of the config's model beside one inner step; last line
/// "unit_pause_steps=<n>" (a unit's pause to write its file, in inner steps).
int bench_checkpoint(const BenchCheckpointOptions& options);

struct BenchLinkOptions {
  std::vector<size_t> sizes = {4096, size_t{1} << 20, size_t{16} << 20};  // bytes per operation
  // A merge: the syncer's get + put of one fragment. 832 KiB = the largest of the 4 fragments
  // of configs/kjv_decoupled.yaml's model (842,496 fp32 parameters, fragments.hpp's split:
  // 212,992 × 4 B); 8 MiB, a fragment of a ~8M-parameter model.
  std::vector<size_t> merge_sizes = {size_t{832} << 10, size_t{8} << 20};
  std::vector<std::string> modes = {"trusted", "authenticated", "encrypted"};  // wan.security
  double seconds = 0.5;  // per operation and size, each transport
  std::string tls;       // UCX_TLS of the trusted mode; "" = the environment's, else tcp
  bool no_mpi = false;   // the link modes only
  // Hidden modes the command starts itself in: the MPI half under mpirun, the unit of a mode
  // (modes: its one mode; the run's secret in the environment, DDILOCO_BENCH_LINK_SECRET).
  bool mpi = false;
  std::string serve;  // the syncer's address: be the unit process
  size_t bytes = 0;   // its exposed memory
};
/// Between two processes on 127.0.0.1, for each link mode (link.hpp: trusted, authenticated,
/// encrypted, through listen_for_units / expose_to_syncer) beside MPI passive-target RMA
/// (mpirun -np 2): get and put throughput (MB/s), the median 8-byte fetch round trip (µs) and
/// the median merge (the syncer's get + put of a fragment, ms); ratios to trusted.
int bench_link(const BenchLinkOptions& options);

struct SimulateOptions {
  std::string config;
  std::vector<std::string> overrides;
  bool sweep = false;      // the grid sweep.chips × strategies
  bool json = false;       // JSON instead of tables
  bool list = false;       // print the keys
  bool markdown = false;   // --list as a Markdown table
  bool calibrate = false;  // fit the unstated parameters to the paper's column
};
/// The goodput simulator (simulate.hpp): a table or JSON per strategy, or the sweep grid.
int simulate(const SimulateOptions& options);

struct BenchSimulateOptions {
  std::string config;
  std::vector<std::string> overrides;
  double budget_s = 10;  // the acceptance budget of one simulated run
};
/// Real time of one simulated run per strategy beside the budget; last line
/// "slowest_run_s=<s> budget_s=<s> ratio=<r>"; exit status 1 when over budget.
int bench_simulate(const BenchSimulateOptions& options);

struct StatusOptions {
  std::string run_dir;
  bool json = false;      // print /api/state as it came
  double watch_s = 0;     // > 0: redraw every this many seconds until interrupted
  double timeout_s = 5;   // per request
};
/// `ddiloco status RUN_DIR`: the status page's table in the terminal, from the syncer's
/// /api/state at the address in RUN_DIR/syncer.http (docs/status_page.md). Exit 0; throws
/// Error when there is no such file or the syncer does not answer. With watch_s > 0 it asks
/// until SIGINT/SIGTERM (then exit 0), reading the file again each time, so that it follows a
/// syncer the launcher restarted; meanwhile it shows why there is no answer.
int status(const StatusOptions& options);
/// The table `ddiloco status` prints for one /api/state answer. Fields missing or of another
/// type are shown as "-" (the answer is a peer's: never trusted to be well formed).
std::string format_status(const nlohmann::json& state);

}  // namespace ddiloco::cli
