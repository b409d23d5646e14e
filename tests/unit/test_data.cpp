// Token shards (round trip, every kind of corruption) and the training / validation loaders.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <numeric>
#include <set>

#include "ddiloco/data_loader.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/shard.hpp"
#include "temp_dir.hpp"

namespace ddiloco {
namespace {

using test::TempDir;

std::vector<uint16_t> iota_tokens(size_t n, int vocab) {
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(i % vocab);
  return t;
}

// Expects `fn` to throw Error whose message contains every fragment.
template <typename Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> fragments) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    for (const auto& f : fragments)
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
          << "message '" << e.what() << "' lacks '" << f << "'";
  }
}

std::string raw_shard(int32_t magic, int32_t version, int32_t count,
                      const std::vector<uint16_t>& tokens) {
  std::string bytes(kShardHeaderBytes, '\0');
  int32_t header[3] = {magic, version, count};
  std::memcpy(bytes.data(), header, sizeof header);
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  return bytes;
}

TEST(Shard, RoundTrip) {
  TempDir dir;
  const auto tokens = iota_tokens(1000, 256);
  write_shard(dir / "a.bin", tokens);
  EXPECT_EQ(std::filesystem::file_size(dir / "a.bin"), kShardHeaderBytes + 2000);
  EXPECT_FALSE(std::filesystem::exists(dir / "a.bin.tmp"));
  const Shard s = Shard::open(dir / "a.bin", 256);
  ASSERT_EQ(s.tokens().size(), 1000u);
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), s.tokens().begin()));
}

TEST(Shard, ReadsGpt2VocabularyTokens) {
  TempDir dir;
  std::vector<uint16_t> tokens = {50256, 15496, 11, 995, 0};  // llm.c GPT-2 style shard
  write_shard(dir / "gpt2.bin", tokens);
  EXPECT_EQ(Shard::open(dir / "gpt2.bin", 50257).tokens()[0], 50256);
  expect_error([&] { Shard::open(dir / "gpt2.bin", 256); },
               {"gpt2.bin", "token 50256 at index 0", "vocab_size = 256"});
}

TEST(Shard, RejectsEveryKindOfCorruption) {
  TempDir dir;
  const auto tokens = iota_tokens(10, 256);
  test::write_bytes(dir / "magic.bin", raw_shard(12345, 1, 10, tokens));
  expect_error([&] { Shard::open(dir / "magic.bin", 256); },
               {"magic.bin", "bad magic 12345", "20240520"});
  test::write_bytes(dir / "version.bin", raw_shard(kShardMagic, 2, 10, tokens));
  expect_error([&] { Shard::open(dir / "version.bin", 256); },
               {"version.bin", "version 2", "expected 1"});
  test::write_bytes(dir / "short.bin", raw_shard(kShardMagic, 1, 11, tokens));
  expect_error([&] { Shard::open(dir / "short.bin", 256); },
               {"short.bin", "header says 11 tokens", "truncated"});
  test::write_bytes(dir / "long.bin", raw_shard(kShardMagic, 1, 9, tokens));
  expect_error([&] { Shard::open(dir / "long.bin", 256); }, {"long.bin", "header says 9"});
  test::write_bytes(dir / "tiny.bin", "abc");
  expect_error([&] { Shard::open(dir / "tiny.bin", 256); },
               {"tiny.bin", "3 bytes", "shorter than the 1024-byte"});
  auto bad = tokens;
  bad[7] = 300;
  test::write_bytes(dir / "vocab.bin", raw_shard(kShardMagic, 1, 10, bad));
  expect_error([&] { Shard::open(dir / "vocab.bin", 256); },
               {"vocab.bin", "token 300 at index 7"});
  expect_error([&] { Shard::open(dir / "missing.bin", 256); }, {"missing.bin", "cannot open"});
  expect_error([&] { expand_shard_pattern((dir / "nothing_*.bin").string(), "data.train"); },
               {"data.train", "no token shards match"});
}

TEST(TrainStream, StreamsAreDisjointAndCoverTheEpoch) {
  TempDir dir;
  // Two shards; sequences of T+1 = 5 tokens at stride 4 → a shard of 41 tokens holds 10, one of
  // 33 holds 8: 18 sequences, 6 per stream of 3, 3 batches of B = 2 each per epoch.
  write_shard(dir / "train_0.bin", iota_tokens(41, 256));
  std::vector<uint16_t> second(33);
  std::iota(second.begin(), second.end(), 100);
  write_shard(dir / "train_1.bin", second);
  const auto files = expand_shard_pattern((dir / "train_*.bin").string(), "data.train");
  const int streams = 3;
  std::multiset<int32_t> firsts;
  for (int s = 0; s < streams; ++s) {
    TrainStream stream(files, 256, 2, 4, s, streams, 7, true);
    EXPECT_EQ(stream.sequences_per_epoch(), 18);
    EXPECT_EQ(stream.batches_per_epoch(), 3);
    std::vector<int32_t> in(8), tgt(8);
    for (int b = 0; b < 3; ++b) {
      stream.next(in.data(), tgt.data());
      for (int row = 0; row < 2; ++row) {
        for (int i = 0; i < 3; ++i) EXPECT_EQ(tgt[row * 4 + i], in[row * 4 + i + 1]);  // shifted
        EXPECT_EQ(tgt[row * 4 + 3], in[row * 4 + 3] + 1) << "a row's last target is the next token";
        firsts.insert(in[row * 4]);
      }
    }
    EXPECT_EQ(stream.cursor().epoch, 0);
    stream.next(in.data(), tgt.data());
    EXPECT_EQ(stream.cursor(), (DataCursor{1, 1}));  // wrapped into epoch 1
  }
  // Every sequence of the epoch was read exactly once over all streams.
  EXPECT_EQ(firsts, (std::multiset<int32_t>{0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 100, 104, 108, 112,
                                            116, 120, 124, 128}));
}

// Issue 34: a shard swapped for a shorter valid one after the stream counted it was read with
// the old count, past the end of its mapping. The count is checked again at every open.
TEST(TrainStream, ShardReplacedByAShorterOneDuringTheRunIsRefusedNamingIt) {
  TempDir dir;
  write_shard(dir / "train_0.bin", iota_tokens(41, 256));  // 10 sequences of T+1 = 5
  const auto files = expand_shard_pattern((dir / "train_*.bin").string(), "data.train");
  TrainStream stream(files, 256, 2, 4, 0, 1, 7, true);
  write_shard(dir / "train_0.bin", iota_tokens(9, 256));  // 2 sequences: valid, and shorter
  std::vector<int32_t> in(8), tgt(8);
  expect_error([&] { stream.next(in.data(), tgt.data()); },
               {(dir / "train_0.bin").string(), "holds 2 sequences", "10 when the run started", "replaced"});
}

// A batch is B independent draws of the epoch's shuffled order, not one span of B·T+1 tokens:
// its rows come from all over the shard, and over an epoch every sequence is drawn once.
TEST(TrainStream, ABatchIsBIndependentSequences) {
  TempDir dir;
  const int T = 4, B = 8, n = 64;  // 64 sequences: 8 batches of 8
  std::vector<uint16_t> tokens(n * T + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i);  // a token is its position
  write_shard(dir / "t.bin", tokens);
  TrainStream stream({dir / "t.bin"}, 1024, B, T, 0, 1, 3, true);
  std::vector<int32_t> in(B * T), tgt(B * T);
  std::set<int32_t> seen;
  int contiguous = 0;
  for (int b = 0; b < n / B; ++b) {
    stream.next(in.data(), tgt.data());
    bool spans = true;
    for (int row = 0; row < B; ++row) {
      EXPECT_EQ(in[row * T] % T, 0) << "a row starts on a sequence boundary";
      EXPECT_TRUE(seen.insert(in[row * T]).second) << "sequence at " << in[row * T] << " drawn twice";
      if (row > 0) spans &= in[row * T] == in[(row - 1) * T] + T;
    }
    contiguous += spans;
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(n));
  EXPECT_EQ(contiguous, 0) << "batches were contiguous spans of the shard";
  // Without shuffling the order is the file's, so the same code reads spans (and says so).
  TrainStream ordered({dir / "t.bin"}, 1024, B, T, 0, 1, 3, false);
  ordered.next(in.data(), tgt.data());
  for (int row = 0; row < B; ++row) EXPECT_EQ(in[row * T], row * T);
}

TEST(TrainStream, SameSeedSameOrderAndSeekResumes) {
  TempDir dir;
  write_shard(dir / "t.bin", iota_tokens(8 * 50 + 1, 251));
  const std::vector<std::filesystem::path> files = {dir / "t.bin"};
  TrainStream a(files, 256, 2, 4, 0, 1, 11, true), b(files, 256, 2, 4, 0, 1, 11, true),
      c(files, 256, 2, 4, 0, 1, 12, true);
  std::vector<int32_t> ia(8), ta(8), ib(8), tb(8), ic(8), tc(8);
  bool differs = false;
  for (int i = 0; i < 60; ++i) {
    a.next(ia.data(), ta.data());
    b.next(ib.data(), tb.data());
    c.next(ic.data(), tc.data());
    EXPECT_EQ(ia, ib);
    differs |= ia != ic;
  }
  EXPECT_TRUE(differs) << "another seed gave the same order";
  // A stream positioned with seek() continues exactly where the original is.
  TrainStream resumed(files, 256, 2, 4, 0, 1, 11, true);
  resumed.seek(a.cursor());
  for (int i = 0; i < 70; ++i) {
    a.next(ia.data(), ta.data());
    resumed.next(ib.data(), tb.data());
    ASSERT_EQ(ia, ib) << "batch " << i;
  }
}

TEST(TrainStream, TooLittleDataForTheStreamsIsAnError) {
  TempDir dir;
  write_shard(dir / "t.bin", iota_tokens(20, 256));
  // 20 tokens: 4 sequences of 5, one per stream of 4, less than a batch of 2.
  expect_error([&] { TrainStream({dir / "t.bin"}, 256, 2, 4, 0, 4, 1, true); },
               {"data.train", "4 sequences", "a batch of 2", "4 data streams"});
}

TEST(ValidationSet, FixedSequencesAcrossShards) {
  TempDir dir;
  write_shard(dir / "val_0.bin", iota_tokens(10, 256));
  write_shard(dir / "val_1.bin", iota_tokens(30, 256));
  const auto files = expand_shard_pattern((dir / "val_*.bin").string(), "data.val");
  const ValidationSet all(files, 256, 4, 1000);
  // Shard 0: starts 0, 4 (needs 5 tokens each) → 2; shard 1: 0..24 step 4 → 7.
  EXPECT_EQ(all.sequences(), 9);
  EXPECT_EQ(all.sequence(1)[0], 4);
  EXPECT_EQ(all.sequence(2)[0], 0);
  const ValidationSet capped(files, 256, 4, 12);
  EXPECT_EQ(capped.sequences(), 3);
  expect_error([&] { ValidationSet(files, 256, 40, 100); }, {"data.val", "41 tokens"});
}

}  // namespace
}  // namespace ddiloco
