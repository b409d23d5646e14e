// The `ddiloco` subcommands. Each returns the process exit status and throws ddiloco::Error
// for anything the user can fix.
#pragma once

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

struct BenchCheckpointOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::string dir;  // default: checkpoint.dir of the config
  int repeats = 3;
};
/// Checkpoint write/verify/read times of the config's model beside one inner step; last line
/// "unit_pause_steps=<n>" (a unit's pause to write its file, in inner steps).
int bench_checkpoint(const BenchCheckpointOptions& options);

}  // namespace ddiloco::cli
