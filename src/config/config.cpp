// The one table of configuration keys, and YAML reading/writing driven by it.
#include "ddiloco/config.hpp"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "ddiloco/chaos.hpp"
#include "ddiloco/error.hpp"
#include "config/config_schema.hpp"

namespace ddiloco {

namespace {

using config_schema::Check;
using config_schema::Entry;
using config_schema::at_least;
using config_schema::each_at_least;
using config_schema::in_int_range;
using config_schema::in_range;
using config_schema::non_empty;
using config_schema::one_of;
using config_schema::parse_value;
using config_schema::positive;

constexpr const char* kListHint = "`ddiloco config --list` shows the known keys";
static_assert(ChaosConfig::kNominalLinkMbitS == 80,
              "chaos.link_factor's doc and chaos.link_mbps's removal message say 80 Mbit/s");

Entry<Config> mode_field() {
  Entry<Config> e;
  e.key = "mode";
  e.doc = "single (one unit, no syncer) | ddp | diloco | streaming | decoupled";
  e.is_string = true;
  e.parse = [](Config& c, const YAML::Node& node) {
    const std::string v = parse_value<std::string>(node);
    for (Mode m : {Mode::single, Mode::ddp, Mode::diloco, Mode::streaming, Mode::decoupled})
      if (v == mode_name(m)) {
        c.mode = m;
        return;
      }
    fail("must be one of single, ddp, diloco, streaming, decoupled, got {}", v);
  };
  e.show = [](const Config& c) { return std::string(mode_name(c.mode)); };
  return e;
}

#define DDILOCO_FIELD(T, KEY, MEMBER, DOC, ...) \
  config_schema::field<T, Config>(KEY, [](Config& c) -> T& { return c.MEMBER; }, DOC __VA_OPT__(, ) __VA_ARGS__)

const std::vector<Entry<Config>>& entries() {
  static const std::vector<Entry<Config>> table = {
      mode_field(),
      // run
      DDILOCO_FIELD(std::string, "run.dir", run.dir,
                    "output directory: metrics.jsonl, config.yaml, model.h5", non_empty()),
      DDILOCO_FIELD(int64_t, "run.seed", run.seed, "seed of model init and data order",
                    at_least<int64_t>(0)),
      DDILOCO_FIELD(int, "run.threads", run.threads,
                    "OpenMP threads per rank; 0 = cores on the node / ranks on the node",
                    at_least(0)),
      DDILOCO_FIELD(int, "run.log_every", run.log_every, "steps between train-loss log lines",
                    positive<int>()),
      DDILOCO_FIELD(bool, "run.progress", run.progress,
                    "progress bar on rank 0 when stdout is a terminal"),
      DDILOCO_FIELD(std::string, "run.device", run.device,
                    "where learner units train: cpu | cuda (one GPU per learner rank, by "
                    "node-local rank; needs the cuda preset's build); the syncer stays on the CPU",
                    one_of({"cpu", "cuda"})),
      DDILOCO_FIELD(std::string, "run.gpu_attention", run.gpu_attention,
                    "GPU attention kernels: auto (= cublas, the faster one on an H200) | flash "
                    "(fused; head size 64 and seq_len % 64 == 0; no (B,NH,T,T) buffer) | cublas "
                    "| cudnn (cuDNN's fused SDPA, builds with cuDNN 9; head size a multiple of "
                    "8, ≤ 128; not measured yet)",
                    one_of({"auto", "flash", "cublas", "cudnn"})),
      // model
      DDILOCO_FIELD(int, "model.vocab_size", model.vocab_size,
                    "tokens: 256 for byte-level text, 50257 for GPT-2 shards",
                    [](const int& v) {
                      return v >= 2 && v <= 65536 ? "" : std::string("must be in [2, 65536]");
                    }),
      DDILOCO_FIELD(int, "model.seq_len", model.seq_len, "context length T, tokens",
                    in_int_range(1, GptConfig::kMaxSeqLen)),
      DDILOCO_FIELD(int, "model.n_layer", model.n_layer, "transformer blocks",
                    in_int_range(1, GptConfig::kMaxLayers)),
      DDILOCO_FIELD(int, "model.n_head", model.n_head,
                    "attention heads; must divide model.n_embd", in_int_range(1, GptConfig::kMaxEmbd)),
      DDILOCO_FIELD(int, "model.n_embd", model.n_embd, "channels C",
                    in_int_range(1, GptConfig::kMaxEmbd)),
      // data
      DDILOCO_FIELD(std::string, "data.train", data.train, "glob of training token shards",
                    non_empty()),
      DDILOCO_FIELD(std::string, "data.val", data.val, "glob of validation token shards",
                    non_empty()),
      DDILOCO_FIELD(bool, "data.shuffle", data.shuffle,
                    "permute shards and batches every epoch (seeded)"),
      // train
      DDILOCO_FIELD(int, "train.batch_size", train.batch_size,
                    "sequences per rank per inner step", positive<int>()),
      DDILOCO_FIELD(int64_t, "train.steps", train.steps, "inner optimizer steps",
                    positive<int64_t>()),
      DDILOCO_FIELD(double, "train.lr", train.lr, "peak learning rate of AdamW",
                    positive<double>()),
      DDILOCO_FIELD(int64_t, "train.warmup_steps", train.warmup_steps,
                    "linear warm-up steps before the cosine decay", at_least<int64_t>(0)),
      DDILOCO_FIELD(double, "train.min_lr_frac", train.min_lr_frac,
                    "final learning rate as a fraction of train.lr",
                    in_range(0, 1, false, false)),
      DDILOCO_FIELD(double, "train.weight_decay", train.weight_decay,
                    "AdamW decoupled weight decay (matmul weights and embeddings)",
                    at_least(0.0)),
      DDILOCO_FIELD(double, "train.beta1", train.beta1, "AdamW β1",
                    in_range(0, 1, false, true)),
      DDILOCO_FIELD(double, "train.beta2", train.beta2, "AdamW β2",
                    in_range(0, 1, false, true)),
      DDILOCO_FIELD(double, "train.eps", train.eps, "AdamW ε", positive<double>()),
      DDILOCO_FIELD(double, "train.grad_clip", train.grad_clip,
                    "max global gradient norm; 0 disables clipping", at_least(0.0)),
      // eval
      DDILOCO_FIELD(int64_t, "eval.every_steps", eval.every_steps,
                    "steps between validation losses; 0 = only at the end",
                    at_least<int64_t>(0)),
      DDILOCO_FIELD(int64_t, "eval.val_tokens", eval.val_tokens,
                    "size of the fixed validation set, tokens", positive<int64_t>()),
      DDILOCO_FIELD(int64_t, "eval.sample_every_steps", eval.sample_every_steps,
                    "steps between text samples; 0 = only at the end", at_least<int64_t>(0)),
      DDILOCO_FIELD(int, "eval.sample_tokens", eval.sample_tokens,
                    "tokens generated per sample; 0 = no samples", at_least(0)),
      DDILOCO_FIELD(std::string, "eval.sample_prompt", eval.sample_prompt,
                    "prompt of the samples (byte-level models)"),
      DDILOCO_FIELD(double, "eval.temperature", eval.temperature,
                    "sampling temperature; 0 = greedy", at_least(0.0)),
      // units
      DDILOCO_FIELD(int, "units.count", units.count, "learner units M (modes other than single)",
                    in_int_range(1, UnitsConfig::kMaxCount)),
      DDILOCO_FIELD(int, "units.ranks_per_unit", units.ranks_per_unit,
                    "MPI ranks of each unit when units.ranks is empty", positive<int>()),
      DDILOCO_FIELD(std::vector<int>, "units.ranks", units.ranks,
                    "ranks of each unit, e.g. [1, 1, 2]; empty = units.ranks_per_unit each",
                    each_at_least(1)),
      DDILOCO_FIELD(std::vector<double>, "units.slowdown", units.slowdown,
                    "per-unit compute slow-down factor (straggler emulation); empty = all 1",
                    each_at_least(1.0)),
      DDILOCO_FIELD(int, "units.zero", units.zero,
                    "0: every rank of a unit holds the whole AdamW state; 1: each of its R ranks "
                    "holds 1/R of it (ZeRO stage 1: gradients reduce-scattered, updated shards "
                    "all-gathered; the same update). CPU (MPI) and GPU (NCCL); in ddp the reduced "
                    "gradient is whole on every rank, only the update and its state are sharded",
                    in_int_range(0, 1)),
      // outer
      DDILOCO_FIELD(int, "outer.fragments", outer.fragments,
                    "P: fragments (groups of whole tensors) synchronised separately",
                    positive<int>()),
      DDILOCO_FIELD(int, "outer.h", outer.h, "H: inner steps between syncs of a fragment",
                    positive<int>()),
      DDILOCO_FIELD(int, "outer.overlap", outer.overlap,
                    "τ: steps between sending a fragment and applying its merge", at_least(0)),
      DDILOCO_FIELD(double, "outer.lr", outer.lr, "η: outer Nesterov learning rate",
                    positive<double>()),
      DDILOCO_FIELD(double, "outer.momentum", outer.momentum, "μ: outer Nesterov momentum",
                    in_range(0, 1, false, true)),
      DDILOCO_FIELD(std::string, "outer.merge", outer.merge,
                    "rda (mean for embeddings) | mean", one_of({"rda", "mean"})),
      DDILOCO_FIELD(std::string, "outer.apply", outer.apply,
                    "how a learner takes a merged fragment: overwrite (θ ← Θ) | blend "
                    "(θ ← α·θ + (1−α)·Θ) | carry (θ ← Θ + θ − θ_sent: keeps the τ steps since "
                    "the snapshot)",
                    one_of({"overwrite", "blend", "carry"})),
      DDILOCO_FIELD(double, "outer.blend_alpha", outer.blend_alpha,
                    "blend: θ ← α·θ + (1−α)·Θ", in_range(0, 1, false, true)),
      DDILOCO_FIELD(std::string, "outer.anchor", outer.anchor,
                    "outer gradient Δ_m = anchor − θ_m from: current (Θ now) | base (the Θ "
                    "version unit m last received) | reference (that version as unit m decoded it: "
                    "with lossy wire formats Δ_m is then exactly what the unit sent)",
                    one_of({"current", "base", "reference"})),
      DDILOCO_FIELD(int, "outer.warmup_steps", outer.warmup_steps,
                    "post-local SGD: inner steps from the start during which every fragment is "
                    "synchronised after every step, applied at once, by a plain average (H = 1, "
                    "τ = 0, η = 1, μ = 0); 0 = off",
                    at_least(0)),
      DDILOCO_FIELD(bool, "outer.share_steps", outer.share_steps,
                    "a merge of some units steps by their share s of the live units' tokens per "
                    "step (v ← μ^s·v + s·Δ, Θ ← Θ − η·s·(Δ + μ·v))"),
      // syncer
      DDILOCO_FIELD(int, "syncer.quorum", syncer.quorum,
                    "K: minimum units with a fresh snapshot before a merge (decoupled)",
                    positive<int>()),
      DDILOCO_FIELD(double, "syncer.grace_gamma", syncer.grace_gamma,
                    "γ: share of the slack τ·ξ_step − ξ_quorum − ξ_sync waited for stragglers",
                    in_range(0, 1, false, false)),
      DDILOCO_FIELD(double, "syncer.grace_cap_steps", syncer.grace_cap_steps,
                    "grace window cap, in median inner-step times", at_least(0.0)),
      DDILOCO_FIELD(int, "syncer.eval_every", syncer.eval_every,
                    "outer rounds (H inner steps) between global evaluations of Θ",
                    positive<int>()),
      DDILOCO_FIELD(int, "syncer.poll_max_us", syncer.poll_max_us,
                    "longest sleep between polls when idle, microseconds; the syncer also sleeps at most "
                    "1/16 of the units' median inner step (not below 1000 µs)", positive<int>()),
      DDILOCO_FIELD(double, "syncer.heartbeat_timeout_s", syncer.heartbeat_timeout_s,
                    "a unit whose heartbeat has not moved for this long, seconds (or for three "
                    "of its inner steps, if longer), is out of every quorum until it reports again",
                    positive<double>()),
      DDILOCO_FIELD(int, "syncer.max_staleness", syncer.max_staleness,
                    "a snapshot whose base is more than this many merges of its fragment behind Θ "
                    "(a unit back from a partition) is refused, not merged, and the unit gets the "
                    "current fragment; 0 = merge at any staleness, weighted by its tokens as any other",
                    at_least(0)),
      DDILOCO_FIELD(double, "syncer.max_weight_ratio", syncer.max_weight_ratio,
                    "in a merge of two units or more, a unit weighs at most as if it had made this "
                    "many times the (lower) median of the others' inner steps since their last "
                    "merge, so that no unit (one whose step count lies included) takes more than "
                    "κ/(κ + n − 1) of a merge of n units of equal batches; 0 = no cap",
                    at_least(0.0)),
      DDILOCO_FIELD(double, "syncer.max_outer_grad_ratio", syncer.max_outer_grad_ratio,
                    "a unit's outer gradient per inner step (‖Δ‖ over its c_steps, capped at "
                    "max_weight_ratio × the units' median steps or an honest round) is scaled down, "
                    "keeping its direction, to at most this many times the lower median of the "
                    "units' votes (each unit's median over its last 4 contributions to the fragment): "
                    "values far outside any step a unit could have taken move Θ no more than this "
                    "many typical steps; 0 = no bound",
                    at_least(0.0)),
      DDILOCO_FIELD(std::string, "syncer.listen", syncer.listen,
                    "isolated deployment: where `ddiloco syncer` listens, IPv4 address:port (port "
                    "0: any free port); the address taken is written to run.dir/syncer.addr"),
      DDILOCO_FIELD(std::string, "syncer.http", syncer.http,
                    "where the syncer serves its live status page, /api/state and Prometheus /metrics "
                    "(docs/status_page.md), IPv4 address:port (port 0: any free port; the address "
                    "taken is written to run.dir/syncer.http); empty = off, except under `ddiloco "
                    "launch`, which serves at 127.0.0.1:0; off = off under launch too"),
      DDILOCO_FIELD(std::string, "syncer.address", syncer.address,
                    "isolated deployment: the syncer's address:port for `ddiloco unit`; empty = "
                    "read run.dir/syncer.addr (a shared filesystem)"),
      DDILOCO_FIELD(double, "syncer.connect_wait_s", syncer.connect_wait_s,
                    "isolated deployment: how long a unit waits for the syncer (retrying with "
                    "backoff) before it gives up, seconds",
                    positive<double>()),
      DDILOCO_FIELD(double, "syncer.recover_timeout_s", syncer.recover_timeout_s,
                    "isolated deployment: a syncer restarted mid-run recovers Θ from the units' copies; "
                    "it waits this long for K units (syncer.quorum) to hand theirs back, then goes on with "
                    "the newest it has, from the units that came or its checkpoint, seconds",
                    positive<double>()),
      DDILOCO_FIELD(double, "syncer.link_timeout_s", syncer.link_timeout_s,
                    "isolated deployment: a read or write of a unit's memory that has not completed "
                    "after this many seconds (plus its bytes at syncer.link_min_mbit_s) closes the "
                    "unit's connection (a cut link, a frozen process); the unit reconnects by itself. "
                    "The syncer never waits for it meanwhile: snapshot reads and deliveries run side by "
                    "side, one per unit, and a control word waits at most 0.25 s, then is left in flight",
                    positive<double>()),
      DDILOCO_FIELD(bool, "syncer.signal_stops_units", syncer.signal_stops_units,
                    "isolated deployment: a stop signal to the syncer (SIGTERM, SIGINT, SIGUSR1) "
                    "stops every unit too, the job's end; false: the syncer exits alone, and the units "
                    "train on and reconnect to its next start, which resumes from the last periodic "
                    "checkpoint (checkpoint.every; its Slurm job requeued: slurm/syncer.sbatch sets false)"),
      DDILOCO_FIELD(double, "syncer.link_min_mbit_s", syncer.link_min_mbit_s,
                    "isolated deployment: the slowest link between the syncer and a unit, Mbit/s, "
                    "that its waits allow for (above); set it below a real WAN link's rate: a transfer "
                    "slower than that is logged (link_slow) and no longer counts as the unit's heartbeat",
                    positive<double>()),
      // chaos (fault injection)
      DDILOCO_FIELD(int64_t, "chaos.seed", chaos.seed, "seed of the fault schedule"),
      DDILOCO_FIELD(double, "chaos.horizon_s", chaos.horizon_s,
                    "faults are drawn over this many seconds from the start", positive<double>()),
      DDILOCO_FIELD(std::vector<int>, "chaos.units", chaos.units,
                    "units that may fail, e.g. [0, 2]; empty = all", each_at_least(0)),
      DDILOCO_FIELD(double, "chaos.crash_mtbf_s", chaos.crash_mtbf_s,
                    "mean up-time between crashes of a unit, seconds; 0 = no crashes",
                    at_least(0.0)),
      DDILOCO_FIELD(double, "chaos.down_min_s", chaos.down_min_s,
                    "shortest down-time after a crash, seconds", at_least(0.0)),
      DDILOCO_FIELD(double, "chaos.down_max_s", chaos.down_max_s,
                    "longest down-time after a crash, seconds (uniform in [min, max])",
                    at_least(0.0)),
      DDILOCO_FIELD(double, "chaos.slow_mtbf_s", chaos.slow_mtbf_s,
                    "mean gap between straggler episodes of a unit, seconds; 0 = none",
                    at_least(0.0)),
      DDILOCO_FIELD(double, "chaos.slow_duration_s", chaos.slow_duration_s,
                    "length of a straggler episode, seconds", positive<double>()),
      DDILOCO_FIELD(double, "chaos.slow_factor", chaos.slow_factor,
                    "inner steps take this many times as long during an episode",
                    at_least(1.0)),
      DDILOCO_FIELD(double, "chaos.link_mtbf_s", chaos.link_mtbf_s,
                    "mean gap between link degradations of a unit, seconds; 0 = none",
                    at_least(0.0)),
      DDILOCO_FIELD(double, "chaos.link_duration_s", chaos.link_duration_s,
                    "length of a link degradation, seconds", positive<double>()),
      DDILOCO_FIELD(double, "chaos.link_factor", chaos.link_factor,
                    "fraction of the link's bandwidth left during a degradation: of the unit's "
                    "wan.bandwidth_mbit_s, or of a nominal 80 Mbit/s where wan.* leaves the link "
                    "unlimited (a degraded transfer of b bytes then lands b·(1/f − 1)/(10 MB/s) "
                    "later)",
                    in_range(0, 1, true, false)),
      config_schema::removed_key<Config>(
          "chaos.link_mbps",
          "removed: a degraded link's bandwidth is the unit's wan.bandwidth_mbit_s (Mbit/s = 8 × "
          "MB/s; setting it also emulates the link), or a nominal 80 Mbit/s (10 MB/s) where wan.* "
          "leaves the link unlimited; delete the key",
          "10"),
      DDILOCO_FIELD(std::string, "chaos.schedule_file", chaos.schedule_file,
                    "YAML fault schedule to replay instead of drawing one (see "
                    "chaos_schedule.yaml in a run directory)"),
      // checkpoint
      DDILOCO_FIELD(int64_t, "checkpoint.every", checkpoint.every,
                    "outer updates (merges) between two checkpoints, inner steps in modes single and "
                    "ddp; 0 = none by count (see checkpoint.every_s, and at_stop)",
                    at_least<int64_t>(0)),
      DDILOCO_FIELD(double, "checkpoint.every_s", checkpoint.every_s,
                    "seconds between two checkpoints (taken at the first merge after; modes single and "
                    "ddp: the next step boundary), besides "
                    "checkpoint.every; 0 = none by time. What a restarted syncer that no unit can give "
                    "Θ back to loses at most (docs/deployments.md \"The syncer dying\")", at_least(0.0)),
      DDILOCO_FIELD(std::string, "checkpoint.dir", checkpoint.dir,
                    "where checkpoints go (ckpt_<id>/ per checkpoint); empty = "
                    "<run.dir>/checkpoints"),
      DDILOCO_FIELD(int, "checkpoint.keep", checkpoint.keep,
                    "complete checkpoints kept; older ones are deleted", positive<int>()),
      DDILOCO_FIELD(bool, "checkpoint.at_stop", checkpoint.at_stop,
                    "write a checkpoint when the job stops (SIGTERM, SIGUSR1, SIGINT, token "
                    "budget, last step)"),
      // wan
      DDILOCO_FIELD(double, "wan.bandwidth_mbit_s", wan.bandwidth_mbit_s,
                    "each unit's emulated WAN link, each direction, Mbit/s (token bucket); 0 = "
                    "unlimited. Also the bandwidth a chaos link degradation scales "
                    "(chaos.link_factor). Scale it to the model: docs/wan.md, \"Emulated WAN links\"",
                    at_least(0.0)),
      DDILOCO_FIELD(double, "wan.latency_ms", wan.latency_ms,
                    "one-way latency of each unit's link, ms", at_least(0.0)),
      DDILOCO_FIELD(double, "wan.jitter_ms", wan.jitter_ms,
                    "extra one-way delay per message, uniform in [0, jitter_ms], ms (order kept)",
                    at_least(0.0)),
      DDILOCO_FIELD(double, "wan.burst_kb", wan.burst_kb,
                    "token-bucket depth, KiB: bytes a link sends at once after an idle spell",
                    at_least(0.0)),
      DDILOCO_FIELD(std::vector<double>, "wan.unit_bandwidth_mbit_s", wan.unit_bandwidth_mbit_s,
                    "per-unit link bandwidth, Mbit/s (0 = unlimited); empty = wan.bandwidth_mbit_s",
                    each_at_least(0.0)),
      DDILOCO_FIELD(std::vector<double>, "wan.unit_latency_ms", wan.unit_latency_ms,
                    "per-unit one-way latency, ms; empty = wan.latency_ms", each_at_least(0.0)),
      DDILOCO_FIELD(std::string, "wan.format", wan.format,
                    "wire format of what crosses the links: fp32 | bf16 | int8 | int4 | int2 "
                    "(absmax per wan.block values) | sparse (the wan.topk largest of every "
                    "wan.chunk values, in wan.value_bits bits; SparseLoCo). Outer modes send outer "
                    "gradients against a base both sides hold; ddp fp32 or bf16 gradients",
                    one_of({"fp32", "bf16", "int8", "int4", "int2", "sparse"})),
      DDILOCO_FIELD(int, "wan.block", wan.block,
                    "values per fp32 scale in int8, int4 and int2", positive<int>()),
      DDILOCO_FIELD(int, "wan.chunk", wan.chunk,
                    "sparse: values per chunk, each with its own top-k and two fp32 magnitudes (≤ 2^24)",
                    positive<int>()),
      DDILOCO_FIELD(int, "wan.topk", wan.topk,
                    "sparse: largest-magnitude values kept per chunk, 1 … wan.chunk",
                    positive<int>()),
      DDILOCO_FIELD(int, "wan.down_topk", wan.down_topk,
                    "sparse: values kept per chunk on the way down (a merge of M units' top-k has "
                    "up to M × wan.topk nonzeros), 0 … wan.chunk; 0 = wan.topk",
                    at_least(0)),
      DDILOCO_FIELD(int, "wan.value_bits", wan.value_bits,
                    "sparse: bits per kept value: 2 | 4 | 8",
                    [](const int& v) {
                      return v == 2 || v == 4 || v == 8 ? "" : std::string("must be 2, 4 or 8");
                    }),
      DDILOCO_FIELD(std::string, "wan.security", wan.security,
                    "the unit <-> syncer link of the isolated deployment (docs/security.md): "
                    "trusted (UCX one-sided access, no protection: any peer that reaches the port "
                    "can read and write memory) | authenticated (mutual challenge-response, then "
                    "requests each unit checks; nothing exposed; bytes in clear) | encrypted (as "
                    "authenticated, inside TLS 1.3) | auto (encrypted when syncer.listen is not "
                    "loopback, else authenticated)",
                    one_of({"auto", "trusted", "authenticated", "encrypted"})),
      DDILOCO_FIELD(double, "wan.ef_decay", wan.ef_decay,
                    "error-feedback decay β in [0, 1]: each snapshot carries β × what the previous "
                    "one's encoding lost (lossy formats; SparseLoCo's recipe); 1 = all of it",
                    in_range(0.0, 1.0, false, false)),
      // launch (ddiloco launch: the isolated deployment)
      DDILOCO_FIELD(int, "launch.max_restarts", launch.max_restarts,
                    "ddiloco launch: restarts of each process (the syncer, each unit's MPI job) "
                    "that exits non-zero or is killed; 0 = never restart",
                    at_least(0)),
      DDILOCO_FIELD(double, "launch.backoff_s", launch.backoff_s,
                    "ddiloco launch: wait before a process's first restart, seconds; doubled "
                    "for each next one", at_least(0.0)),
      DDILOCO_FIELD(double, "launch.backoff_max_s", launch.backoff_max_s,
                    "ddiloco launch: longest wait before a restart, seconds", at_least(0.0)),
      DDILOCO_FIELD(double, "launch.drain_s", launch.drain_s,
                    "ddiloco launch: once the syncer has ended, unit jobs may exit by themselves "
                    "this long, seconds; then SIGTERM, and SIGKILL 5 s later",
                    at_least(0.0)),
      DDILOCO_FIELD(std::string, "launch.mpirun", launch.mpirun,
                    "ddiloco launch: the MPI launcher of each unit's job (a path, or a name "
                    "looked up in PATH)", non_empty()),
      DDILOCO_FIELD(std::vector<std::string>, "launch.mpirun_args", launch.mpirun_args,
                    "ddiloco launch: extra arguments of every unit's mpirun, before -np, e.g. "
                    "[--mca, odls_base_sigkill_timeout, 30]"),
      // debug (test hooks)
      DDILOCO_FIELD(int, "debug.stall_unit", debug.stall_unit,
                    "test hook: this unit stalls (−1 = none; mode single: 0, until a stop signal)",
                    at_least(-1)),
      DDILOCO_FIELD(int64_t, "debug.stall_at_step", debug.stall_at_step,
                    "test hook: ... after this inner step", at_least<int64_t>(0)),
      DDILOCO_FIELD(int64_t, "debug.stall_until_merges", debug.stall_until_merges,
                    "test hook: ... until the syncer has made this many merges (or the job is "
                    "told to stop)",
                    at_least<int64_t>(0)),
      DDILOCO_FIELD(int64_t, "debug.stall_after_checkpoints", debug.stall_after_checkpoints,
                    "test hook: ... at its first step from stall_at_step on at which it has "
                    "written checkpoint files up to this id", at_least<int64_t>(0)),
      DDILOCO_FIELD(int, "debug.syncer_read_delay_ms", debug.syncer_read_delay_ms,
                    "test hook: syncer pause between a snapshot's header and reading its data",
                    at_least(0)),
      DDILOCO_FIELD(int, "debug.nan_unit", debug.nan_unit,
                    "test hook: this unit's leader's parameters turn NaN (−1 = none)",
                    at_least(-1)),
      DDILOCO_FIELD(int64_t, "debug.nan_at_step", debug.nan_at_step,
                    "test hook: ... before its first snapshot published from this step on",
                    at_least<int64_t>(0)),
      DDILOCO_FIELD(bool, "debug.crash_during_read", debug.crash_during_read,
                    "test hook: the syncer announces each read of a unit's snapshot and waits for "
                    "the unit's answer at a step boundary; a due crash waits for such a read and "
                    "lands before the answer, so the read finds the unit's memory gone"),
      DDILOCO_FIELD(int, "debug.checkpoint_write_delay_ms", debug.checkpoint_write_delay_ms,
                    "test hook: the syncer pauses this long inside the write of its checkpoint "
                    "file of checkpoint 2, the run's second (a kill then lands mid-write)", at_least(0)),
  };
  return table;
}

#undef DDILOCO_FIELD

}  // namespace

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::single: return "single";
    case Mode::ddp: return "ddp";
    case Mode::diloco: return "diloco";
    case Mode::streaming: return "streaming";
    case Mode::decoupled: return "decoupled";
  }
  return "?";
}

bool WanConfig::emulated(int units) const {
  for (int u = 0; u < units; ++u)
    if (bandwidth_of(u) > 0 || latency_of(u) > 0 || jitter_ms > 0) return true;
  return false;
}

int Config::unit_ranks(int u) const {
  return units.ranks.empty() ? units.ranks_per_unit : units.ranks.at(u);
}

int64_t Config::unit_tokens_per_step(int u) const {
  return static_cast<int64_t>(train.batch_size) * model.seq_len * unit_ranks(u);
}

const ModeTraits& mode_traits(Mode mode) {
  static const ModeTraits single{.has_syncer = false, .outer_steps = false};
  static const ModeTraits ddp{.outer_steps = false, .gradient_ring = true};
  static const ModeTraits diloco{.rounds_in_steps = true, .can_rejoin = true};
  static const ModeTraits streaming{.fragments = true};
  static const ModeTraits decoupled{.fragments = true, .quorum = true, .token_budget = true, .can_rejoin = true};
  switch (mode) {
    case Mode::single: return single;
    case Mode::ddp: return ddp;
    case Mode::diloco: return diloco;
    case Mode::streaming: return streaming;
    case Mode::decoupled: return decoupled;
  }
  fail("unknown mode {}", static_cast<int>(mode));
}

int64_t Config::job_tokens_per_step() const {
  int64_t sum = 0;
  for (int u = 0; u < units.count; ++u) sum += unit_tokens_per_step(u);
  return sum;
}

int Config::world_size() const {
  if (!mode_traits(mode).has_syncer) return -1;  // any: the world is the unit
  int n = 1;
  for (int u = 0; u < units.count; ++u) n += unit_ranks(u);
  return n;
}

void apply_override(Config& config, const std::string& assignment, const std::string& source) {
  config_schema::apply_override(entries(), kListHint, config, assignment, source);
}

namespace {
// Set once at start-up by the GPU unit backend's registration (before any thread starts), read
// after.
DeviceCheck g_cuda_check = nullptr;

// The sparse format's keys, for a Config built in code as well as one parsed (whose fields'
// checks name the key already).
void check_wire(const WanConfig& w) {
  if (w.chunk < 1 || w.chunk > (1 << 24))
    fail("wan.chunk: must be in [1, {}], got {}", 1 << 24, w.chunk);
  if (w.topk < 1 || w.topk > w.chunk)
    fail("wan.topk: must be in [1, wan.chunk = {}], got {}", w.chunk, w.topk);
  if (w.down_topk < 0 || w.down_topk > w.chunk)
    fail("wan.down_topk: must be in [0, wan.chunk = {}] (0: wan.topk), got {}", w.chunk, w.down_topk);
  if (w.value_bits != 2 && w.value_bits != 4 && w.value_bits != 8)
    fail("wan.value_bits: must be 2, 4 or 8, got {}", w.value_bits);
  if (!(w.ef_decay >= 0 && w.ef_decay <= 1)) fail("wan.ef_decay: must be in [0, 1], got {}", w.ef_decay);
}

// The device asked for exists, and the model and its batch fit this machine's memory.
void check_machine(const Config& c) {
  if (c.run.device == "cuda") {
    if (g_cuda_check == nullptr)
      fail("run.device: cuda needs a ddiloco built with CUDA; build the cuda preset "
           "(cmake --preset cuda && cmake --build --preset cuda)");
    g_cuda_check(c);
  }
  const double need = c.model.training_bytes(c.train.batch_size);
  const double have = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGE_SIZE);
  if (need > have)
    fail("train.batch_size: model and batch need about {:.0f} GiB per rank (parameters, "
         "optimizer state, activations), this machine has {:.0f} GiB; lower "
         "train.batch_size, model.seq_len or the model size",
         need / (1 << 30), have / (1 << 30));
}

// Lists with one entry per unit: empty, or units.count long.
void check_unit_lists(const Config& c) {
  const int M = c.units.count;
  // First: later checks loop over the units (a config built in code skips the table's check).
  if (M < 1 || M > UnitsConfig::kMaxCount)
    fail("units.count: must be in [1, {}], got {}", UnitsConfig::kMaxCount, M);
  if (!c.units.ranks.empty() && static_cast<int>(c.units.ranks.size()) != M)
    fail("units.ranks: must list units.count = {} entries, got {}", M, c.units.ranks.size());
  if (!c.units.slowdown.empty() && static_cast<int>(c.units.slowdown.size()) != M)
    fail("units.slowdown: must list units.count = {} entries, got {}", M,
         c.units.slowdown.size());
  if (!c.wan.unit_bandwidth_mbit_s.empty() && static_cast<int>(c.wan.unit_bandwidth_mbit_s.size()) != M)
    fail("wan.unit_bandwidth_mbit_s: must list units.count = {} entries, got {}", M,
         c.wan.unit_bandwidth_mbit_s.size());
  if (!c.wan.unit_latency_ms.empty() && static_cast<int>(c.wan.unit_latency_ms.size()) != M)
    fail("wan.unit_latency_ms: must list units.count = {} entries, got {}", M,
         c.wan.unit_latency_ms.size());
}

// The emulated links (wan.*): their rates, delays and wire format, and the modes they serve.
void check_links(const Config& c) {
  // Links slower than 1 kbit/s or later than a minute are typing errors, not WANs (and their
  // times would overflow the clocks that wait them out).
  auto check_bandwidth = [](const char* key, double mbit_s) {
    if (mbit_s != 0 && !(mbit_s >= 1e-3 && mbit_s <= 1e9))
      fail("{}: must be 0 (unlimited) or in [0.001, 1e9] Mbit/s, got {}", key, mbit_s);
  };
  auto check_delay = [](const char* key, double ms) {
    if (!(ms <= 60000)) fail("{}: must be ≤ 60000 ms, got {}", key, ms);
  };
  check_bandwidth("wan.bandwidth_mbit_s", c.wan.bandwidth_mbit_s);
  for (double b : c.wan.unit_bandwidth_mbit_s) check_bandwidth("wan.unit_bandwidth_mbit_s", b);
  check_delay("wan.latency_ms", c.wan.latency_ms);
  check_delay("wan.jitter_ms", c.wan.jitter_ms);
  for (double l : c.wan.unit_latency_ms) check_delay("wan.unit_latency_ms", l);
  if (c.wan.block > (1 << 24)) fail("wan.block: must be ≤ {}, got {}", 1 << 24, c.wan.block);
  check_wire(c.wan);
  if (!(c.wan.burst_kb <= 1 << 20)) fail("wan.burst_kb: must be ≤ {} KiB, got {}", 1 << 20, c.wan.burst_kb);
  if (!mode_traits(c.mode).has_syncer && c.wan.emulated(c.units.count))
    fail("wan: links join learner units to the syncer and to each other; mode single has none "
         "(choose mode ddp, diloco, streaming or decoupled, or leave wan.bandwidth_mbit_s, "
         "latency_ms and jitter_ms at 0)");
  if (mode_traits(c.mode).gradient_ring && c.wan.format != "fp32" && c.wan.format != "bf16")
    fail("wan.format: ddp all-reduces gradients over the links in fp32 or bf16, got {} (int8, "
         "int4, int2 and sparse are for the outer modes' outer gradients)",
         c.wan.format);
}

// The quorum, the unit count and the outer step's options fit the mode and one another.
void check_outer(const Config& c) {
  const int M = c.units.count;
  if (c.syncer.quorum > M)
    fail("syncer.quorum: must be ≤ units.count = {}, got {}", M, c.syncer.quorum);
  if (!mode_traits(c.mode).has_syncer && M != 1)
    fail("units.count: mode single trains one unit, got {} (choose mode ddp, diloco, "
         "streaming or decoupled)",
         M);
  if (c.outer.anchor != "current" && c.outer.apply == "blend")
    fail("outer.anchor: {} measures a unit's progress from the Θ version it received, "
         "which needs outer.apply: overwrite or carry, got outer.apply: {} (use outer.anchor: current)",
         c.outer.anchor, c.outer.apply);
}

void check_launch(const LaunchConfig& l) {
  if (l.backoff_max_s < l.backoff_s)
    fail("launch.backoff_max_s: must be ≥ launch.backoff_s = {}, got {}", l.backoff_s, l.backoff_max_s);
  // Beyond a day a wait is a typing error (and its clock arithmetic would overflow).
  if (l.backoff_max_s > 86400 || l.drain_s > 86400)
    fail("{}: must be ≤ 86400 s, got {}", l.drain_s > 86400 ? "launch.drain_s" : "launch.backoff_max_s",
         l.drain_s > 86400 ? l.drain_s : l.backoff_max_s);
}

// The test hooks name a unit there is, in a mode that survives what they do; checkpoints are
// for the outer modes.
void check_debug_and_checkpoints(const Config& c) {
  const int M = c.units.count;
  if (c.debug.stall_unit >= M)
    fail("debug.stall_unit: must be < units.count = {}, got {}", M, c.debug.stall_unit);
  if (c.debug.nan_unit >= M)
    fail("debug.nan_unit: must be < units.count = {}, got {}", M, c.debug.nan_unit);
  // Elsewhere every merge needs every unit: the refused snapshot would stall the job.
  if (c.debug.nan_unit >= 0 && !mode_traits(c.mode).quorum)
    fail("debug.nan_unit: needs mode decoupled, got mode {}", mode_name(c.mode));
}
}  // namespace

void set_cuda_check(DeviceCheck check) { g_cuda_check = check; }

void validate(const Config& c, const std::string& source) {
  try {
    c.model.validate();
    check_unit_lists(c);
    check_machine(c);
    check_links(c);
    check_outer(c);
    chaos::validate(c);
    check_launch(c.launch);
    check_debug_and_checkpoints(c);
  } catch (const Error& err) {
    fail("{}: {}", source, err.what());
  }
}

namespace {

// `root` (null: defaults only) with the overrides applied, validated; errors name `source`.
Config load_root(const YAML::Node& root, const std::string& source,
                 const std::vector<std::string>& overrides) {
  Config config;
  if (root) config_schema::load_node(entries(), kListHint, config, root, "", source);
  for (const auto& o : overrides) apply_override(config, o, "--set");
  validate(config, overrides.empty() ? source : source + " with --set");
  return config;
}

YAML::Node parse_yaml(const std::function<YAML::Node()>& parse, const std::string& source) {
  try {
    return parse();
  } catch (const YAML::Exception& ex) {
    fail("{}: line {}: {}", source, ex.mark.line + 1, ex.msg);
  }
}

}  // namespace

Config load_config_text(const std::string& yaml, const std::string& source,
                        const std::vector<std::string>& overrides) {
  return load_root(parse_yaml([&] { return YAML::Load(yaml); }, source), source, overrides);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  if (path.empty()) return load_root(YAML::Node(), "defaults", overrides);
  std::error_code ec;  // (exists() without it throws filesystem_error for a name over 255 bytes)
  if (!std::filesystem::exists(path, ec)) {
    if (ec && ec != std::errc::no_such_file_or_directory)
      fail("{}: config file cannot be looked up ({}); expected a readable YAML file", path, ec.message());
    fail("{}: config file not found", path);
  }
  return load_root(parse_yaml([&] { return YAML::LoadFile(path); }, path), path, overrides);
}

std::string to_yaml(const Config& config) { return config_schema::to_yaml(entries(), config); }

std::vector<ConfigKeyDoc> config_keys(const Config& config) {
  std::vector<ConfigKeyDoc> docs;
  for (const auto& e : entries())
    if (e.removed.empty()) docs.push_back({e.key, e.show(config), e.doc});
  return docs;
}

namespace {

// What each mode does not use, and why (docs/training.md, "Learner units and the syncer": the table of
// modes and OuterPlan::from).
struct Unused {
  std::string prefix;  // a key, or a section ending in '.'
  const char* why;
};

// The keys each mode ignores: a table per mode, beside mode_traits.
std::vector<Unused> unused_in(const Config& c) {
  const char* no_outer = "its units all-reduce gradients every step; there is no outer optimizer";
  const char* all_units = "every merge has every unit (K = M), so there is no quorum to set and no grace window";
  switch (c.mode) {
    case Mode::single:
      return {{"units.", "it is one unit of all the job's ranks"},
              {"outer.", "it has no outer loop"},
              {"syncer.", "it has no syncer"},
              {"wan.", "it has no links between units"}};
    case Mode::ddp:
      return {{"outer.fragments", no_outer}, {"outer.overlap", no_outer}, {"outer.apply", no_outer},
              {"outer.blend_alpha", no_outer}, {"outer.lr", no_outer}, {"outer.momentum", no_outer},
              {"outer.merge", no_outer}, {"outer.anchor", no_outer}, {"outer.share_steps", no_outer},
              {"outer.warmup_steps", no_outer},
              {"syncer.quorum", no_outer}, {"syncer.grace_gamma", no_outer},
              {"syncer.grace_cap_steps", no_outer}};
    case Mode::diloco: {
      std::vector<Unused> u = {{"outer.fragments", "it synchronises all of θ every H steps (P = 1)"},
                               {"outer.overlap", "every unit waits for each merge before it goes on (τ = 0)"},
                               {"syncer.quorum", all_units},
                               {"syncer.grace_gamma", all_units},
                               {"syncer.grace_cap_steps", all_units}};
      if (c.outer.apply == "carry")
        u.push_back({"outer.apply", "with τ = 0 no step is made while a merge is in flight: carry is overwrite"});
      return u;
    }
    case Mode::streaming:
      return {{"syncer.quorum", all_units}, {"syncer.grace_gamma", all_units},
              {"syncer.grace_cap_steps", all_units}};
    case Mode::decoupled:
      return {};
  }
  return {};
}

// The wire keys of the formats `c` does not send (the mode's list names them first in single).
std::vector<Unused> unused_by_format(const Config& c) {
  std::vector<Unused> u;
  if (c.wan.format != "sparse")
    for (const char* key : {"wan.chunk", "wan.topk", "wan.down_topk", "wan.value_bits"})
      u.push_back({key, "only wan.format: sparse uses it"});
  if (c.wan.format != "int8" && c.wan.format != "int4" && c.wan.format != "int2")
    u.push_back({"wan.block", "only wan.format int8, int4 and int2 use it"});
  return u;
}

}  // namespace

std::vector<std::string> ignored_keys(const Config& config) {
  const std::vector<Unused> by_mode = unused_in(config), by_format = unused_by_format(config);
  const std::vector<ConfigKeyDoc> set = config_keys(config), defaults = config_keys(Config{});
  const auto matches = [](const Unused& u, const std::string& key) {
    return u.prefix.back() == '.' ? key.rfind(u.prefix, 0) == 0 : key == u.prefix;
  };
  std::vector<std::string> lines;
  for (size_t i = 0; i < set.size(); ++i) {
    if (set[i].default_value == defaults[i].default_value) continue;
    const std::string& key = set[i].key;
    const auto mode = std::find_if(by_mode.begin(), by_mode.end(), [&](const Unused& u) { return matches(u, key); });
    const auto format = std::find_if(by_format.begin(), by_format.end(), [&](const Unused& u) { return matches(u, key); });
    if (mode != by_mode.end())
      lines.push_back(fmt::format("{} = {} is ignored in mode {}: {}", key, set[i].default_value,
                                  mode_name(config.mode), mode->why));
    else if (format != by_format.end())
      lines.push_back(fmt::format("{} = {} is ignored with wan.format = {}: {}", key,
                                  set[i].default_value, config.wan.format, format->why));
  }
  return lines;
}

std::optional<std::string> sparse_anchor_note(const Config& c) {
  // (ddp never gets here with sparse: validate() refuses it.)
  if (c.wan.format != "sparse" || c.outer.anchor != "current" || !mode_traits(c.mode).has_syncer) return std::nullopt;
  return "wan.format = sparse with outer.anchor = current: what the down link leaves out makes the "
         "units' references lag Θ, and measured from Θ that lag counts as their progress; use "
         "outer.anchor: reference (docs/results.md, \"Sparse outer gradients\")";
}

std::optional<std::string> unsynced_tail(const Config& c) {
  if (!mode_traits(c.mode).rounds_in_steps) return std::nullopt;
  const int64_t W = c.outer.warmup_steps, H = c.outer.h, steps = c.train.steps;
  if (steps <= W) return std::nullopt;
  const int64_t tail = (steps - W) % H;
  if (tail == 0) return std::nullopt;
  const int64_t last = steps - tail;
  const std::string when =
      last > 0 ? fmt::format("the last time after step {}", last) : "never within the budget";
  const std::string budgets =
      last > 0 ? fmt::format("{} or {}", last, last + H) : fmt::format("{} (or lower outer.h)", H);
  return fmt::format(
      "train.steps = {}: mode diloco merges every outer.h = {} steps after outer.warmup_steps "
      "= {}, {}, so the last {} inner steps of every unit never reach the global model "
      "(trained on, then lost); set train.steps to {}",
      steps, H, W, when, tail, budgets);
}

void warn_config(const Config& config) {
  std::vector<std::string> lines = ignored_keys(config);
  if (auto tail = unsynced_tail(config)) lines.push_back(*tail);
  if (auto note = sparse_anchor_note(config)) lines.push_back(*note);
  for (const std::string& line : lines) std::fprintf(stderr, "ddiloco: warning: %s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace ddiloco
