#include "syncer/global_eval.hpp"

#include <omp.h>

#include <algorithm>

#include "ddiloco/fpu.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/trainer.hpp"

namespace ddiloco::syncer {

GlobalEvaluator::GlobalEvaluator(const GptConfig& model, const ValidationSet& val, int batch,
                                 int threads)
    : model_(model), val_(val), batch_(batch), threads_(threads) {
  thread_ = std::thread([this] { loop(); });
}

GlobalEvaluator::~GlobalEvaluator() {
  {
    std::lock_guard lock(mutex_);
    quit_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool GlobalEvaluator::submit(std::vector<float> params, nlohmann::json tags) {
  {
    std::lock_guard lock(mutex_);
    if (busy_) return false;
    busy_ = true;
    pending_ = std::move(params);
    tags_ = std::move(tags);
  }
  cv_.notify_all();
  return true;
}

std::optional<nlohmann::json> GlobalEvaluator::result() {
  std::lock_guard lock(mutex_);
  auto out = std::move(done_);
  done_.reset();
  return out;
}

void GlobalEvaluator::loop() {
  omp_set_num_threads(threads_);  // this thread's own OpenMP setting
  flush_denormals_to_zero();      // ... and its own team's floating-point mode
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [this] { return quit_ || (busy_ && !pending_.empty()); });
    if (quit_) return;
    std::vector<float> params = std::move(pending_);
    pending_.clear();
    lock.unlock();
    Stopwatch clock;
    std::copy(params.begin(), params.end(), model_.parameters().begin());
    const double loss = validation_loss(model_, val_, batch_, MPI_COMM_NULL);
    lock.lock();
    tags_["val_loss"] = loss;
    tags_["eval_s"] = clock.seconds();
    done_ = std::move(tags_);
    busy_ = false;
    cv_.notify_all();
  }
}

double GlobalEvaluator::evaluate_now(std::span<const float> params) {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [this] { return !busy_; });
  std::copy(params.begin(), params.end(), model_.parameters().begin());
  return validation_loss(model_, val_, batch_, MPI_COMM_NULL);
}

}  // namespace ddiloco::syncer
