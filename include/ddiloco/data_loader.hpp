// Batches for training and the fixed validation set.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "ddiloco/shard.hpp"

namespace ddiloco {

/// Where a training stream stands: epoch and how many batches it has taken in that epoch.
/// Saved in checkpoints so that a resumed run reads exactly the batches it would have read.
struct DataCursor {
  int64_t epoch = 0;
  int64_t batch = 0;
  bool operator==(const DataCursor&) const = default;
};

/// One of `stream_count` disjoint streams of training batches over a set of shards.
///
/// Each shard is cut into sequences of T+1 tokens at stride T (inputs are a sequence's first T
/// tokens, targets its last T; llm.c's shard format). An epoch visits every sequence of every
/// shard once, in an order fixed by (seed, epoch): shards permuted, then the sequences within
/// each shard permuted (or in file order when shuffle is off). Sequence g of that order
/// belongs to stream g mod stream_count, so streams never share a sequence; a batch is the
/// stream's next B sequences, B independent draws of the shuffled order rather than one
/// contiguous span of B·T+1 tokens (whose B rows, 4 KB of one passage, were so correlated that
/// one rank's batch of 32 trained 11 % worse than four ranks' batches of 8 on the same tokens:
/// docs/model.md, "Batches"). A stream's batches per epoch are its sequences ÷ B; the few left over at
/// an epoch's end are not used. Each stream's batches depend only on (files, B, T, seed,
/// stream_index, stream_count).
class TrainStream {
 public:
  /// Validates every shard now (header, size, every token < vocab_size). Throws Error naming
  /// the file, or when the shards hold fewer than B sequences per stream.
  TrainStream(std::vector<std::filesystem::path> shards, int vocab_size, int B, int T,
              int stream_index, int stream_count, uint64_t seed, bool shuffle);

  /// Fills inputs(B,T) and targets(B,T) with the next batch; wraps into the next epoch.
  void next(int32_t* inputs, int32_t* targets);

  DataCursor cursor() const { return cursor_; }
  void seek(const DataCursor& cursor) { cursor_ = cursor; }
  /// Sequences of T+1 tokens in one epoch, over all streams.
  int64_t sequences_per_epoch() const { return total_chunks_; }
  /// Batches this stream takes per epoch.
  int64_t batches_per_epoch() const { return batches_; }
  int64_t tokens_per_batch() const { return static_cast<int64_t>(B_) * T_; }

 private:
  // Position `g` of epoch `epoch`'s visiting order → (shard, chunk within shard).
  std::pair<int, int64_t> locate(int64_t epoch, int64_t g);

  std::vector<std::filesystem::path> files_;
  std::vector<int64_t> chunks_;  // sequences per shard, in file order
  int vocab_size_, B_, T_, stream_index_, stream_count_;
  uint64_t seed_;
  bool shuffle_;
  int64_t total_chunks_ = 0;  // sequences, over all shards
  int64_t batches_ = 0;       // this stream's per epoch
  DataCursor cursor_;

  // Caches: the shard visiting order of one epoch, and the chunk order + mapping of one shard.
  int64_t order_epoch_ = -1;
  std::vector<int> shard_order_;
  std::vector<int64_t> shard_start_;  // first g of each shard in shard_order_
  int64_t perm_epoch_ = -1;
  int perm_shard_ = -1;
  std::vector<int64_t> chunk_perm_;
  std::optional<Shard> open_;
};

/// The fixed held-out set: the first max_tokens/T sequences of T+1 tokens (stride T) of the
/// validation shards in file order. Identical on every rank and every run, so losses measured
/// at different times, on different ranks or by different modes are comparable.
/// Throws Error when a file matches both the training and the validation glob.
void check_disjoint_splits(const std::vector<std::filesystem::path>& train,
                           const std::vector<std::filesystem::path>& val);

class ValidationSet {
 public:
  /// Throws Error when the shards hold not even one sequence of T+1 tokens.
  ValidationSet(const std::vector<std::filesystem::path>& shards, int vocab_size, int T,
                int64_t max_tokens);

  int64_t sequences() const { return static_cast<int64_t>(tokens_.size()) / (T_ + 1); }
  int seq_len() const { return T_; }
  /// Sequence i: T+1 tokens (inputs are the first T, targets the last T).
  const int32_t* sequence(int64_t i) const { return tokens_.data() + i * (T_ + 1); }

 private:
  int T_;
  std::vector<int32_t> tokens_;
};

}  // namespace ddiloco
