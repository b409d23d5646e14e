// What a unit leader tells the rest of its unit after every inner step. Only the leader talks
// to the syncer, so it alone decides (learner_leader.cpp); every rank of the unit then does
// the same thing with the same data (its parameters are replicas), which is why the whole
// decision travels as one broadcast of int64 words.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ddiloco::learner {

struct Actions {
  /// `fragments` (P) sizes the per-fragment flags.
  explicit Actions(int fragments) : lost(fragments, 0), sent(fragments, 0) {}

  bool stop = false;
  bool crash = false;          ///< the unit starts over from Θ now (a crash) ...
  /// ... keeping its memory: a restarted syncer's Θ replaces θ, the AdamW moments stay
  bool keep_memory = false;
  int64_t down_ms = 0;         ///< ... and stays down this long
  std::vector<int64_t> lost;   ///< per fragment: 1 = its unread snapshot dies with the crash
  std::vector<int64_t> sent;   ///< per fragment: 1 = a snapshot was published this step
  std::vector<std::pair<int, int64_t>> apply;  ///< (fragment, version) to apply now
  int64_t schedule_step = -1;                  ///< the lr schedule's step for the next step
  int64_t checkpoint = 0;                      ///< write this checkpoint's unit file now

  /// The words of the leader's broadcast: 6 + 4·P of them, whatever the number of merges,
  /// so that every rank knows the count to receive before it knows the actions.
  std::vector<int64_t> encode(int fragments) const;
  static Actions decode(const std::vector<int64_t>& words, int fragments);
};

}  // namespace ddiloco::learner
