// Prints a configuration's keys (`ddiloco config --list`, `ddiloco simulate --list`), plain or
// as the Markdown table docs/*.md are generated from.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace ddiloco::cli {

/// `Key` has string members key, default_value and doc.
template <typename Key>
void print_key_table(const std::vector<Key>& keys, bool markdown) {
  if (!markdown) {
    for (const auto& k : keys)
      std::printf("%-28s %-22s %s\n", k.key.c_str(), k.default_value.c_str(), k.doc.c_str());
    return;
  }
  // A '|' inside a cell would end it: Markdown wants it escaped.
  const auto cell = [](const std::string& s) {
    std::string out;
    for (const char c : s) {
      if (c == '|') out += '\\';
      out += c;
    }
    return out;
  };
  std::printf("| key | default | meaning |\n|---|---|---|\n");
  for (const auto& k : keys)
    std::printf("| `%s` | `%s` | %s |\n", k.key.c_str(), cell(k.default_value).c_str(),
                cell(k.doc).c_str());
}

}  // namespace ddiloco::cli
