#include "ddiloco/corpus.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "ddiloco/error.hpp"
#include "ddiloco/run_dir.hpp"
#include "ddiloco/shard.hpp"

namespace ddiloco {

namespace fs = std::filesystem;

std::vector<Document> parse_kjv(std::string_view bible_output) {
  static const std::regex verse(R"(^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$)");
  std::vector<Document> books;
  std::string last_chapter;
  size_t line_no = 0;
  size_t pos = 0;
  while (pos < bible_output.size()) {
    size_t end = bible_output.find('\n', pos);
    if (end == std::string_view::npos) end = bible_output.size();
    std::string line(bible_output.substr(pos, end - pos));
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    std::smatch m;
    if (!std::regex_match(line, m, verse))
      fail("KJV text, line {}: expected '<book><chapter>:<verse> <text>', got '{}'", line_no,
           line.substr(0, 60));
    const std::string book = m[1], chapter = m[2];
    if (books.empty() || books.back().name != book) {
      books.push_back({book, {}});
      last_chapter = chapter;
    } else if (chapter != last_chapter) {
      books.back().text += '\n';  // blank line between chapters
      last_chapter = chapter;
    }
    books.back().text += m[4].str();
    books.back().text += '\n';
  }
  if (books.empty()) fail("KJV text: no verses found (is bible-kjv installed?)");
  return books;
}

std::string strip_brown_tags(std::string_view tagged) {
  static const std::set<std::string> attach_left = {",", ".", ";", ":", "?", "!", ")", "]",
                                                    "''", "'"};
  static const std::set<std::string> attach_right = {"``", "(", "["};
  std::string out;
  bool paragraph_open = false;
  bool glue_next = false;
  size_t pos = 0;
  bool blank_run = false;
  while (pos < tagged.size()) {
    size_t end = tagged.find('\n', pos);
    if (end == std::string_view::npos) end = tagged.size();
    const std::string_view line = tagged.substr(pos, end - pos);
    pos = end + 1;
    const bool blank = line.find_first_not_of(" \t\r") == std::string_view::npos;
    if (blank) {
      blank_run = true;
      continue;
    }
    if (blank_run && paragraph_open) {
      out += '\n';  // paragraph break
      paragraph_open = false;
    }
    blank_run = false;
    size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
      if (i >= line.size()) break;
      size_t j = i;
      while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r') ++j;
      const std::string_view token = line.substr(i, j - i);
      i = j;
      const size_t slash = token.rfind('/');
      std::string word(slash == std::string_view::npos || slash == 0 ? token
                                                                     : token.substr(0, slash));
      const bool left = attach_left.contains(word);
      const bool right = attach_right.contains(word);
      if (word == "``" || word == "''") word.assign(1, '"');
      if (paragraph_open && !left && !glue_next) out += ' ';
      out += word;
      paragraph_open = true;
      glue_next = right;
    }
  }
  if (paragraph_open) out += '\n';
  return out;
}

namespace {

// Length in bytes of the well-formed UTF-8 sequence at s[0..n), or 0 when it is malformed
// (bad lead or continuation byte, truncated, overlong, surrogate, beyond U+10FFFF).
int utf8_length(const unsigned char* s, size_t n) {
  const unsigned char c = s[0];
  if (c < 0x80) return 1;
  int len;
  uint32_t cp;
  if ((c & 0xE0) == 0xC0) {
    len = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (static_cast<size_t>(len) > n) return 0;
  for (int k = 1; k < len; ++k) {
    if ((s[k] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[k] & 0x3F);
  }
  static constexpr uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

}  // namespace

void check_text(std::string_view text, const std::string& what, const std::string& hint) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0; i < text.size();) {
    if (s[i] == 0) fail("{}: NUL byte at byte {} (not a text file?)", what, i);
    const int len = utf8_length(s + i, text.size() - i);
    if (len == 0) fail("{}: invalid UTF-8 at byte {} ({})", what, i, hint);
    i += len;
  }
}

std::vector<Document> split_into_sections(const Document& doc, int parts) {
  std::vector<Document> out;
  const size_t n = doc.text.size();
  size_t start = 0;
  for (int k = 1; k <= parts && start < n; ++k) {
    size_t end = k == parts ? n : n * k / parts;
    if (end < start) end = start;
    const size_t nl = doc.text.find('\n', end > 0 ? end - 1 : 0);
    end = nl == std::string::npos ? n : nl + 1;
    if (end <= start) continue;
    out.push_back({fmt::format("{}#{}", doc.name, out.size()), doc.text.substr(start, end - start)});
    start = end;
  }
  return out;
}

std::vector<size_t> validation_documents(size_t n, double fraction) {
  if (!(fraction > 0 && fraction <= 0.5))
    fail("--val-fraction: must be in (0, 0.5], got {}", fraction);
  if (n < 2)
    fail("need at least 2 documents to hold one out for validation, got {} (pass more files)",
         n);
  const size_t n_val =
      std::clamp<size_t>(static_cast<size_t>(std::lround(n * fraction)), 1, n - 1);
  std::vector<size_t> idx;
  for (size_t k = 0; k < n_val; ++k)
    idx.push_back(static_cast<size_t>((static_cast<double>(k) + 0.5) * n / n_val));
  return idx;
}

std::vector<uint16_t> byte_tokens(const std::vector<const Document*>& docs) {
  std::vector<uint16_t> tokens;
  size_t total = 0;
  for (const auto* d : docs) total += d->text.size() + 1;
  tokens.reserve(total);
  for (const auto* d : docs) {
    tokens.push_back(kByteEndOfText);
    for (unsigned char c : d->text) tokens.push_back(c);
  }
  return tokens;
}

namespace {

std::vector<fs::path> write_split(const std::vector<uint16_t>& tokens, const fs::path& out,
                                  const std::string& split, int64_t shard_tokens) {
  std::vector<fs::path> files;
  for (size_t start = 0, k = 0; start < tokens.size(); start += shard_tokens, ++k) {
    const size_t n = std::min<size_t>(shard_tokens, tokens.size() - start);
    const fs::path path = out / fmt::format("{}_{:06d}.bin", split, k);
    write_shard(path, std::span<const uint16_t>(tokens.data() + start, n));
    files.push_back(path);
  }
  return files;
}

}  // namespace

PreparedCorpus write_corpus(const std::vector<Document>& docs, const fs::path& out,
                            double val_fraction, int64_t shard_tokens,
                            const std::string& source) {
  if (shard_tokens < 2) fail("--shard-tokens: must be ≥ 2, got {}", shard_tokens);
  for (const auto& d : docs) check_text(d.text, d.name);
  const auto val_idx = validation_documents(docs.size(), val_fraction);
  std::vector<const Document*> train, val;
  for (size_t i = 0; i < docs.size(); ++i)
    (std::binary_search(val_idx.begin(), val_idx.end(), i) ? val : train).push_back(&docs[i]);

  // All-or-nothing: write into a staging directory beside `out`, then swap it in, so that a
  // failure leaves the previous preparation (or nothing) and never a mix.
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec))
    fail("--out: '{}' exists and is not a directory", out.string());
  const fs::path staging = out.string() + ".partial";
  fs::remove_all(staging, ec);
  fs::create_directories(staging, ec);
  if (ec) fail("--out: cannot create '{}': {}", staging.string(), ec.message());
  PreparedCorpus result;
  const auto train_tokens = byte_tokens(train);
  const auto val_tokens = byte_tokens(val);
  result.train_tokens = static_cast<int64_t>(train_tokens.size());
  result.val_tokens = static_cast<int64_t>(val_tokens.size());
  for (const auto* d : val) result.val_documents.push_back(d->name);
  std::vector<fs::path> train_files, val_files;
  try {
    train_files = write_split(train_tokens, staging, "train", shard_tokens);
    val_files = write_split(val_tokens, staging, "val", shard_tokens);
    nlohmann::json manifest = {
        {"source", source},
        {"tokenizer", "bytes"},
        {"vocab_size", 256},
        {"end_of_text_token", kByteEndOfText},
        {"documents", docs.size()},
        {"train_tokens", result.train_tokens},
        {"val_tokens", result.val_tokens},
        {"val_fraction", val_fraction},
        {"val_documents", result.val_documents},
    };
    for (const auto& f : train_files) manifest["train_shards"].push_back(f.filename());
    for (const auto& f : val_files) manifest["val_shards"].push_back(f.filename());
    write_text_atomically(staging / "manifest.json", manifest.dump(2) + "\n");
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
  // Keep whatever else the user put in `out` (raw downloads, notes): replace only our files.
  fs::create_directories(out, ec);
  for (const auto& entry : fs::directory_iterator(out)) {
    const std::string name = entry.path().filename().string();
    if (((name.starts_with("train_") || name.starts_with("val_")) && name.ends_with(".bin")) ||
        name == "manifest.json")
      fs::remove(entry.path());
  }
  // manifest.json last: it names the shards, so readers never see it before them.
  for (const auto& entry : fs::directory_iterator(staging))
    if (entry.path().filename() != "manifest.json")
      fs::rename(entry.path(), out / entry.path().filename());
  fs::rename(staging / "manifest.json", out / "manifest.json");
  fs::remove_all(staging, ec);
  sync_directory(out);
  for (const auto& f : train_files) result.train_shards.push_back(out / f.filename());
  for (const auto& f : val_files) result.val_shards.push_back(out / f.filename());
  return result;
}

std::string decode_bytes(const std::vector<int32_t>& tokens) {
  std::string raw;
  for (int32_t t : tokens) {
    if (t == kByteEndOfText)
      raw += "\n\n";
    else if (t > 0 && t < 256)
      raw += static_cast<char>(t);
  }
  // A sampled byte stream need not be valid UTF-8: replace what is not.
  std::string out;
  const auto* s = reinterpret_cast<const unsigned char*>(raw.data());
  for (size_t i = 0; i < raw.size();) {
    const int len = utf8_length(s + i, raw.size() - i);
    if (len > 0) {
      out.append(raw, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
    }
  }
  return out;
}

}  // namespace ddiloco
