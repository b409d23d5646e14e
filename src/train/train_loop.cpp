// The inner-step loop (train_loop.hpp).
#include "ddiloco/train_loop.hpp"

namespace ddiloco {

int64_t run_steps(UnitTrainer& trainer, int64_t first, StepPolicy& policy) {
  for (int64_t t = first;; ++t) {
    if (!policy.before_step(t)) return t - 1;
    const Stopwatch step_clock;
    const StepStats s = trainer.step();
    if (!policy.after_step(t, s, step_clock)) return t;
  }
}

}  // namespace ddiloco
