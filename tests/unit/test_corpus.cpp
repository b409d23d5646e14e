// Corpus parsing, the by-document validation split, and byte tokens.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <fstream>
#include <set>

#include "ddiloco/corpus.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/shard.hpp"
#include "temp_dir.hpp"

namespace ddiloco {
namespace {

TEST(Corpus, ParsesKjvBooksAndChapters) {
  const std::string text =
      "Ge1:1 In the beginning.\nGe1:2 And the earth.\nGe2:1 Thus the heavens.\n"
      "1Sm1:1 Now there was a man.\n";
  const auto books = parse_kjv(text);
  ASSERT_EQ(books.size(), 2u);
  EXPECT_EQ(books[0].name, "Ge");
  EXPECT_EQ(books[0].text, "In the beginning.\nAnd the earth.\n\nThus the heavens.\n");
  EXPECT_EQ(books[1].name, "1Sm");
  EXPECT_THROW(parse_kjv("Ge1:1 ok\nnot a verse\n"), Error);
  EXPECT_THROW(parse_kjv(""), Error);
}

TEST(Corpus, StripsBrownTags) {
  const std::string tagged =
      "\n\n\tThe/at Fulton/np-tl County/nn-tl said/vbd ``/`` no/at evidence/nn ''/'' ,/, "
      "it/pps said/vbd ./.\n\tIt/pps ended/vbd (/( 1/2/cd )/) ./.\n\n\n\tNew/jj paragraph/nn "
      "?/.\n";
  EXPECT_EQ(strip_brown_tags(tagged),
            "The Fulton County said \"no evidence\", it said. It ended (1/2).\n"
            "New paragraph?\n");
}

TEST(Corpus, ChecksUtf8) {
  EXPECT_NO_THROW(check_text("plain ascii, caf\xC3\xA9, \xE2\x82\xAC, \xF0\x9F\x98\x80", "t"));
  EXPECT_THROW(check_text(std::string("nul\0byte", 8), "t"), Error);
  EXPECT_THROW(check_text("bad \xC3 continuation", "t"), Error);
  EXPECT_THROW(check_text("overlong \xC0\xAF", "t"), Error);
  EXPECT_THROW(check_text("surrogate \xED\xA0\x80", "t"), Error);
  EXPECT_THROW(check_text("truncated \xE2\x82", "t"), Error);
  try {
    check_text("abc\xFF", "notes.txt");
    ADD_FAILURE() << "invalid UTF-8 accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "notes.txt: invalid UTF-8 at byte 3 (convert the file to UTF-8)");
  }
}

TEST(Corpus, ValidationDocumentsAreSpreadAndNeverAll) {
  EXPECT_EQ(validation_documents(66, 0.05), (std::vector<size_t>{11, 33, 55}));
  EXPECT_EQ(validation_documents(2, 0.05), (std::vector<size_t>{1}));
  EXPECT_EQ(validation_documents(4, 0.5).size(), 2u);
  EXPECT_THROW(validation_documents(1, 0.05), Error);
  EXPECT_THROW(validation_documents(10, 0.0), Error);
  EXPECT_THROW(validation_documents(10, 0.9), Error);
}

TEST(Corpus, SplitsOneFileIntoSectionsAtLineEnds) {
  Document d{"book.txt", ""};
  for (int i = 0; i < 100; ++i) d.text += "line " + std::to_string(i) + "\n";
  const auto parts = split_into_sections(d, 20);
  EXPECT_EQ(parts.size(), 20u);
  std::string joined;
  for (const auto& p : parts) {
    EXPECT_EQ(p.text.back(), '\n');
    joined += p.text;
  }
  EXPECT_EQ(joined, d.text);
  EXPECT_EQ(parts[3].name, "book.txt#3");
}

TEST(Corpus, WritesDisjointSplitsWithEndOfTextMarkers) {
  test::TempDir dir;
  std::vector<Document> docs;
  for (int i = 0; i < 10; ++i) docs.push_back({"doc" + std::to_string(i), "text of " + std::to_string(i) + "\n"});
  const auto c = write_corpus(docs, dir.path(), 0.2, 30, "test");
  EXPECT_EQ(c.val_documents, (std::vector<std::string>{"doc2", "doc7"}));
  EXPECT_GT(c.train_shards.size(), 1u);  // 30-token shards force several files
  std::string train, val;
  auto collect = [](const std::vector<std::filesystem::path>& files, std::string& out) {
    for (const auto& f : files) {
      const Shard shard = Shard::open(f, 256);
      for (uint16_t t : shard.tokens()) out += t == 0 ? '|' : static_cast<char>(t);
    }
  };
  collect(c.train_shards, train);
  collect(c.val_shards, val);
  EXPECT_EQ(val, "|text of 2\n|text of 7\n");
  EXPECT_EQ(train.find("text of 2"), std::string::npos);
  EXPECT_NE(train.find("|text of 3\n|text of 4"), std::string::npos);
  EXPECT_EQ(c.train_tokens + c.val_tokens, 10 * 11);
  std::ifstream manifest(dir / "manifest.json");
  const auto j = nlohmann::json::parse(manifest);
  EXPECT_EQ(j["val_documents"][1], "doc7");
  // A second preparation with fewer shards leaves no stale files behind.
  const auto again = write_corpus(docs, dir.path(), 0.2, 1000, "test");
  EXPECT_EQ(again.train_shards.size(), 1u);
  EXPECT_FALSE(std::filesystem::exists(dir / "train_000001.bin"));
}

TEST(Corpus, DecodeBytesAlwaysValidUtf8) {
  EXPECT_EQ(decode_bytes({'h', 'i', 0, 'x'}), "hi\n\nx");
  const std::string broken = decode_bytes({'a', 0xC3, 'b', 0xE2, 0x82, 0xAC});
  EXPECT_EQ(broken, "a\xEF\xBF\xBD" "b\xE2\x82\xAC");
  EXPECT_NO_THROW(check_text(broken, "decoded"));
}

}  // namespace
}  // namespace ddiloco
