// The machinery behind a table of configuration keys: typed parsing of YAML scalars and
// lists, range checks that say what was expected, unknown-key suggestions, removed keys that
// say what replaced them, `--set key=value` overrides and YAML output. Each configuration
// (the run's, the simulator's) declares its table once with field<T>(key, accessor, doc,
// check) and gets loading and printing from here.
// Errors are ddiloco::Error with a one-line message naming the source, the key and the
// expected value, e.g. "configs/x.yaml: train.lr: must be > 0, got -0.001".
#pragma once

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "ddiloco/error.hpp"

namespace ddiloco::config_schema {

// A check returns an empty string when the value is acceptable, else what was expected
// ("must be > 0").
template <typename T>
using Check = std::function<std::string(const T&)>;

template <typename C>
struct Entry {
  std::string key;
  std::string doc;
  // Parses `node` into the config; throws Error("<what the value should be>, got <value>").
  std::function<void(C&, const YAML::Node&)> parse;
  std::function<std::string(const C&)> show;
  bool is_string = false;
  bool is_list = false;
  /// Non-empty: a key the configuration no longer has (removed_key), and what to use
  /// instead. Setting it fails with this; listings and YAML output leave it out.
  std::string removed;
};

inline std::string scalar_text(const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar().empty() ? "''" : node.Scalar();
  if (node.IsNull()) return "(empty)";
  std::ostringstream os;
  os << YAML::Dump(node);
  return os.str();
}

template <typename T>
T parse_value(const YAML::Node& node);

// Plain decimal notation only: digits, sign, point, exponent (no hex, inf, nan).
inline bool looks_decimal(const std::string& text) {
  if (text.empty()) return false;
  for (char c : text)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '+' || c == '.' ||
          c == 'e' || c == 'E'))
      return false;
  return true;
}

template <typename T>
struct is_vector : std::false_type {};
template <typename T>
struct is_vector<std::vector<T>> : std::true_type {};

template <typename V>
V parse_list(const YAML::Node& node) {
  using T = typename V::value_type;
  V out;
  if (node.IsNull()) return out;
  if (!node.IsSequence()) fail("expected a list like [1, 2], got '{}'", scalar_text(node));
  for (size_t i = 0; i < node.size(); ++i) {
    try {
      out.push_back(parse_value<T>(node[i]));
    } catch (const Error& e) {
      fail("element {}: {}", i, e.what());
    }
  }
  return out;
}

template <typename T>
T parse_value(const YAML::Node& node) {
  if constexpr (is_vector<T>::value) {
    return parse_list<T>(node);
  } else {
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
    if (!looks_decimal(text)) fail("expected an integer, got '{}'", text);
    T value{};
    const char* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(text.data(), end, value);
    if (ec == std::errc() && ptr == end) return value;
    // Integral values written in floating-point notation ("1e6") are accepted.
    char* dend = nullptr;
    const double d = std::strtod(text.c_str(), &dend);
    const bool integral = *dend == '\0' && std::isfinite(d) && d == std::floor(d);
    if (ec == std::errc::result_out_of_range ||
        (integral && (d < static_cast<double>(std::numeric_limits<T>::min()) ||
                      d > static_cast<double>(std::numeric_limits<T>::max()))))
      fail("out of range [{}, {}], got '{}'", std::numeric_limits<T>::min(),
           std::numeric_limits<T>::max(), text);
    if (integral) return static_cast<T>(d);
    fail("expected an integer, got '{}'", text);
  } else {
    if (!looks_decimal(text)) fail("expected a finite number, got '{}'", text);
    char* dend = nullptr;
    const double d = std::strtod(text.c_str(), &dend);
    if (*dend != '\0' || !std::isfinite(d)) fail("expected a finite number, got '{}'", text);
    return static_cast<T>(d);
  }
  }
}

// A string as an element of a YAML flow list: plain where YAML reads it back as the same
// string ([dp, elastic_dp]), else double-quoted ("a b", "x,y", "", "null").
inline std::string flow_list_element(const std::string& v) {
  bool plain = !v.empty() && v != "null" && v != "Null" && v != "NULL" && v != "~";
  for (char c : v)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' ||
          c == '/' || c == '=' || c == '+'))
      plain = false;
  if (plain) return v;
  std::string out = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

template <typename T>
std::string show_value(const T& v) {
  if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + flow_list_element(v[i]);
    return out + "]";
  } else if constexpr (is_vector<T>::value) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + show_value(v[i]);
    return out + "]";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return v;
  } else if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_floating_point_v<T>) {
    return fmt::format("{}", v);
  } else {
    return std::to_string(v);
  }
}

template <typename T, typename C, typename Access>
Entry<C> field(std::string key, Access access, std::string doc, Check<T> check = {}) {
  Entry<C> e;
  e.key = std::move(key);
  e.doc = std::move(doc);
  e.is_string = std::is_same_v<T, std::string>;
  e.is_list = is_vector<T>::value;
  e.parse = [access, check](C& c, const YAML::Node& node) {
    T value = parse_value<T>(node);
    if (check) {
      if (std::string problem = check(value); !problem.empty())
        fail("{}, got {}", problem, scalar_text(node));
    }
    access(c) = value;
  };
  e.show = [access](const C& c) { return show_value(access(const_cast<C&>(c))); };
  return e;
}

// A key that was removed or renamed: a config that still sets it fails with
// "<source>: <key>: <instead>" rather than an unknown-key guess. `old_default`, the value
// every effective configuration (run.dir/config.yaml, a checkpoint's) written before the
// removal lists, is accepted and ignored, so that older runs and checkpoints still load.
template <typename C>
Entry<C> removed_key(std::string key, std::string instead, std::string old_default) {
  Entry<C> e;
  e.key = std::move(key);
  e.removed = instead;
  e.parse = [instead, old_default](C&, const YAML::Node& node) {
    if (!node.IsScalar() || scalar_text(node) != old_default) fail("{}", instead);
  };
  e.show = [](const C&) { return std::string(); };
  return e;
}

template <typename T>
Check<T> at_least(T lo) {
  return [lo](const T& v) { return v >= lo ? "" : fmt::format("must be ≥ {}", lo); };
}
inline Check<int> in_int_range(int lo, int hi) {
  return [lo, hi](const int& v) {
    return v >= lo && v <= hi ? "" : fmt::format("must be in [{}, {}]", lo, hi);
  };
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
inline Check<std::string> one_of(std::vector<std::string> options) {
  return [options](const std::string& v) {
    std::string list;
    for (const auto& o : options) {
      if (o == v) return std::string();
      list += (list.empty() ? "" : ", ") + o;
    }
    return "must be one of " + list;
  };
}
template <typename T>
Check<std::vector<T>> each_at_least(T lo) {
  return [lo](const std::vector<T>& v) {
    for (const T& x : v)
      if (x < lo) return fmt::format("every element must be ≥ {}", lo);
    return std::string();
  };
}
inline Check<std::string> non_empty() {
  return [](const std::string& v) { return v.empty() ? "must not be empty" : ""; };
}

// The edit distance between `a` and `b` when it is below `bound`, else `bound`: only close keys
// are suggested, so a key whose length differs by `bound` or more is not compared, and the
// comparison stops at the first row whose every cell has reached `bound` (a long, unknown key
// then costs a length test per known key, not |a|·|b| steps each).
inline size_t edit_distance(const std::string& a, const std::string& b,
                            size_t bound = std::numeric_limits<size_t>::max()) {
  const size_t gap = a.size() > b.size() ? a.size() - b.size() : b.size() - a.size();
  if (gap >= bound) return bound;
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    size_t row_min = cur[0];
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
      row_min = std::min(row_min, cur[j]);
    }
    if (row_min >= bound) return bound;  // every later row is at least as far
    std::swap(prev, cur);
  }
  return std::min(prev[b.size()], bound);
}

// `list_hint` says where the known keys are listed ("`ddiloco config --list` shows ...").
template <typename C>
const Entry<C>& find_entry(const std::vector<Entry<C>>& entries, const std::string& key,
                           const std::string& source, const std::string& list_hint) {
  for (const auto& e : entries)
    if (e.key == key) return e;  // (a removed key's parse says what replaced it)
  const Entry<C>* best = nullptr;
  size_t best_d = 4;  // only suggest close matches
  for (const auto& e : entries) {
    if (!e.removed.empty()) continue;
    const size_t d = edit_distance(key, e.key, best_d);
    if (d < best_d) {
      best_d = d;
      best = &e;
    }
  }
  if (best) fail("{}: unknown key '{}' (did you mean '{}'?)", source, key, best->key);
  fail("{}: unknown key '{}' ({})", source, key, list_hint);
}

template <typename C>
bool is_section(const std::vector<Entry<C>>& entries, const std::string& key) {
  // e.key starts with key + "." (without building that string for every entry)
  for (const auto& e : entries)
    if (e.removed.empty() && e.key.size() > key.size() && e.key[key.size()] == '.' &&
        e.key.starts_with(key))
      return true;
  return false;
}

template <typename C>
void set_entry(const std::vector<Entry<C>>& entries, const std::string& list_hint, C& config,
               const std::string& key, const YAML::Node& node, const std::string& source) {
  if (is_section(entries, key))
    fail("{}: {}: is a section, expected a mapping of its keys, got '{}'", source, key,
         scalar_text(node));
  const Entry<C>& e = find_entry(entries, key, source, list_hint);
  try {
    e.parse(config, node);
  } catch (const Error& err) {
    fail("{}: {}: {}", source, key, err.what());
  }
}

// Loads a YAML mapping of sections and keys into `config`; errors name `source` and the key.
template <typename C>
void load_node(const std::vector<Entry<C>>& entries, const std::string& list_hint, C& config,
               const YAML::Node& node, const std::string& prefix, const std::string& source) {
  if (node.IsNull()) return;
  if (!node.IsMap()) {
    if (prefix.empty()) fail("{}: expected a mapping of sections at the top level", source);
    set_entry(entries, list_hint, config, prefix, node, source);
    return;
  }
  std::set<std::string> seen;
  for (const auto& kv : node) {
    if (!kv.first.IsScalar())
      fail("{}: line {}: keys must be plain names, got '{}'", source, kv.first.Mark().line + 1,
           scalar_text(kv.first));
    const std::string name = kv.first.Scalar();
    const std::string key = prefix.empty() ? name : prefix + "." + name;
    if (!seen.insert(name).second)
      fail("{}: line {}: duplicate key '{}'", source, kv.first.Mark().line + 1, key);
    if (kv.second.IsMap()) {
      // A section; but a mapping given to a leaf key is a type error, not a section.
      if (!is_section(entries, key)) {
        find_entry(entries, key, source, list_hint);  // unknown key → its own message
        fail("{}: {}: expected a single value, got a mapping", source, key);
      }
      load_node(entries, list_hint, config, kv.second, key, source);
    } else {
      set_entry(entries, list_hint, config, key, kv.second, source);
    }
  }
}

// Applies one `key=value` override (from --set); strings are taken verbatim, other values
// are parsed as YAML.
template <typename C>
void apply_override(const std::vector<Entry<C>>& entries, const std::string& list_hint,
                    C& config, const std::string& assignment, const std::string& source) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    fail("{}: expected key=value, got '{}'", source, assignment);
  const std::string key = assignment.substr(0, eq);
  const std::string value = assignment.substr(eq + 1);
  const Entry<C>& e = find_entry(entries, key, source, list_hint);
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
  set_entry(entries, list_hint, config, key, node, source);
}

// The whole configuration as YAML: top-level keys first, then sections, in table order.
template <typename C>
std::string to_yaml(const std::vector<Entry<C>>& entries, const C& config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  auto emit_value = [&](const Entry<C>& e) {
    const std::string value = e.show(config);
    if (e.is_string)
      out << YAML::DoubleQuoted << value;
    else if (e.is_list) {
      // Flow style for this list only ([1, 1, 2]); block style everywhere else.
      const YAML::Node list = YAML::Load(value);
      out << YAML::Flow << YAML::BeginSeq;
      for (const auto& item : list) out << item.Scalar();
      out << YAML::EndSeq;
    }
    else
      out << value;
  };
  for (const auto& e : entries) {
    if (!e.removed.empty() || e.key.find('.') != std::string::npos) continue;
    out << YAML::Key << e.key << YAML::Value;
    emit_value(e);
  }
  std::string section;
  for (const auto& e : entries) {
    const size_t dot = e.key.find('.');
    if (!e.removed.empty() || dot == std::string::npos) continue;
    const std::string s = e.key.substr(0, dot);
    if (s != section) {
      if (!section.empty()) out << YAML::EndMap;
      out << YAML::Key << s << YAML::Value << YAML::BeginMap;
      section = s;
    }
    out << YAML::Key << e.key.substr(dot + 1) << YAML::Value;
    emit_value(e);
  }
  if (!section.empty()) out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace ddiloco::config_schema
