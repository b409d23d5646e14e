#include "ddiloco/checkpoint.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

#include "ddiloco/checksum.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/outer_plan.hpp"
#include "ddiloco/run_dir.hpp"
#include "io/h5.hpp"
#include "io/readers.hpp"
#include "io/tensors.hpp"

namespace ddiloco::checkpoint {

namespace fs = std::filesystem;

fs::path directory(const fs::path& root, int64_t id) {
  return root / fmt::format("ckpt_{:08d}", id);
}
fs::path unit_file(const fs::path& dir, int unit) { return dir / fmt::format("unit_{}.h5", unit); }
fs::path syncer_file(const fs::path& dir) { return dir / "syncer.h5"; }

namespace {

constexpr const char* kFormat = "ddiloco-checkpoint";

std::vector<hsize_t> dims1(size_t n) { return {static_cast<hsize_t>(n)}; }

void write_header(hid_t file, const char* role, int64_t id, const GptConfig& model,
                  const std::string& label) {
  h5::write_attr(file, "format", std::string(kFormat));
  h5::write_attr(file, "format_version", kFormatVersion);
  h5::write_attr(file, "role", std::string(role));
  h5::write_attr(file, "id", id);
  h5::write_model_shape(file, model, label);
}

GptConfig read_header(hid_t file, const char* role, const std::string& label) {
  const std::string format = h5::read_attr_string(file, "format", label);
  if (format != kFormat) fail("{}: format is '{}', expected '{}'", label, format, kFormat);
  const int64_t version = h5::read_attr_int(file, "format_version", label);
  if (version != kFormatVersion)
    fail("{}: format_version {} is not supported (expected {})", label, version, kFormatVersion);
  const std::string r = h5::read_attr_string(file, "role", label);
  if (r != role) fail("{}: role is '{}', expected '{}'", label, r, role);
  return h5::read_model_shape(file, label);
}

std::vector<int64_t> read_ints(hid_t loc, const std::string& name, size_t n,
                               const std::string& label) {
  std::vector<int64_t> v(n);
  h5::read_dataset(loc, name, v.data(), dims1(n), label);
  return v;
}

// A whole file's size and checksum, read in 4 MiB blocks.
std::pair<uint64_t, uint64_t> file_digest(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot be read", path.string());
  std::vector<char> buf(size_t{4} << 20);
  uint64_t size = 0, sum = 0x9E3779B97F4A7C15ULL;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto n = static_cast<size_t>(in.gcount());
    if (n == 0) break;
    sum = (sum * 0x100000001B3ULL) ^ checksum(std::as_bytes(std::span(buf.data(), n)));
    size += n;
  }
  return {size, sum};
}

std::string hex(uint64_t v) { return fmt::format("{:016x}", v); }

// ckpt_<digits> → id; −1 for anything else.
int64_t parse_id(const fs::path& dir) {
  const std::string name = dir.filename().string();
  if (!name.starts_with("ckpt_") || name.size() <= 5) return -1;
  int64_t id = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || id > INT64_MAX / 10 - 10) return -1;
    id = id * 10 + (name[i] - '0');
  }
  return id;
}

std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& entry : fs::directory_iterator(root, ec))
    if (entry.is_directory())
      if (const int64_t id = parse_id(entry.path()); id >= 0) out.emplace_back(id, entry.path());
  std::sort(out.begin(), out.end());
  return out;
}

// The cheap half of verify(): the manifest parses and every file it lists has its size (no
// checksums: prune runs after every checkpoint).
bool sizes_match(const fs::path& dir) {
  try {
    std::ifstream in(dir / "manifest.json");
    if (!in) return false;
    const nlohmann::json m = nlohmann::json::parse(in);
    for (const auto& f : m.at("files")) {
      std::error_code ec;
      if (fs::file_size(dir / f.at("name").get<std::string>(), ec) != f.at("bytes").get<uint64_t>() || ec)
        return false;
    }
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

double norm(std::span<const float> x) {
  double s = 0;
  for (float v : x) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}

}  // namespace

void write_syncer(const fs::path& dir, const SyncerState& s, int write_delay_ms) {
  const ParameterLayout layout = ParameterLayout::gpt2(s.model);
  const fs::path path = syncer_file(dir);
  const std::string label = path.string();
  h5::write_atomically(path, [&](hid_t file) {
    write_header(file, "syncer", s.id, s.model, label);
    h5::write_attr(file, "mode", s.mode);
    h5::write_attr(file, "config", s.config_yaml);
    h5::write_attr(file, "units", int64_t{s.units});
    h5::write_attr(file, "fragments", int64_t{s.fragments});
    h5::write_attr(file, "h", int64_t{s.h});
    h5::write_attr(file, "merges", s.merges);
    h5::write_attr(file, "tokens", s.tokens);
    h5::write_attr(file, "next_eval", s.next_eval);
    h5::write_attr(file, "elapsed_s", s.elapsed_s);
    h5::write_attr(file, "run_seed", s.run_seed);
    h5::write_attr(file, "chaos_seed", s.chaos_seed);
    h5::write_tensors(file, "params", layout, s.theta);
    if (write_delay_ms > 0)  // test hook: a kill lands while the file is half written
      std::this_thread::sleep_for(std::chrono::milliseconds(write_delay_ms));
    h5::write_tensors(file, "outer_momentum", layout, s.momentum);
    h5::Handle outer = h5::create_group(file, "outer", label);
    h5::write_dataset(outer, "versions", s.versions.data(), dims1(s.versions.size()));
    h5::write_dataset(outer, "merged_seq", s.merged_seq.data(),
                      {static_cast<hsize_t>(s.units), static_cast<hsize_t>(s.fragments)});
    h5::write_dataset(outer, "grace", s.grace.data(), dims1(s.grace.size()));
  });
}

SyncerState read_syncer(const fs::path& path) { return read_syncer(h5::open_file(path), path.string()); }

SyncerState read_syncer(h5::Handle file, const std::string& label) {
  SyncerState s;
  s.model = read_header(file, "syncer", label);
  s.id = h5::read_attr_int(file, "id", label);
  s.mode = h5::read_attr_string(file, "mode", label);
  s.config_yaml = h5::read_attr_string(file, "config", label);
  auto positive = [&](const char* name) {
    const int64_t v = h5::read_attr_int(file, name, label);
    if (v < 1 || v > 1 << 20) fail("{}: attribute {} = {} is out of range", label, name, v);
    return static_cast<int>(v);
  };
  s.units = positive("units");
  s.fragments = positive("fragments");
  s.h = positive("h");
  s.merges = h5::read_attr_int(file, "merges", label);
  s.tokens = h5::read_attr_int(file, "tokens", label);
  s.next_eval = h5::read_attr_int(file, "next_eval", label);
  s.elapsed_s = h5::read_attr_double(file, "elapsed_s", label);
  s.run_seed = h5::read_attr_int(file, "run_seed", label);
  s.chaos_seed = h5::read_attr_int(file, "chaos_seed", label);
  const ParameterLayout layout = ParameterLayout::gpt2(s.model);
  s.theta.resize(layout.size());
  s.momentum.resize(layout.size());
  h5::read_tensors(file, "params", layout, s.theta, label);
  h5::read_tensors(file, "outer_momentum", layout, s.momentum, label);
  h5::Handle outer = h5::open_group(file, "outer", label);
  const std::string where = label + ":/outer";
  s.versions = read_ints(outer, "versions", s.fragments, where);
  h5::check_fits_file(outer, uint64_t{8} * static_cast<uint64_t>(s.units) * s.fragments,
                      fmt::format("the {} × {} values of merged_seq", s.units, s.fragments), where);
  s.merged_seq.resize(static_cast<size_t>(s.units) * s.fragments);
  h5::read_dataset(outer, "merged_seq", s.merged_seq.data(),
                   {static_cast<hsize_t>(s.units), static_cast<hsize_t>(s.fragments)}, where);
  s.grace.resize(7);
  h5::read_dataset(outer, "grace", s.grace.data(), dims1(7), where);
  int64_t merges = 0;
  for (int64_t v : s.versions) {
    if (v < 0) fail("{}: /outer/versions holds a negative version {}", label, v);
    merges += v;
  }
  if (merges != s.merges)
    fail("{}: attribute merges = {} but /outer/versions sums to {}", label, s.merges, merges);
  return s;
}

int64_t unit_tokens(const fs::path& file) {
  h5::Handle f = h5::open_file(file);
  return h5::read_attr_int(f, "tokens", file.string());
}

std::vector<int64_t> unit_last_seq(const fs::path& file, int fragments) {
  h5::Handle f = h5::open_file(file);
  h5::Handle outer = h5::open_group(f, "outer", file.string());
  return read_ints(outer, "last_seq", fragments, file.string() + ":/outer");
}

bool write_unit(const fs::path& dir, const UnitState& s) {
  const ParameterLayout layout = ParameterLayout::gpt2(s.model);
  const fs::path path = unit_file(dir, s.unit);
  const std::string label = path.string();
  return h5::write_atomically(path, [&](hid_t file) {
    write_header(file, "unit", s.id, s.model, label);
    h5::write_attr(file, "unit", int64_t{s.unit});
    h5::write_attr(file, "ranks", static_cast<int64_t>(s.cursors.size()));
    h5::write_attr(file, "step", s.step);
    h5::write_attr(file, "tokens", s.tokens);
    h5::write_attr(file, "schedule_step", s.schedule_step);
    h5::write_attr(file, "rejoins", s.rejoins);
    h5::write_attr(file, "run_seed", s.run_seed);
    h5::write_attr(file, "lost", int64_t{s.lost});
    if (!s.sample_rng.empty()) h5::write_attr(file, "sample_rng", s.sample_rng);
    if (s.log_steps > 0) {
      h5::write_attr(file, "log_loss_sum", s.log_loss_sum);
      h5::write_attr(file, "log_steps", s.log_steps);
    }
    if (!s.lost) {
      h5::write_tensors(file, "params", layout, s.params);
      h5::Handle adamw = h5::create_group(file, "adamw", label);
      h5::write_attr(adamw, "step", s.adam_step);
      h5::write_tensors(adamw, "m", layout, s.adam_m);
      h5::write_tensors(adamw, "v", layout, s.adam_v);
    }
    h5::Handle outer = h5::create_group(file, "outer", label);
    const std::pair<const char*, const std::vector<int64_t>*> counters[] = {
        {"c_steps", &s.c_steps},     {"c_tok", &s.c_tok},
        {"sent_step", &s.sent_step}, {"last_seq", &s.last_seq},
        {"sent_c_steps", &s.sent_c_steps}, {"sent_c_tok", &s.sent_c_tok}};
    for (const auto& [name, v] : counters) h5::write_dataset(outer, name, v->data(), dims1(v->size()));
    for (size_t p = 0; p < s.sent_theta.size(); ++p)
      h5::write_dataset(outer, fmt::format("sent_theta_{}", p), s.sent_theta[p].data(),
                        dims1(s.sent_theta[p].size()));
    if (!s.wire_ref_version.empty()) {
      h5::write_dataset(outer, "wire_ref_version", s.wire_ref_version.data(), dims1(s.wire_ref_version.size()));
      for (size_t p = 0; p < s.wire_ref.size(); ++p)
        if (s.wire_ref_version[p] >= 0)
          h5::write_dataset(outer, fmt::format("wire_ref_{}", p), s.wire_ref[p].data(), dims1(s.wire_ref[p].size()));
      for (size_t p = 0; p < s.wire_residual.size(); ++p)
        if (!s.wire_residual[p].empty())
          h5::write_dataset(outer, fmt::format("wire_residual_{}", p), s.wire_residual[p].data(),
                            dims1(s.wire_residual[p].size()));
    }
    std::vector<int64_t> cursors;
    for (const auto& c : s.cursors) cursors.insert(cursors.end(), {c.epoch, c.batch});
    h5::Handle data = h5::create_group(file, "data", label);
    h5::write_dataset(data, "cursor", cursors.data(), {static_cast<hsize_t>(s.cursors.size()), 2});
  }, /*replace=*/false);
}

bool has_reference(const UnitState& unit, int p, int64_t version) {
  return static_cast<size_t>(p) < unit.wire_ref_version.size() && unit.wire_ref_version[p] == version &&
         !unit.lost && !unit.wire_ref[p].empty();
}

UnitState read_unit(const fs::path& path, int fragments, std::span<const size_t> fragment_numel) {
  return read_unit(h5::open_file(path), path.string(), fragments, fragment_numel);
}

UnitState read_unit(h5::Handle file, const std::string& label, int fragments,
                    std::span<const size_t> fragment_numel) {
  UnitState s;
  s.model = read_header(file, "unit", label);
  s.id = h5::read_attr_int(file, "id", label);
  s.unit = static_cast<int>(h5::read_attr_int(file, "unit", label));
  const int64_t ranks = h5::read_attr_int(file, "ranks", label);
  if (ranks < 1 || ranks > 1 << 20) fail("{}: attribute ranks = {} is out of range", label, ranks);
  s.step = h5::read_attr_int(file, "step", label);
  s.tokens = h5::read_attr_int(file, "tokens", label);
  s.schedule_step = h5::read_attr_int(file, "schedule_step", label);
  s.rejoins = h5::read_attr_int(file, "rejoins", label);
  s.run_seed = h5::read_attr_int(file, "run_seed", label);
  s.lost = h5::read_attr_int(file, "lost", label) != 0;
  if (h5::has_attr(file, "sample_rng")) s.sample_rng = h5::read_attr_string(file, "sample_rng", label);
  if (h5::has_attr(file, "log_steps")) {
    s.log_steps = h5::read_attr_int(file, "log_steps", label);
    s.log_loss_sum = h5::read_attr_double(file, "log_loss_sum", label);
    if (s.log_steps < 0 || !std::isfinite(s.log_loss_sum))
      fail("{}: log_steps = {} and log_loss_sum = {}: expected a count ≥ 0 and a finite sum", label, s.log_steps,
           s.log_loss_sum);
  }
  if (s.step < 0 || s.tokens < 0) fail("{}: negative step or tokens", label);
  const ParameterLayout layout = ParameterLayout::gpt2(s.model);
  if (!s.lost) {
    s.params.resize(layout.size());
    s.adam_m.resize(layout.size());
    s.adam_v.resize(layout.size());
    h5::read_tensors(file, "params", layout, s.params, label);
    h5::Handle adamw = h5::open_group(file, "adamw", label);
    s.adam_step = h5::read_attr_int(adamw, "step", label + ":/adamw");
    h5::read_tensors(adamw, "m", layout, s.adam_m, label + ":/adamw");
    h5::read_tensors(adamw, "v", layout, s.adam_v, label + ":/adamw");
  }
  h5::Handle outer = h5::open_group(file, "outer", label);
  const std::string where = label + ":/outer";
  s.c_steps = read_ints(outer, "c_steps", fragments, where);
  s.c_tok = read_ints(outer, "c_tok", fragments, where);
  s.sent_step = read_ints(outer, "sent_step", fragments, where);
  s.last_seq = read_ints(outer, "last_seq", fragments, where);
  s.sent_c_steps = read_ints(outer, "sent_c_steps", fragments, where);
  s.sent_c_tok = read_ints(outer, "sent_c_tok", fragments, where);
  // Every per-fragment vector is exactly its fragment long (given fragment_numel; else as long
  // as the others of its fragment): the resume mixes and packs them against the fragment.
  if (!fragment_numel.empty() && fragment_numel.size() != static_cast<size_t>(fragments))
    fail("{}: read_unit: {} fragment sizes for {} fragments", label, fragment_numel.size(), fragments);
  std::vector<size_t> seen(static_cast<size_t>(fragments), 0);
  auto fragment_vector = [&](const char* stem, int p) {
    const std::string name = fmt::format("{}_{}", stem, p);
    const auto d = h5::dataset_dims(outer, name, where);
    size_t& numel = seen[static_cast<size_t>(p)];
    if (!fragment_numel.empty()) numel = fragment_numel[static_cast<size_t>(p)];
    if (d.size() != 1 || (numel != 0 && d[0] != numel))
      fail("{}: {} has shape ({}), expected ({}): fragment {} has {} parameters (outer.fragments = {})", where,
           name, fmt::join(d, ", "), numel, p, numel, fragments);
    numel = d[0];
    h5::check_fits_file(outer, uint64_t{numel} * sizeof(float), fmt::format("the {} values of {}", numel, name), where);
    std::vector<float> v(numel);
    h5::read_dataset(outer, name, v.data(), d, where);
    return v;
  };
  for (int p = 0; p < fragments && h5::exists(outer, fmt::format("sent_theta_{}", p)); ++p)
    s.sent_theta.push_back(fragment_vector("sent_theta", p));
  if (h5::exists(outer, "wire_ref_version")) {
    s.wire_ref_version = read_ints(outer, "wire_ref_version", fragments, where);
    s.wire_ref.resize(fragments);
    s.wire_residual.resize(fragments);
    for (int p = 0; p < fragments; ++p) {
      if (s.wire_ref_version[p] >= 0) s.wire_ref[p] = fragment_vector("wire_ref", p);
      if (h5::exists(outer, fmt::format("wire_residual_{}", p))) s.wire_residual[p] = fragment_vector("wire_residual", p);
    }
  }
  h5::Handle data = h5::open_group(file, "data", label);
  std::vector<int64_t> cursors(static_cast<size_t>(ranks) * 2);
  h5::read_dataset(data, "cursor", cursors.data(), {static_cast<hsize_t>(ranks), 2}, label + ":/data");
  for (int64_t r = 0; r < ranks; ++r) {
    if (cursors[2 * r] < 0 || cursors[2 * r + 1] < 0)
      fail("{}: /data/cursor of rank {} is negative", label, r);
    s.cursors.push_back({cursors[2 * r], cursors[2 * r + 1]});
  }
  return s;
}

void write_manifest(const fs::path& dir, int64_t id, const Config& config,
                    const nlohmann::json& summary) {
  nlohmann::json files = nlohmann::json::array();
  std::vector<fs::path> paths;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file() && entry.path().extension() == ".h5") paths.push_back(entry.path());
  std::sort(paths.begin(), paths.end());
  for (const auto& p : paths) {
    const auto [bytes, sum] = file_digest(p);
    files.push_back({{"name", p.filename().string()}, {"bytes", bytes}, {"checksum", hex(sum)}});
  }
  std::vector<int> unit_ranks;
  for (int u = 0; u < config.units.count; ++u) unit_ranks.push_back(config.unit_ranks(u));
  nlohmann::json m = {{"format", kFormat},
                      {"format_version", kFormatVersion},
                      {"id", id},
                      {"mode", mode_name(config.mode)},
                      {"model",
                       {{"vocab_size", config.model.vocab_size},
                        {"seq_len", config.model.seq_len},
                        {"n_layer", config.model.n_layer},
                        {"n_head", config.model.n_head},
                        {"n_embd", config.model.n_embd}}},
                      {"units", config.units.count},
                      {"unit_ranks", unit_ranks},
                      {"fragments", OuterPlan::fragments_of(config)},
                      {"h", config.outer.h},
                      {"warmup_steps", config.outer.warmup_steps},
                      {"run_seed", config.run.seed},
                      {"files", files}};
  if (summary.is_object()) m.update(summary);
  write_text_atomically(dir / "manifest.json", m.dump(2) + "\n");
}

nlohmann::json verify(const fs::path& dir) {
  const fs::path path = dir / "manifest.json";
  std::error_code ec;
  if (!fs::exists(dir, ec)) fail("{}: no such checkpoint directory", dir.string());
  if (!fs::is_directory(dir, ec))
    fail("{}: is a file; a checkpoint is the directory ckpt_<id> that holds it", dir.string());
  if (!fs::exists(path) && !list_checkpoints(dir).empty())
    fail("{}: holds checkpoints (ckpt_<id>): pass one of them, or use --resume auto",
         dir.string());
  if (!fs::exists(path) && parse_id(dir) < 0)
    fail("{}: not a checkpoint directory (no manifest.json, not named ckpt_<id>)", dir.string());
  if (!fs::exists(path)) fail("{}: no manifest.json (incomplete: the job stopped while writing it)", dir.string());
  nlohmann::json m;
  try {
    std::ifstream in(path);
    m = nlohmann::json::parse(in);
    if (m.at("format").get<std::string>() != kFormat)
      fail("{}: format is '{}', expected '{}'", path.string(), m.at("format").get<std::string>(), kFormat);
    if (m.at("format_version").get<int64_t>() != kFormatVersion)
      fail("{}: format_version {} is not supported (expected {})", path.string(),
           m.at("format_version").get<int64_t>(), kFormatVersion);
    const int units = m.at("units").get<int>();
    std::map<std::string, bool> needed;  // mode single has no syncer
    if (m.at("mode").get<std::string>() != "single") needed["syncer.h5"] = false;
    for (int u = 0; u < units; ++u) needed[fmt::format("unit_{}.h5", u)] = false;
    for (const auto& f : m.at("files")) {
      const std::string name = f.at("name").get<std::string>();
      const fs::path file = dir / name;
      if (!fs::exists(file)) fail("{}: missing (listed in the manifest)", file.string());
      const auto [bytes, sum] = file_digest(file);
      if (bytes != f.at("bytes").get<uint64_t>())
        fail("{}: {} bytes, the manifest records {} (truncated or replaced)", file.string(), bytes,
             f.at("bytes").get<uint64_t>());
      if (hex(sum) != f.at("checksum").get<std::string>())
        fail("{}: checksum {} differs from the manifest's {} (corrupted)", file.string(), hex(sum),
             f.at("checksum").get<std::string>());
      if (needed.contains(name)) needed[name] = true;
    }
    for (const auto& [name, seen] : needed)
      if (!seen) fail("{}: the manifest does not list {}", path.string(), name);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid manifest: {}", path.string(), e.what());
  }
  return m;
}

void check_compatible(const nlohmann::json& m, const Config& config, const fs::path& dir) {
  const std::string where = dir.string();
  auto mismatch = [&](const std::string& key, const auto& theirs, const auto& ours) {
    fail("checkpoint {} is of another job: {} is {} there, {} in this configuration", where, key,
         theirs, ours);
  };
  try {
    const auto& model = m.at("model");
    const std::pair<const char*, int> shape[] = {
        {"vocab_size", config.model.vocab_size}, {"seq_len", config.model.seq_len},
        {"n_layer", config.model.n_layer},       {"n_head", config.model.n_head},
        {"n_embd", config.model.n_embd}};
    for (const auto& [key, ours] : shape)
      if (model.at(key).get<int>() != ours) mismatch(std::string("model.") + key, model.at(key).get<int>(), ours);
    if (m.at("mode").get<std::string>() != mode_name(config.mode))
      mismatch("mode", m.at("mode").get<std::string>(), mode_name(config.mode));
    // Another seed is another run: its initialisation and data order (manifests from before
    // the key have none).
    if (m.contains("run_seed") && m.at("run_seed").get<int64_t>() != config.run.seed)
      mismatch("run.seed", m.at("run_seed").get<int64_t>(), config.run.seed);
    if (m.at("units").get<int>() != config.units.count)
      mismatch("units.count", m.at("units").get<int>(), config.units.count);
    if (config.mode == Mode::single) return;  // any ranks, one fragment, no rounds
    const auto ranks = m.at("unit_ranks").get<std::vector<int>>();
    for (int u = 0; u < config.units.count && u < static_cast<int>(ranks.size()); ++u)
      if (ranks[u] != config.unit_ranks(u))
        mismatch(fmt::format("the ranks of unit {}", u), ranks[u], config.unit_ranks(u));
    const int fragments = OuterPlan::fragments_of(config);
    if (m.at("fragments").get<int>() != fragments)
      mismatch("outer.fragments", m.at("fragments").get<int>(), fragments);
    // diloco counts rounds in steps (a unit back from a crash redoes its round from step
    // round·H, after the warm-up's rounds of one step): neither can change under it.
    const bool rounds_in_steps = OuterPlan::from(config).redoes_lost_round;
    if (rounds_in_steps && m.at("h").get<int>() != config.outer.h)
      mismatch("outer.h (diloco counts its rounds in steps)", m.at("h").get<int>(), config.outer.h);
    const int warmup = m.value("warmup_steps", 0);  // checkpoints from before the key: none
    if (rounds_in_steps && warmup != config.outer.warmup_steps)
      mismatch("outer.warmup_steps (diloco counts its rounds in steps)", warmup, config.outer.warmup_steps);
  } catch (const nlohmann::json::exception& e) {
    fail("{}/manifest.json: invalid manifest: {}", where, e.what());
  }
}

std::string choose(const Config& config, const std::string& resume) {
  if (resume == "auto") {
    const fs::path root = config.checkpoint.directory(config.run.dir);
    std::vector<std::string> warnings;
    const auto found = find_latest(root, warnings);
    for (const auto& w : warnings) std::fprintf(stderr, "ddiloco: warning: %s\n", w.c_str());
    if (!found) {
      std::printf("--resume auto: no checkpoint in %s: starting fresh\n", root.c_str());
      return "";
    }
    check_compatible(found->manifest, config, found->dir);
    return found->dir.string();
  }
  const nlohmann::json manifest = verify(resume);
  check_compatible(manifest, config, resume);
  return resume;
}

std::optional<Found> find_latest(const fs::path& root, std::vector<std::string>& warnings) {
  auto all = list_checkpoints(root);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      return Found{it->second, verify(it->second)};
    } catch (const Error& e) {
      warnings.push_back(fmt::format("skipping checkpoint {}: {}", it->second.string(), e.what()));
    }
  }
  return std::nullopt;
}

void prune(const fs::path& root, int keep) {
  const auto all = list_checkpoints(root);
  std::vector<int64_t> complete;
  for (const auto& [id, dir] : all)
    if (sizes_match(dir)) complete.push_back(id);
  if (complete.empty()) return;
  const int64_t newest = complete.back();
  const int64_t oldest_kept =
      complete[complete.size() - std::min<size_t>(complete.size(), static_cast<size_t>(keep))];
  for (const auto& [id, dir] : all) {
    const bool is_complete = std::binary_search(complete.begin(), complete.end(), id);
    if ((is_complete && id < oldest_kept) || (!is_complete && id < newest)) {
      std::error_code ec;
      // The manifest first: a half-deleted checkpoint must never look complete.
      fs::remove(dir / "manifest.json", ec);
      fs::remove_all(dir, ec);
    }
  }
}

void check_directory(const fs::path& root) {
  std::error_code ec;
  if (fs::exists(root, ec) && !fs::is_directory(root, ec))
    fail("checkpoint.dir: '{}' exists and is not a directory", root.string());
  fs::create_directories(root, ec);
  if (ec) fail("checkpoint.dir: cannot create '{}': {}", root.string(), ec.message());
  // The probe's name is predictable: created afresh, never through a file planted there.
  const fs::path probe = root / fmt::format(".write_test_{}", ::getpid());
  try {
    UniqueFd fd = create_new_file(probe, 0600);
    write_all(fd.get(), "ddiloco", 7, probe);
    if (fd.close() != 0) fail("{}: write failed: {}", probe.string(), std::strerror(errno));
  } catch (const Error& e) {
    fs::remove(probe, ec);
    fail("checkpoint.dir: '{}' is not writable ({})", root.string(), e.what());
  }
  fs::remove(probe, ec);
}

int64_t highest_id(const fs::path& root) {
  const auto all = list_checkpoints(root);
  return all.empty() ? 0 : all.back().first;
}

std::string describe(const fs::path& path) {
  std::string out;
  if (fs::is_directory(path) && !fs::exists(path / "manifest.json") &&
      !list_checkpoints(path).empty()) {
    out += fmt::format("{}: checkpoints (newest last)\n", path.string());
    for (const auto& [id, dir] : list_checkpoints(path)) {
      try {
        const auto m = verify(dir);
        if (m.value("mode", "") == "single")  // no merges: its step
          out += fmt::format("  {}  complete  step {}  tokens {}\n", dir.filename().string(),
                             m.value("step", int64_t{0}), m.value("tokens", int64_t{0}));
        else
          out += fmt::format("  {}  complete  merges {}  tokens {}\n", dir.filename().string(),
                             m.value("merges", int64_t{0}), m.value("tokens", int64_t{0}));
      } catch (const Error& e) {
        out += fmt::format("  {}  INCOMPLETE OR CORRUPT: {}\n", dir.filename().string(), e.what());
      }
    }
    return out;
  }
  fs::path dir = path;
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    const auto m = verify(path);
    out += fmt::format("{}: complete checkpoint (manifest verified)\n{}\n", path.string(), m.dump(2));
    for (const auto& f : m.at("files")) files.push_back(path / f.at("name").get<std::string>());
  } else {
    files.push_back(path);
  }
  for (const auto& file : files) {
    h5::Handle h = h5::open_file(file);
    const std::string format = h5::read_attr_string(h, "format", file.string());
    if (format != kFormat)
      fail("{}: format '{}' is not a checkpoint's ('{}'); a model file is read by ddiloco eval",
           file.string(), format, kFormat);
    const std::string role = h5::read_attr_string(h, "role", file.string());
    h.reset();
    if (role == "syncer") {
      const SyncerState s = read_syncer(file);
      out += fmt::format(
          "{}: syncer, checkpoint {}, mode {}, {} units, {} fragments (H = {})\n"
          "  merges {} (versions {}), tokens {}, elapsed {:.1f} s, next global eval at merge {}\n"
          "  Θ: {} parameters, norm {:.6g}; outer momentum norm {:.6g}\n"
          "  grace averages (s): step {:.4g}, median step {:.4g}, quorum {:.4g}, sync {:.4g}\n"
          "  last snapshot merged per unit and fragment: {}\n  seeds: run {}, chaos {}\n",
          file.string(), s.id, s.mode, s.units, s.fragments, s.h, s.merges,
          nlohmann::json(s.versions).dump(), s.tokens, s.elapsed_s, s.next_eval, s.theta.size(),
          norm(s.theta), norm(s.momentum), s.grace[0], s.grace[1], s.grace[2], s.grace[3],
          nlohmann::json(s.merged_seq).dump(), s.run_seed, s.chaos_seed);
    } else if (role == "unit") {
      h5::Handle f = h5::open_file(file);
      h5::Handle outer = h5::open_group(f, "outer", file.string());
      const auto c_steps = h5::dataset_dims(outer, "c_steps", file.string());
      // The fragment count from the file: a scalar or n-d c_steps has no first dimension.
      if (c_steps.size() != 1 || c_steps[0] < 1 || c_steps[0] > (1 << 20))
        fail("{}:/outer: dataset 'c_steps' has shape ({}), expected (P,) with P fragments in [1, "
             "2^20]",
             file.string(), fmt::join(c_steps, ", "));
      const int P = static_cast<int>(c_steps[0]);
      outer.reset();
      f.reset();
      const UnitState s = read_unit(file, P);
      nlohmann::json cursors = nlohmann::json::array();
      for (const auto& c : s.cursors) cursors.push_back({c.epoch, c.batch});
      out += fmt::format(
          "{}: unit {}, checkpoint {}, {} ranks, step {}, tokens {}{}\n"
          "  per fragment: steps since merge {}, tokens since merge {}, sent at step {}, last "
          "snapshot {}\n  data cursors (epoch, batch) per rank: {}\n",
          file.string(), s.unit, s.id, s.cursors.size(), s.step, s.tokens,
          s.lost ? " — lost (down after a crash: restarts from Θ)" : "",
          nlohmann::json(s.c_steps).dump(), nlohmann::json(s.c_tok).dump(),
          nlohmann::json(s.sent_step).dump(), nlohmann::json(s.last_seq).dump(), cursors.dump());
      if (!s.lost)
        out += fmt::format("  θ: {} parameters, norm {:.6g}; AdamW step {}, ‖m‖ {:.6g}, ‖v‖ {:.6g}\n",
                           s.params.size(), norm(s.params), s.adam_step, norm(s.adam_m), norm(s.adam_v));
    } else {
      fail("{}: role '{}' is not a checkpoint file's", file.string(), role);
    }
  }
  return out;
}

}  // namespace ddiloco::checkpoint
