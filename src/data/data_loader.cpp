#include "ddiloco/data_loader.hpp"

#include <algorithm>
#include <numeric>

#include "ddiloco/error.hpp"
#include "ddiloco/rng.hpp"

namespace ddiloco {

namespace fs = std::filesystem;

namespace {
template <typename T>
void shuffle(std::vector<T>& v, Rng& rng) {  // Fisher-Yates with our own generator
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
}

// Sequences of T+1 tokens, at stride T, in a shard of n tokens.
int64_t sequences_in(const Shard& shard, int T) {
  const auto n = static_cast<int64_t>(shard.tokens().size());
  return n > T ? (n - 1) / T : 0;
}
}  // namespace

TrainStream::TrainStream(std::vector<fs::path> shards, int vocab_size, int B, int T,
                         int stream_index, int stream_count, uint64_t seed, bool shuffle)
    : files_(std::move(shards)),
      vocab_size_(vocab_size),
      B_(B),
      T_(T),
      stream_index_(stream_index),
      stream_count_(stream_count),
      seed_(seed),
      shuffle_(shuffle) {
  if (B < 1 || T < 1) fail("data: batch size and sequence length must be ≥ 1");
  if (stream_count < 1 || stream_index < 0 || stream_index >= stream_count)
    fail("data: stream {} of {} does not exist", stream_index, stream_count);
  for (const auto& f : files_) {
    // Full validation (every token < vocab) now, so that bad data stops the job before it
    // writes anything, not hours in when the shard is first read.
    chunks_.push_back(sequences_in(Shard::open(f, vocab_size), T));
    total_chunks_ += chunks_.back();
  }
  // Positions stream_index, stream_index + stream_count, ... of the epoch's order.
  const int64_t mine = total_chunks_ > stream_index ? (total_chunks_ - stream_index + stream_count - 1) / stream_count : 0;
  batches_ = mine / B;
  if (total_chunks_ / stream_count < B)
    fail("data.train: the {} shard(s) hold {} sequences of T+1 = {} tokens, fewer than a batch of "
         "{} for each of the {} data streams (ranks); use more data or a smaller "
         "train.batch_size / model.seq_len",
         files_.size(), total_chunks_, T + 1, B, stream_count);
}

std::pair<int, int64_t> TrainStream::locate(int64_t epoch, int64_t g) {
  if (order_epoch_ != epoch) {
    shard_order_.resize(files_.size());
    std::iota(shard_order_.begin(), shard_order_.end(), 0);
    if (shuffle_) {
      Rng rng(mix_seed(seed_, static_cast<uint64_t>(epoch) << 20));
      shuffle(shard_order_, rng);
    }
    shard_start_.clear();
    int64_t start = 0;
    for (int s : shard_order_) {
      shard_start_.push_back(start);
      start += chunks_[s];
    }
    order_epoch_ = epoch;
  }
  // The last shard (in visiting order) whose first chunk is ≤ g.
  const auto it = std::upper_bound(shard_start_.begin(), shard_start_.end(), g);
  size_t pos = static_cast<size_t>(it - shard_start_.begin()) - 1;
  while (chunks_[shard_order_[pos]] == 0) --pos;  // empty shards share a start with the next
  const int shard = shard_order_[pos];
  const int64_t local = g - shard_start_[pos];
  if (perm_epoch_ != epoch || perm_shard_ != shard) {
    chunk_perm_.resize(chunks_[shard]);
    std::iota(chunk_perm_.begin(), chunk_perm_.end(), int64_t{0});
    if (shuffle_) {
      Rng rng(mix_seed(seed_, (static_cast<uint64_t>(epoch) << 20) + 1 + shard));
      shuffle(chunk_perm_, rng);
    }
    perm_epoch_ = epoch;
    perm_shard_ = shard;
  }
  return {shard, chunk_perm_[local]};
}

void TrainStream::next(int32_t* inputs, int32_t* targets) {
  if (cursor_.batch >= batches_) {
    ++cursor_.epoch;
    cursor_.batch = 0;
  }
  for (int b = 0; b < B_; ++b) {
    const int64_t g = stream_index_ + stream_count_ * (cursor_.batch * B_ + b);
    const auto [shard, sequence] = locate(cursor_.epoch, g);
    if (!open_ || open_->path() != files_[shard]) {
      open_.reset();  // unmap the previous shard first: GPT-2 shards are 200 MB each
      open_.emplace(Shard::open(files_[shard], vocab_size_));
      // The shard may have been replaced since it was counted (a shorter valid one): its
      // chunks are where the counts of the first open put them, or the run stops here.
      if (const int64_t chunks = sequences_in(*open_, T_); chunks != chunks_[shard])
        fail("{}: holds {} sequences of T+1 = {} tokens now, {} when the run started: the shard was "
             "replaced during the run (put it back, or start a new run)",
             files_[shard].string(), chunks, T_ + 1, chunks_[shard]);
    }
    const uint16_t* src = open_->tokens().data() + sequence * T_;
    for (int i = 0; i < T_; ++i) {
      inputs[b * T_ + i] = src[i];
      targets[b * T_ + i] = src[i + 1];
    }
  }
  ++cursor_.batch;
}

void check_disjoint_splits(const std::vector<fs::path>& train, const std::vector<fs::path>& val) {
  std::error_code ec;
  for (const auto& v : val)
    for (const auto& t : train)
      if (fs::equivalent(v, t, ec))
        fail("data.val: '{}' is also a training shard (data.train): the validation loss would "
             "measure memorisation",
             v.string());
}

ValidationSet::ValidationSet(const std::vector<fs::path>& shards, int vocab_size, int T,
                             int64_t max_tokens)
    : T_(T) {
  const int64_t want = std::max<int64_t>(1, max_tokens / T);
  int64_t have = 0;
  for (const auto& f : shards) {
    if (have >= want) break;
    const Shard shard = Shard::open(f, vocab_size);
    const auto tok = shard.tokens();
    for (int64_t start = 0; start + T + 1 <= static_cast<int64_t>(tok.size()) && have < want;
         start += T, ++have)
      tokens_.insert(tokens_.end(), tok.begin() + start, tok.begin() + start + T + 1);
  }
  if (have == 0)
    fail("data.val: the validation shards hold no sequence of model.seq_len + 1 = {} tokens",
         T + 1);
}

}  // namespace ddiloco
