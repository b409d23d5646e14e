// `ddiloco bench model`: forward + backward + AdamW throughput of one rank on random tokens.
#include <mpi.h>

#include <algorithm>
#include <cstdio>

#include "cli/commands.hpp"
#include "ddiloco/config.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/rng.hpp"
#include "ddiloco/trainer.hpp"

namespace ddiloco::cli {

int bench_model(const BenchModelOptions& o) {
  const Config config = load_config(o.config, o.overrides);
  const int threads = configure_threads(config.run.threads, MPI_COMM_SELF);
  const int B = config.train.batch_size, T = config.model.seq_len, V = config.model.vocab_size;
  Gpt<float> model(config.model);
  model.init_weights(static_cast<uint64_t>(config.run.seed));
  AdamW<float> opt(model.layout(), AdamWConfig{config.train.beta1, config.train.beta2,
                                               config.train.eps, config.train.weight_decay});
  Rng rng(7);
  std::vector<int32_t> in(static_cast<size_t>(B) * T), tgt(in.size());
  for (auto& t : in) t = static_cast<int32_t>(rng.below(V));
  for (auto& t : tgt) t = static_cast<int32_t>(rng.below(V));

  std::printf("bench model: n_layer=%d n_head=%d n_embd=%d seq_len=%d vocab=%d batch=%d "
              "params=%.2fM threads=%d steps=%d (+%d warm-up)\n",
              config.model.n_layer, config.model.n_head, config.model.n_embd, T, V, B,
              model.layout().size() / 1e6, threads, o.steps, o.warmup);
  double fwd = 0, bwd = 0, upd = 0;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    Stopwatch c;
    model.forward(in.data(), tgt.data(), B, T);
    const double t1 = c.seconds();
    model.zero_grad();
    model.backward();
    const double t2 = c.seconds();
    clip_grad_norm(model.gradients(), config.train.grad_clip);
    opt.step(model.parameters(), model.gradients(), config.train.lr);
    const double t3 = c.seconds();
    if (i >= o.warmup) {
      fwd += t1;
      bwd += t2 - t1;
      upd += t3 - t2;
    }
  }
  const double total = fwd + bwd + upd;
  const double tokens = static_cast<double>(B) * T * o.steps;
  const double tps = tokens / total;
  std::printf("per step: forward %.1f ms, backward %.1f ms, clip+AdamW %.1f ms, total %.1f ms\n",
              1e3 * fwd / o.steps, 1e3 * bwd / o.steps, 1e3 * upd / o.steps,
              1e3 * total / o.steps);
  std::printf("achieved %.1f GFLOP/s (6N+12LCT estimate)\n",
              tps * config.model.flops_per_token() / 1e9);
  std::printf("tokens_per_s=%.1f\n", tps);
  return 0;
}

}  // namespace ddiloco::cli
