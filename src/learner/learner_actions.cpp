// The int64 encoding of Actions: [stop, crash (2: keeping memory), down_ms, merges, lost[P], sent[P],
// (fragment, version)[merges] padded to P pairs, checkpoint, schedule_step].
#include "learner/learner_actions.hpp"

namespace ddiloco::learner {

std::vector<int64_t> Actions::encode(int fragments) const {
  std::vector<int64_t> w(6 + 4 * static_cast<size_t>(fragments), 0);
  w[0] = stop;
  w[1] = crash ? (keep_memory ? 2 : 1) : 0;
  w[2] = down_ms;
  w[3] = static_cast<int64_t>(apply.size());
  for (size_t p = 0; p < lost.size(); ++p) w[4 + p] = lost[p];
  for (size_t p = 0; p < sent.size(); ++p) w[4 + fragments + p] = sent[p];
  w.back() = schedule_step;
  w[w.size() - 2] = checkpoint;
  for (size_t i = 0; i < apply.size(); ++i) {
    w[4 + 2 * fragments + 2 * i] = apply[i].first;
    w[5 + 2 * fragments + 2 * i] = apply[i].second;
  }
  return w;
}

Actions Actions::decode(const std::vector<int64_t>& w, int fragments) {
  Actions a(fragments);
  a.stop = w[0] != 0;
  a.schedule_step = w.back();
  a.checkpoint = w[w.size() - 2];
  a.crash = w[1] != 0;
  a.keep_memory = w[1] == 2;
  a.down_ms = w[2];
  a.lost.assign(w.begin() + 4, w.begin() + 4 + fragments);
  a.sent.assign(w.begin() + 4 + fragments, w.begin() + 4 + 2 * fragments);
  for (int64_t i = 0; i < w[3]; ++i)
    a.apply.emplace_back(static_cast<int>(w[4 + 2 * fragments + 2 * i]), w[5 + 2 * fragments + 2 * i]);
  return a;
}

}  // namespace ddiloco::learner
