// Evaluation of the syncer's Θ on the fixed validation set, on a background thread so that
// merging never pauses for it.
#pragma once

#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "ddiloco/data_loader.hpp"
#include "ddiloco/model.hpp"

namespace ddiloco::syncer {

class GlobalEvaluator {
 public:
  /// `threads`: OpenMP threads of the evaluation thread.
  GlobalEvaluator(const GptConfig& model, const ValidationSet& val, int batch, int threads);
  ~GlobalEvaluator();
  GlobalEvaluator(const GlobalEvaluator&) = delete;
  GlobalEvaluator& operator=(const GlobalEvaluator&) = delete;

  /// Starts evaluating `params` (flat, layout order) unless an evaluation is running; `tags`
  /// come back with the result. Returns false when busy.
  bool submit(std::vector<float> params, nlohmann::json tags);
  /// A finished evaluation: its tags with "val_loss" and "eval_s" added.
  std::optional<nlohmann::json> result();
  /// Waits for the running evaluation (if any), then evaluates `params` on this thread.
  double evaluate_now(std::span<const float> params);

 private:
  void loop();
  Gpt<float> model_;
  const ValidationSet& val_;
  int batch_, threads_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool busy_ = false, quit_ = false;
  std::vector<float> pending_;
  nlohmann::json tags_;
  std::optional<nlohmann::json> done_;
  std::thread thread_;
};

}  // namespace ddiloco::syncer
