// The one table of configuration keys, and YAML reading/writing driven by it.
#include "ddiloco/config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>

#include "ddiloco/error.hpp"

namespace ddiloco {

namespace {

// A check returns an empty string when the value is acceptable, else what was expected
// ("must be > 0").
template <typename T>
using Check = std::function<std::string(const T&)>;

struct Entry {
  std::string key;
  std::string doc;
  // Parses `node` into the config; throws Error("<what the value should be>, got <value>").
  std::function<void(Config&, const YAML::Node&)> parse;
  std::function<std::string(const Config&)> show;
  bool is_string = false;
};

std::string scalar_text(const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar();
  if (node.IsNull()) return "(empty)";
  std::ostringstream os;
  os << YAML::Dump(node);
  return os.str();
}

template <typename T>
T parse_value(const YAML::Node& node) {
  if (!node.IsScalar()) fail("expected a single value, got '{}'", scalar_text(node));
  const std::string& text = node.Scalar();
  if constexpr (std::is_same_v<T, std::string>) {
    return text;
  } else if constexpr (std::is_same_v<T, bool>) {
    std::string lower = text;
    std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
    if (lower == "true" || lower == "yes" || lower == "on" || lower == "1") return true;
    if (lower == "false" || lower == "no" || lower == "off" || lower == "0") return false;
    fail("expected true or false, got '{}'", text);
  } else if constexpr (std::is_integral_v<T>) {
    T value{};
    const char* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(text.data(), end, value);
    if (ec == std::errc() && ptr == end) return value;
    // Accept integral values written in floating-point notation ("1e6").
    char* dend = nullptr;
    const double d = std::strtod(text.c_str(), &dend);
    if (!text.empty() && *dend == '\0' && std::isfinite(d) && d == std::floor(d) &&
        std::abs(d) < 9e15)
      return static_cast<T>(d);
    fail("expected an integer, got '{}'", text);
  } else {
    char* dend = nullptr;
    const double d = std::strtod(text.c_str(), &dend);
    if (text.empty() || *dend != '\0' || !std::isfinite(d))
      fail("expected a finite number, got '{}'", text);
    return static_cast<T>(d);
  }
}

template <typename T>
std::string show_value(const T& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    return v;
  } else if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_floating_point_v<T>) {
    return fmt::format("{}", v);
  } else {
    return std::to_string(v);
  }
}

template <typename T, typename Access>
Entry field(std::string key, Access access, std::string doc, Check<T> check = {}) {
  Entry e;
  e.key = std::move(key);
  e.doc = std::move(doc);
  e.is_string = std::is_same_v<T, std::string>;
  e.parse = [access, check](Config& c, const YAML::Node& node) {
    T value = parse_value<T>(node);
    if (check) {
      if (std::string problem = check(value); !problem.empty())
        fail("{}, got {}", problem, scalar_text(node));
    }
    access(c) = value;
  };
  e.show = [access](const Config& c) { return show_value(access(const_cast<Config&>(c))); };
  return e;
}

template <typename T>
Check<T> at_least(T lo) {
  return [lo](const T& v) { return v >= lo ? "" : fmt::format("must be ≥ {}", lo); };
}
template <typename T>
Check<T> positive() {
  return [](const T& v) { return v > 0 ? "" : std::string("must be > 0"); };
}
inline Check<double> in_range(double lo, double hi, bool lo_open, bool hi_open) {
  return [=](const double& v) {
    const bool ok = (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
    return ok ? "" : fmt::format("must be in {}{}, {}{}", lo_open ? "(" : "[", lo, hi,
                                 hi_open ? ")" : "]");
  };
}
inline Check<std::string> non_empty() {
  return [](const std::string& v) { return v.empty() ? "must not be empty" : ""; };
}

#define DDILOCO_FIELD(T, KEY, MEMBER, DOC, ...) \
  field<T>(KEY, [](Config& c) -> T& { return c.MEMBER; }, DOC __VA_OPT__(, ) __VA_ARGS__)

const std::vector<Entry>& entries() {
  static const std::vector<Entry> table = {
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
      // model
      DDILOCO_FIELD(int, "model.vocab_size", model.vocab_size,
                    "tokens: 256 for byte-level text, 50257 for GPT-2 shards",
                    [](const int& v) {
                      return v >= 2 && v <= 65536 ? "" : std::string("must be in [2, 65536]");
                    }),
      DDILOCO_FIELD(int, "model.seq_len", model.seq_len, "context length T, tokens",
                    positive<int>()),
      DDILOCO_FIELD(int, "model.n_layer", model.n_layer, "transformer blocks", positive<int>()),
      DDILOCO_FIELD(int, "model.n_head", model.n_head,
                    "attention heads; must divide model.n_embd", positive<int>()),
      DDILOCO_FIELD(int, "model.n_embd", model.n_embd, "channels C", positive<int>()),
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
  };
  return table;
}

#undef DDILOCO_FIELD

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

const Entry& find_entry(const std::string& key, const std::string& source) {
  for (const auto& e : entries())
    if (e.key == key) return e;
  const Entry* best = nullptr;
  size_t best_d = 4;  // only suggest close matches
  for (const auto& e : entries()) {
    const size_t d = edit_distance(key, e.key);
    if (d < best_d) {
      best_d = d;
      best = &e;
    }
  }
  if (best) fail("{}: unknown key '{}' (did you mean '{}'?)", source, key, best->key);
  fail("{}: unknown key '{}' (`ddiloco config --list` shows the known keys)", source, key);
}

bool is_section(const std::string& key) {
  for (const auto& e : entries())
    if (e.key.starts_with(key + ".")) return true;
  return false;
}

void set_entry(Config& config, const std::string& key, const YAML::Node& node,
               const std::string& source) {
  if (is_section(key))
    fail("{}: {}: is a section, expected a mapping of its keys, got '{}'", source, key,
         scalar_text(node));
  const Entry& e = find_entry(key, source);
  try {
    e.parse(config, node);
  } catch (const Error& err) {
    fail("{}: {}: {}", source, key, err.what());
  }
}

void load_node(Config& config, const YAML::Node& node, const std::string& prefix,
               const std::string& source) {
  if (node.IsNull()) return;
  if (!node.IsMap()) {
    if (prefix.empty()) fail("{}: expected a mapping of sections at the top level", source);
    set_entry(config, prefix, node, source);
    return;
  }
  for (const auto& kv : node) {
    const std::string name = kv.first.as<std::string>();
    const std::string key = prefix.empty() ? name : prefix + "." + name;
    if (kv.second.IsMap()) {
      // A section; but a mapping given to a leaf key is a type error, not a section.
      if (!is_section(key)) {
        find_entry(key, source);  // unknown key → its own message
        fail("{}: {}: expected a single value, got a mapping", source, key);
      }
      load_node(config, kv.second, key, source);
    } else {
      set_entry(config, key, kv.second, source);
    }
  }
}

}  // namespace

void apply_override(Config& config, const std::string& assignment, const std::string& source) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    fail("{}: expected key=value, got '{}'", source, assignment);
  const std::string key = assignment.substr(0, eq);
  const std::string value = assignment.substr(eq + 1);
  const Entry& e = find_entry(key, source);
  YAML::Node node;
  if (e.is_string) {
    node = YAML::Node(value);
  } else {
    try {
      node = YAML::Load(value);
    } catch (const YAML::Exception& ex) {
      fail("{}: {}: cannot parse '{}': {}", source, key, value, ex.msg);
    }
  }
  set_entry(config, key, node, source);
}

void validate(const Config& c, const std::string& source) {
  try {
    c.model.validate();
    if (c.train.warmup_steps > c.train.steps)
      fail("train.warmup_steps: must be ≤ train.steps = {}, got {}", c.train.steps,
           c.train.warmup_steps);
  } catch (const Error& err) {
    fail("{}: {}", source, err.what());
  }
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config config;
  std::string source = "defaults";
  if (!path.empty()) {
    source = path;
    if (!std::filesystem::exists(path)) fail("{}: config file not found", path);
    YAML::Node root;
    try {
      root = YAML::LoadFile(path);
    } catch (const YAML::Exception& ex) {
      fail("{}: line {}: {}", path, ex.mark.line + 1, ex.msg);
    }
    load_node(config, root, "", path);
  }
  for (const auto& o : overrides) apply_override(config, o, "--set");
  if (!overrides.empty()) source += " with --set";
  validate(config, source);
  return config;
}

std::string to_yaml(const Config& config) {
  // Group keys by section, in table order.
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string section;
  for (const auto& e : entries()) {
    const size_t dot = e.key.find('.');
    const std::string s = e.key.substr(0, dot);
    if (s != section) {
      if (!section.empty()) out << YAML::EndMap;
      out << YAML::Key << s << YAML::Value << YAML::BeginMap;
      section = s;
    }
    const std::string value = e.show(config);
    out << YAML::Key << e.key.substr(dot + 1) << YAML::Value;
    if (e.is_string)
      out << YAML::DoubleQuoted << value;
    else
      out << value;
  }
  if (!section.empty()) out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::vector<ConfigKeyDoc> config_keys() {
  const Config defaults;
  std::vector<ConfigKeyDoc> docs;
  for (const auto& e : entries()) docs.push_back({e.key, e.show(defaults), e.doc});
  return docs;
}

}  // namespace ddiloco
