// Config loading: every bad input stops with one line naming the source, key and expectation.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "ddiloco/config.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/unit_backend.hpp"
#include "temp_dir.hpp"

namespace ddiloco {
namespace {

std::string error_of(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  test::TempDir dir;
  test::write_bytes(dir / "c.yaml", yaml);
  try {
    load_config((dir / "c.yaml").string(), sets);
  } catch (const Error& e) {
    std::string msg = e.what();
    // Strip the temporary path so the expectations read clearly.
    const std::string prefix = (dir / "c.yaml").string();
    if (msg.starts_with(prefix)) msg = "c.yaml" + msg.substr(prefix.size());
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "multi-line error: " << msg;
    return msg;
  }
  return "no error";
}

TEST(Config, DefaultsAreValid) { EXPECT_NO_THROW(load_config("")); }

TEST(Config, ReadsSectionsAndOverrides) {
  test::TempDir dir;
  test::write_bytes(dir / "c.yaml",
                    "model:\n  n_layer: 6\n  n_embd: 192\n  n_head: 6\ntrain:\n  lr: 1e-3\n"
                    "data:\n  shuffle: false\n");
  const Config c = load_config((dir / "c.yaml").string(), {"train.lr=2e-3", "run.dir=out/x"});
  EXPECT_EQ(c.model.n_layer, 6);
  EXPECT_EQ(c.model.n_embd, 192);
  EXPECT_DOUBLE_EQ(c.train.lr, 2e-3);
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.run.dir, "out/x");
  EXPECT_EQ(c.train.batch_size, Config{}.train.batch_size);  // untouched default
}

TEST(Config, UnknownKeyIsNamedWithASuggestion) {
  EXPECT_EQ(error_of("train:\n  lrr: 0.1\n"), "c.yaml: unknown key 'train.lrr' (did you mean 'train.lr'?)");
  EXPECT_EQ(error_of("bogus:\n  x: 1\n"),
            "c.yaml: unknown key 'bogus' (`ddiloco config --list` shows the known keys)");
  EXPECT_EQ(error_of("", {"model.n_layers=3"}),
            "--set: unknown key 'model.n_layers' (did you mean 'model.n_layer'?)");
}

// chaos.link_mbps (MB/s) was a second knob for the bandwidth wan.bandwidth_mbit_s sets: a
// config that still sets it is told what replaced it, from a file or --set, and it is no longer
// listed or written out.
TEST(Config, RemovedKeyNamesItsReplacement) {
  const std::string advice =
      "chaos.link_mbps: removed: a degraded link's bandwidth is the unit's wan.bandwidth_mbit_s "
      "(Mbit/s = 8 × MB/s; setting it also emulates the link), or a nominal 80 Mbit/s (10 MB/s) "
      "where wan.* leaves the link unlimited; delete the key";
  EXPECT_EQ(error_of("chaos:\n  link_mbps: 20\n"), "c.yaml: " + advice);
  EXPECT_EQ(error_of("chaos.link_mbps: 2.5\n"), "c.yaml: " + advice);
  EXPECT_EQ(error_of("chaos:\n  link_mbps: fast\n"), "c.yaml: " + advice);
  EXPECT_EQ(error_of("", {"chaos.link_mbps=20"}), "--set: " + advice);
  // Its old default, which every effective configuration written before lists: accepted and
  // ignored, so that earlier run directories and checkpoints still load.
  EXPECT_EQ(error_of("chaos:\n  link_mbps: 10\n"), "no error");
  EXPECT_EQ(error_of("", {"chaos.link_mbps=10"}), "no error");
  // A removed key is never suggested for a near miss.
  EXPECT_EQ(error_of("chaos:\n  link_mbp: 10\n"),
            "c.yaml: unknown key 'chaos.link_mbp' (`ddiloco config --list` shows the known keys)");
  for (const auto& k : config_keys()) EXPECT_NE(k.key, "chaos.link_mbps");
  EXPECT_EQ(to_yaml(Config{}).find("link_mbps"), std::string::npos);
}

TEST(Config, LongUnknownKeyIsNamedWithoutASuggestion) {
  // Keys are compared with the known ones only while they can still be close (fuzz_config spent
  // most of its time computing full edit distances of long mutated keys).
  const std::string key(1000, 'x');  // YAML's longest plain key is 1024 characters
  EXPECT_EQ(error_of("train:\n  " + key + ": 1\n"),
            "c.yaml: unknown key 'train." + key + "' (`ddiloco config --list` shows the known keys)");
  EXPECT_EQ(error_of("", {"train." + key + "=1"}),
            "--set: unknown key 'train." + key + "' (`ddiloco config --list` shows the known keys)");
  EXPECT_EQ(error_of("model:\n  n_lay: 3\n"),
            "c.yaml: unknown key 'model.n_lay' (did you mean 'model.n_layer'?)");
}

// Found by reading what fuzz_config's slow inputs do: units.count had no upper bound, and
// validation loops over the units (mode single's WAN check looped 2·10^9 times before the unit
// count was checked against the mode; chaos allocated a rank count per unit).
TEST(Config, UnitCountIsBoundedBeforeAnyCheckLoopsOverTheUnits) {
  EXPECT_EQ(error_of("mode: single\nunits: {count: 2000000000}\n"),
            "c.yaml: units.count: must be in [1, 65536], got 2000000000");
  EXPECT_EQ(error_of("mode: decoupled\nunits: {count: 65537}\n"),
            "c.yaml: units.count: must be in [1, 65536], got 65537");
  Config built;  // in code: the table's check is not run, validate's is
  built.mode = Mode::decoupled;
  built.units.count = 1 << 20;
  try {
    validate(built, "code");
    ADD_FAILURE() << "units.count = 2^20 accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "code: units.count: must be in [1, 65536], got 1048576");
  }
}

TEST(Config, ConfigPathTheSystemRefusesIsAnError) {
  const std::string name(300, 'x');  // a file name over 255 bytes: ENAMETOOLONG, not "not found"
  try {
    load_config(name);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), name + ": config file cannot be looked up (File name too "
                                            "long); expected a readable YAML file");
  }
}

TEST(Config, BadValuesAreNamed) {
  EXPECT_EQ(error_of("train:\n  lr: -0.001\n"), "c.yaml: train.lr: must be > 0, got -0.001");
  EXPECT_EQ(error_of("model:\n  n_embd: 128\n  n_head: 5\n"),
            "c.yaml: model.n_head: must divide model.n_embd = 128, got 5");
  EXPECT_EQ(error_of("train:\n  batch_size: many\n"),
            "c.yaml: train.batch_size: expected an integer, got 'many'");
  EXPECT_EQ(error_of("train:\n  batch_size: 2.5\n"),
            "c.yaml: train.batch_size: expected an integer, got '2.5'");
  EXPECT_EQ(error_of("data:\n  shuffle: maybe\n"),
            "c.yaml: data.shuffle: expected true or false, got 'maybe'");
  EXPECT_EQ(error_of("train:\n  beta2: 1.0\n"), "c.yaml: train.beta2: must be in [0, 1), got 1.0");
  EXPECT_EQ(error_of("train:\n  lr: [1, 2]\n"),
            "c.yaml: train.lr: expected a single value, got '[1, 2]'");
  EXPECT_EQ(error_of("train: 3\n"), "c.yaml: train: is a section, expected a mapping of its keys, got '3'");
  EXPECT_EQ(error_of("", {"train.lr=-1"}), "--set: train.lr: must be > 0, got -1");
  EXPECT_EQ(error_of("", {"train.lr"}), "--set: expected key=value, got 'train.lr'");
  EXPECT_EQ(error_of("train:\n  lr: 0x10\n"), "c.yaml: train.lr: expected a finite number, got '0x10'");
  EXPECT_EQ(error_of("train:\n  batch_size: 3000000000\n"),
            "c.yaml: train.batch_size: out of range [-2147483648, 2147483647], got '3000000000'");
  EXPECT_EQ(error_of("train:\n  lr: 1\n  lr: 2\n"), "c.yaml: line 3: duplicate key 'train.lr'");
  EXPECT_EQ(error_of("", {"run.dir="}), "--set: run.dir: must not be empty, got ''");
  EXPECT_EQ(error_of("model: {n_embd: 600000000, n_head: 1}\n"),
            "c.yaml: model.n_embd: must be in [1, 262144], got 600000000");
  EXPECT_EQ(error_of("model: {seq_len: 100000}\ntrain: {batch_size: 64}\n").substr(0, 63),
            "c.yaml: train.batch_size: model and batch need about 38373 GiB ");
  EXPECT_NE(error_of("model: [unclosed\n").find("c.yaml: line"), std::string::npos);
}

TEST(Config, CheckpointEveryIsAcceptedInEveryMode) {
  EXPECT_EQ(load_config_text("mode: single\ncheckpoint: {every: 250}\n", "c.yaml").checkpoint.every, 250);
  EXPECT_EQ(load_config_text("mode: ddp\nunits: {count: 2}\ncheckpoint: {every: 250}\n", "c.yaml").checkpoint.every,
            250);
}

// run.device: cuda needs a GPU backend installed in the binary (the cuda preset's ddiloco);
// this test program links only the CPU library, like the CPU build's ddiloco.
TEST(Config, CudaDeviceIsRefusedWithoutACudaBuild) {
  ASSERT_FALSE(gpu::unit_backend_available());
  EXPECT_EQ(error_of("", {"run.device=cuda"}),
            "c.yaml with --set: run.device: cuda needs a ddiloco built with CUDA; build the cuda preset "
            "(cmake --preset cuda && cmake --build --preset cuda)");
  EXPECT_EQ(error_of("run: {device: cuda}\n"),
            "c.yaml: run.device: cuda needs a ddiloco built with CUDA; build the cuda preset "
            "(cmake --preset cuda && cmake --build --preset cuda)");
  EXPECT_EQ(error_of("", {"run.device=gpu"}), "--set: run.device: must be one of cpu, cuda, got gpu");
  EXPECT_EQ(error_of("", {"run.gpu_attention=fast"}),
            "--set: run.gpu_attention: must be one of auto, flash, cublas, cudnn, got fast");
  EXPECT_EQ(load_config("").run.device, "cpu");
  EXPECT_EQ(load_config("").run.gpu_attention, "auto");
}

// With a backend installed (a stand-in here: validation never calls it), what cuda refuses.
TEST(Config, CudaDeviceChecksWithABackend) {
  gpu::register_unit_backend([](const Config&, MPI_Comm, MPI_Comm, std::span<const float>)
                                 -> std::unique_ptr<gpu::UnitBackend> { return nullptr; });
  EXPECT_NO_THROW(load_config("", {"run.device=cuda", "mode=decoupled", "units.count=4"}));
  EXPECT_EQ(error_of("", {"run.device=cuda", "mode=ddp"}).substr(0, 68),
            "c.yaml with --set: run.device: cuda is not supported in mode ddp (it");
  EXPECT_EQ(error_of("", {"run.device=cuda", "run.gpu_attention=flash"}),
            "c.yaml with --set: run.gpu_attention: flash needs head size model.n_embd/model.n_head = 64 and "
            "model.seq_len a multiple of 64, got head size 32 and seq_len 128 (use auto or cublas)");
  // The checks come with the backend (gpu::validate, installed as config's DeviceCheck) and
  // go with it: without one, cuda is refused before them.
  gpu::register_unit_backend(nullptr);
  EXPECT_EQ(error_of("", {"run.device=cuda", "mode=ddp"}),
            "c.yaml with --set: run.device: cuda needs a ddiloco built with CUDA; build the cuda preset "
            "(cmake --preset cuda && cmake --build --preset cuda)");
}

gpu::UnitBackendFactory stand_in_backend() {
  return [](const Config&, MPI_Comm, MPI_Comm, std::span<const float>)
             -> std::unique_ptr<gpu::UnitBackend> { return nullptr; };
}

// run.gpu_attention: cudnn in a CUDA build without cuDNN: refused, naming what this build offers.
TEST(Config, CudnnAttentionNeedsACudnnBuild) {
  gpu::register_unit_backend(stand_in_backend());
  EXPECT_EQ(gpu::unit_backend_cudnn_version(), 0);
  EXPECT_EQ(error_of("", {"run.device=cuda", "run.gpu_attention=cudnn"}),
            "c.yaml with --set: run.gpu_attention: cudnn needs a ddiloco built with cuDNN 9 "
            "(CMake found none, or DDILOCO_CUDNN=OFF; docs/gpu.md, Learner units on GPUs); this build "
            "offers auto, cublas and flash");
  // On the CPU the key is not used, and not checked.
  EXPECT_NO_THROW(load_config("", {"run.gpu_attention=cudnn"}));
  gpu::register_unit_backend(nullptr);
}

// With cuDNN 9.19: the model's shape against cuDNN's SDPA limits (sdpa_shape.hpp).
TEST(Config, CudnnAttentionChecksTheShape) {
  gpu::register_unit_backend(stand_in_backend(), 91900);
  EXPECT_EQ(gpu::unit_backend_cudnn_version(), 91900);
  EXPECT_NO_THROW(load_config("", {"run.device=cuda", "run.gpu_attention=cudnn"}));
  EXPECT_EQ(error_of("", {"run.device=cuda", "run.gpu_attention=cudnn", "model.n_head=32"}),
            "c.yaml with --set: run.gpu_attention: cudnn cannot run this model: head size "
            "n_embd/n_head must be a multiple of 8, got 4 (use auto, cublas or flash)");
  EXPECT_EQ(error_of("", {"run.device=cuda", "run.gpu_attention=cudnn", "model.seq_len=1"}),
            "c.yaml with --set: run.gpu_attention: cudnn cannot run this model: the backward "
            "pass needs seq_len ≥ 2 (cuDNN refuses s_q = s_kv = 1) (use auto, cublas or flash)");
  gpu::register_unit_backend(nullptr);
  EXPECT_EQ(gpu::unit_backend_cudnn_version(), 0);
}

// auto = cublas (faster than the flash kernels on the H200; see resolve_attention).
TEST(Config, GpuAttentionAutoPicksCublas) {
  Config c;
  c.model.n_embd = 128;
  c.model.n_head = 2;  // head size 64
  c.model.seq_len = 128;
  EXPECT_EQ(gpu::resolve_attention(c), "cublas");
  c.run.gpu_attention = "flash";
  EXPECT_EQ(gpu::resolve_attention(c), "flash");
  c.run.gpu_attention = "auto";
  c.model.seq_len = 100;
  EXPECT_EQ(gpu::resolve_attention(c), "cublas");
  c.model.seq_len = 128;
  c.model.n_head = 4;  // head size 32
  EXPECT_EQ(gpu::resolve_attention(c), "cublas");
  c.run.gpu_attention = "cublas";
  c.model.n_head = 2;
  EXPECT_EQ(gpu::resolve_attention(c), "cublas");
  // cudnn only by name: auto keeps the measured choice.
  c.run.gpu_attention = "cudnn";
  EXPECT_EQ(gpu::resolve_attention(c), "cudnn");
}

TEST(Config, EffectiveYamlReadsBackToTheSameConfig) {
  Config c = load_config("", {"model.n_layer=3", "eval.sample_prompt=In: the \"beginning\"",
                              "train.lr=0.00123"});
  test::TempDir dir;
  test::write_bytes(dir / "eff.yaml", to_yaml(c));
  const Config back = load_config((dir / "eff.yaml").string());
  EXPECT_EQ(to_yaml(back), to_yaml(c));
  EXPECT_EQ(back.eval.sample_prompt, "In: the \"beginning\"");
  EXPECT_DOUBLE_EQ(back.train.lr, 0.00123);
  EXPECT_EQ(back.model.n_layer, 3);
}

TEST(Config, ModesListsAndUnitLayout) {
  const Config c = load_config("", {"mode=decoupled", "units.count=3", "units.ranks=[1, 2, 1]",
                                    "units.slowdown=[1, 1, 3.5]", "syncer.quorum=2"});
  EXPECT_EQ(c.mode, Mode::decoupled);
  EXPECT_EQ(c.unit_ranks(1), 2);
  EXPECT_EQ(c.world_size(), 1 + 4);
  EXPECT_DOUBLE_EQ(c.units.slowdown[2], 3.5);
  // The effective YAML reads back, lists included.
  test::TempDir dir;
  test::write_bytes(dir / "eff.yaml", to_yaml(c));
  EXPECT_EQ(to_yaml(load_config((dir / "eff.yaml").string())), to_yaml(c));

  EXPECT_EQ(error_of("mode: sync\n"),
            "c.yaml: mode: must be one of single, ddp, diloco, streaming, decoupled, got sync");
  EXPECT_EQ(error_of("mode: diloco\nunits: {count: 2, ranks: [1]}\n"),
            "c.yaml: units.ranks: must list units.count = 2 entries, got 1");
  EXPECT_EQ(error_of("mode: decoupled\nunits: {count: 2}\nsyncer: {quorum: 3}\n"),
            "c.yaml: syncer.quorum: must be ≤ units.count = 2, got 3");
  EXPECT_EQ(error_of("units: {count: 2}\n"),
            "c.yaml: units.count: mode single trains one unit, got 2 (choose mode ddp, diloco, "
            "streaming or decoupled)");
  EXPECT_EQ(error_of("mode: ddp\nunits: {count: 2, slowdown: [1, 0.5]}\n"),
            "c.yaml: units.slowdown: every element must be ≥ 1, got [1, 0.5]");
  EXPECT_EQ(error_of("mode: ddp\nunits: {count: 2, ranks: 3}\n"),
            "c.yaml: units.ranks: expected a list like [1, 2], got '3'");
  EXPECT_EQ(error_of("outer: {merge: median}\n"),
            "c.yaml: outer.merge: must be one of rda, mean, got median");
}

// The wire format's keys: each bad value is refused naming the key, what it accepts and what
// it got, whether it came from a file or --set, or from a Config built in code.
TEST(Config, WireKeysAreValidated) {
  const Config c = load_config("", {"mode=decoupled", "units.count=2", "wan.format=sparse", "wan.chunk=256",
                                    "wan.topk=256", "wan.value_bits=8", "wan.ef_decay=0"});
  EXPECT_EQ(c.wan.format, "sparse");
  EXPECT_EQ(c.wan.chunk, 256);
  EXPECT_EQ(c.wan.topk, 256);
  EXPECT_EQ(c.wan.value_bits, 8);
  EXPECT_EQ(c.wan.ef_decay, 0.0);
  const Config d = load_config("", {});
  EXPECT_EQ(d.wan.chunk, 4096);
  EXPECT_EQ(d.wan.topk, 64);
  EXPECT_EQ(d.wan.value_bits, 2);
  EXPECT_EQ(d.wan.ef_decay, 1.0);
  EXPECT_EQ(d.wan.down_topk, 0) << "0: deliveries keep wan.topk";
  EXPECT_EQ(load_config("", {"wan.down_topk=256"}).wan.down_topk, 256);
  EXPECT_EQ(load_config("", {"wan.format=int2"}).wan.format, "int2");
  EXPECT_EQ(error_of("wan: {format: int3}\n"),
            "c.yaml: wan.format: must be one of fp32, bf16, int8, int4, int2, sparse, got int3");
  EXPECT_EQ(error_of("", {"wan.chunk=0"}), "--set: wan.chunk: must be > 0, got 0");
  EXPECT_EQ(error_of("wan: {chunk: 16777217}\n"), "c.yaml: wan.chunk: must be in [1, 16777216], got 16777217");
  EXPECT_EQ(error_of("", {"wan.topk=0"}), "--set: wan.topk: must be > 0, got 0");
  EXPECT_EQ(error_of("wan: {chunk: 32, topk: 33}\n"), "c.yaml: wan.topk: must be in [1, wan.chunk = 32], got 33");
  EXPECT_EQ(error_of("", {"wan.down_topk=-1"}), "--set: wan.down_topk: must be ≥ 0, got -1");
  EXPECT_EQ(error_of("wan: {chunk: 32, topk: 4, down_topk: 33}\n"),
            "c.yaml: wan.down_topk: must be in [0, wan.chunk = 32] (0: wan.topk), got 33");
  EXPECT_EQ(error_of("", {"wan.value_bits=3"}), "--set: wan.value_bits: must be 2, 4 or 8, got 3");
  EXPECT_EQ(error_of("wan: {ef_decay: 1.5}\n"), "c.yaml: wan.ef_decay: must be in [0, 1], got 1.5");
  EXPECT_EQ(error_of("", {"wan.ef_decay=-0.1"}), "--set: wan.ef_decay: must be in [0, 1], got -0.1");
  for (auto [key, value] : {std::pair<std::string, int>{"wan.chunk", 0}, {"wan.topk", 0}, {"wan.value_bits", 16}}) {
    Config bad = d;
    (key == "wan.chunk" ? bad.wan.chunk : key == "wan.topk" ? bad.wan.topk : bad.wan.value_bits) = value;
    try {
      validate(bad, "code");
      ADD_FAILURE() << key << " = " << value << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(key + ": must be"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("got " + std::to_string(value)), std::string::npos) << e.what();
    }
  }
}

TEST(Config, LaunchKeysValidatedAndListsOfStringsReadBack) {
  const Config d = load_config("", {});
  EXPECT_EQ(d.launch.max_restarts, 10);
  EXPECT_DOUBLE_EQ(d.launch.backoff_s, 1);
  EXPECT_DOUBLE_EQ(d.launch.backoff_max_s, 30);
  EXPECT_DOUBLE_EQ(d.launch.drain_s, 30);
  EXPECT_EQ(d.launch.mpirun, "mpirun");
  EXPECT_TRUE(d.launch.mpirun_args.empty());
  // Arguments that YAML would split, retype or drop if written plain come back as given.
  const std::vector<std::string> args = {"--mca", "odls_base_sigkill_timeout", "30", "a b",
                                         "x,y", "null", "", "say \"hi\"", "#1", "k: v"};
  YAML::Emitter list;
  list << YAML::Flow << args;
  const Config c = load_config("", {"launch.max_restarts=0", "launch.backoff_s=0.05",
                                    "launch.backoff_max_s=0.2", "launch.drain_s=0",
                                    "launch.mpirun=/opt/mpi/bin/mpirun",
                                    std::string("launch.mpirun_args=") + list.c_str()});
  EXPECT_EQ(c.launch.mpirun_args, args);
  EXPECT_EQ(c.launch.max_restarts, 0);
  test::TempDir dir;
  test::write_bytes(dir / "eff.yaml", to_yaml(c));
  const Config back = load_config((dir / "eff.yaml").string());
  EXPECT_EQ(back.launch.mpirun_args, args);
  EXPECT_EQ(to_yaml(back), to_yaml(c));
  EXPECT_EQ(error_of("launch: {max_restarts: -1}\n"),
            "c.yaml: launch.max_restarts: must be ≥ 0, got -1");
  EXPECT_EQ(error_of("launch: {backoff_s: 5, backoff_max_s: 2}\n"),
            "c.yaml: launch.backoff_max_s: must be ≥ launch.backoff_s = 5, got 2");
  EXPECT_EQ(error_of("launch: {drain_s: -1}\n"), "c.yaml: launch.drain_s: must be ≥ 0, got -1");
  EXPECT_EQ(error_of("launch: {drain_s: 1e9}\n"),
            "c.yaml: launch.drain_s: must be ≤ 86400 s, got 1000000000");
  EXPECT_EQ(error_of("launch: {mpirun: ''}\n"), "c.yaml: launch.mpirun: must not be empty, got ''");
  EXPECT_EQ(error_of("launch: {mpirun_args: -np}\n"),
            "c.yaml: launch.mpirun_args: expected a list like [1, 2], got '-np'");
}

TEST(Config, EveryKeyIsDocumented) {
  for (const auto& k : config_keys()) {
    EXPECT_FALSE(k.doc.empty()) << k.key;
    EXPECT_TRUE(k.key == "mode" || k.key.find('.') != std::string::npos) << k.key;
  }
}

// A configuration written for one mode and run with another: what that mode ignores is named.
TEST(Config, KeysTheModeIgnoresAreNamed) {
  Config c;
  c.mode = Mode::decoupled;
  c.units.count = 4;
  c.outer.fragments = 4;
  c.outer.overlap = 2;
  c.syncer.quorum = 2;
  EXPECT_TRUE(ignored_keys(c).empty()) << "decoupled uses every outer key";
  c.mode = Mode::diloco;
  const auto lines = ignored_keys(c);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "outer.fragments = 4 is ignored in mode diloco: it synchronises all of θ every H "
                      "steps (P = 1)");
  EXPECT_NE(lines[1].find("outer.overlap = 2 is ignored in mode diloco"), std::string::npos);
  EXPECT_NE(lines[2].find("syncer.quorum = 2 is ignored in mode diloco"), std::string::npos);
  // A key left at its default says nothing; carry is overwrite only where τ = 0.
  c.outer.apply = "carry";
  EXPECT_EQ(ignored_keys(c).size(), 4u);
  c.mode = Mode::streaming;
  ASSERT_EQ(ignored_keys(c).size(), 1u);
  EXPECT_NE(ignored_keys(c)[0].find("syncer.quorum = 2 is ignored in mode streaming"), std::string::npos);
  c.mode = Mode::ddp;
  EXPECT_EQ(ignored_keys(c).size(), 4u);  // fragments, overlap, apply, quorum
  c.mode = Mode::single;
  for (const auto& line : ignored_keys(c)) EXPECT_NE(line.find("in mode single"), std::string::npos) << line;
  EXPECT_EQ(ignored_keys(c).size(), 5u);  // units.count and the four above
}

// The wire keys of a format the run does not send are named too, and sparse with the anchor
// that would count the down link's lag as progress is warned about.
TEST(Config, WireKeysTheFormatIgnoresAreNamed) {
  Config c;
  c.mode = Mode::decoupled;
  c.units.count = 4;
  c.wan.format = "int4";
  c.wan.topk = 48;
  c.wan.down_topk = 192;
  c.wan.block = 32;
  auto lines = ignored_keys(c);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "wan.topk = 48 is ignored with wan.format = int4: only wan.format: sparse uses it");
  EXPECT_NE(lines[1].find("wan.down_topk = 192 is ignored with wan.format = int4"), std::string::npos);
  c.wan.format = "sparse";
  lines = ignored_keys(c);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "wan.block = 32 is ignored with wan.format = sparse: only wan.format int8, int4 and int2 use it");
  // The mode's reason comes first: single has no links at all.
  c.mode = Mode::single;
  for (const auto& line : ignored_keys(c)) EXPECT_NE(line.find("in mode single"), std::string::npos) << line;

  c.mode = Mode::decoupled;
  ASSERT_TRUE(sparse_anchor_note(c).has_value()) << "sparse measured from Θ";
  EXPECT_NE(sparse_anchor_note(c)->find("use outer.anchor: reference"), std::string::npos);
  c.outer.anchor = "reference";
  EXPECT_FALSE(sparse_anchor_note(c).has_value());
  c.outer.anchor = "current";
  c.wan.format = "int4";
  EXPECT_FALSE(sparse_anchor_note(c).has_value());
}

// diloco's steps after its last merge are trained on and never merged: said, with the budgets
// that have no such tail.
TEST(Config, DilocoStepsAfterTheLastMergeAreNamed) {
  Config c;
  c.mode = Mode::diloco;
  c.train.steps = 2000;
  c.outer.h = 150;
  const auto tail = unsynced_tail(c);
  ASSERT_TRUE(tail.has_value());
  EXPECT_EQ(*tail, "train.steps = 2000: mode diloco merges every outer.h = 150 steps after "
                   "outer.warmup_steps = 0, the last time after step 1950, so the last 50 inner "
                   "steps of every unit never reach the global model (trained on, then lost); set "
                   "train.steps to 1950 or 2100");
  c.outer.warmup_steps = 200;  // merges after 1..200, then 350, ..., 2000
  EXPECT_FALSE(unsynced_tail(c).has_value());
  c.outer.warmup_steps = 2000;  // all of it warm-up
  EXPECT_FALSE(unsynced_tail(c).has_value());
  c.outer.warmup_steps = 0;
  c.train.steps = 100;  // no merge at all
  ASSERT_TRUE(unsynced_tail(c).has_value());
  const std::string none = *unsynced_tail(c);
  EXPECT_NE(none.find("never within the budget, so the last 100 inner steps"), std::string::npos) << none;
  EXPECT_NE(none.find("set train.steps to 150 (or lower outer.h)"), std::string::npos) << none;
  c.mode = Mode::decoupled;  // staggered fragments: a tail is part of the schedule
  EXPECT_FALSE(unsynced_tail(c).has_value());
}

}  // namespace
}  // namespace ddiloco
