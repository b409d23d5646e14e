// `ddiloco bench gpu`: training-step throughput of GptCuda on one device, tokens/s and MFU.
//
// A step is what a GPU learner runs per inner step: zero_grad, forward (loss fused with its
// gradient), backward, global-norm clip, AdamW — all enqueued on the model's stream with no
// host synchronisation inside; CUDA events around each phase time it. MFU follows the PaLM
// estimate (Chowdhery et al. 2022, appendix B) that llm.c also prints:
//   model FLOPs per token = 6·N_params + 12·n_layer·n_embd·T   (GptConfig::flops_per_token)
//   MFU = tokens/s · FLOPs per token / peak bf16 FLOP/s.
// The attention term counts the causal T×T products as dense, like the formula does, even
// though our GEMMs compute them dense too (the masked half is wasted work, not counted twice).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "cli/commands.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/gpu/check.hpp"
#include "ddiloco/gpu/gpt_cuda.hpp"
#include "ddiloco/rng.hpp"

namespace ddiloco::cli {

int bench_gpu(const BenchGpuOptions& o) {
  if (!gpu::cuda_device_available())
    fail("bench gpu: no CUDA device (cudaGetDeviceCount found none)");
  GptConfig config;
  config.n_layer = o.n_layer;
  config.n_head = o.n_head;
  config.n_embd = o.n_embd;
  config.vocab_size = o.vocab_size;
  config.seq_len = o.seq_len;
  config.validate();
  const int B = o.batch, T = o.seq_len;

  int dev = 0;
  DDILOCO_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  DDILOCO_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));

  const gpu::AttentionKind attention =
      o.attention == "cublas" ? gpu::AttentionKind::cublas : gpu::AttentionKind::flash;
  gpu::GptCuda model(config, AdamWConfig{o.beta1, o.beta2, o.eps, o.weight_decay}, attention);
  model.init_weights(o.seed);

  // Random tokens, uploaded once: the step then touches only device memory.
  const size_t N = static_cast<size_t>(B) * T;
  Rng rng(o.seed + 1);
  std::vector<int32_t> host(2 * N);
  for (auto& t : host) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(o.vocab_size)));
  int32_t* tokens = nullptr;
  DDILOCO_CUDA_CHECK(cudaMalloc(&tokens, 2 * N * sizeof(int32_t)));
  DDILOCO_CUDA_CHECK(
      cudaMemcpy(tokens, host.data(), 2 * N * sizeof(int32_t), cudaMemcpyHostToDevice));
  const int32_t* targets = tokens + N;

  const double params = static_cast<double>(model.num_parameters());
  const double flops_per_token = config.flops_per_token();
  std::printf("bench gpu: %s (sm_%d%d), n_layer=%d n_head=%d n_embd=%d vocab=%d params=%.2fM\n",
              prop.name, prop.major, prop.minor, config.n_layer, config.n_head, config.n_embd,
              config.vocab_size, params / 1e6);
  std::printf("bench gpu: batch B=%d sequence T=%d (%zu tokens/step), bf16 activations, fp32 "
              "master weights, %s attention, steps=%d (+%d warm-up)\n",
              B, T, N, o.attention.c_str(), o.steps, o.warmup);

  auto stream = static_cast<cudaStream_t>(model.stream());
  const int total = o.warmup + o.steps;
  // Events: start, after forward, after backward, after clip+AdamW — per step.
  std::vector<cudaEvent_t> events(4 * static_cast<size_t>(total));
  for (auto& e : events) DDILOCO_CUDA_CHECK(cudaEventCreate(&e));
  float first_loss = 0;
  for (int i = 0; i < total; ++i) {
    cudaEvent_t* ev = events.data() + 4 * static_cast<size_t>(i);
    DDILOCO_CUDA_CHECK(cudaEventRecord(ev[0], stream));
    model.zero_grad();
    model.forward_device(tokens, targets, B, T);
    DDILOCO_CUDA_CHECK(cudaEventRecord(ev[1], stream));
    model.backward();
    DDILOCO_CUDA_CHECK(cudaEventRecord(ev[2], stream));
    model.clip_grad_norm(static_cast<float>(o.grad_clip));
    model.step(o.lr);
    DDILOCO_CUDA_CHECK(cudaEventRecord(ev[3], stream));
    if (i == 0) first_loss = model.loss();  // one sync, in the warm-up (or first) step
  }
  model.synchronize();
  const float last_loss = model.loss();

  double fwd = 0, bwd = 0, upd = 0, wall = 0;
  for (int i = o.warmup; i < total; ++i) {
    cudaEvent_t* ev = events.data() + 4 * static_cast<size_t>(i);
    float a = 0, b = 0, c = 0;
    DDILOCO_CUDA_CHECK(cudaEventElapsedTime(&a, ev[0], ev[1]));
    DDILOCO_CUDA_CHECK(cudaEventElapsedTime(&b, ev[1], ev[2]));
    DDILOCO_CUDA_CHECK(cudaEventElapsedTime(&c, ev[2], ev[3]));
    fwd += a;
    bwd += b;
    upd += c;
  }
  {
    float span = 0;  // first timed start to last end: includes any gaps between steps
    DDILOCO_CUDA_CHECK(cudaEventElapsedTime(&span, events[4 * static_cast<size_t>(o.warmup)],
                                            events[4 * static_cast<size_t>(total) - 1]));
    wall = span;
  }
  for (auto& e : events) cudaEventDestroy(e);
  cudaFree(tokens);

  size_t free_b = 0, total_b = 0;
  DDILOCO_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const double step_ms = wall / o.steps;
  const double tps = static_cast<double>(N) / (step_ms / 1e3);
  const double achieved = tps * flops_per_token;
  const double mfu = achieved / (o.peak_tflops * 1e12);
  std::printf("per step: forward %.2f ms, backward %.2f ms, clip+AdamW %.2f ms, step %.2f ms\n",
              fwd / o.steps, bwd / o.steps, upd / o.steps, step_ms);
  std::printf("loss: %.4f at the first step, %.4f after %d steps (random tokens: ln V = %.2f)\n",
              first_loss, last_loss, total, std::log(static_cast<double>(o.vocab_size)));
  std::printf("device memory in use: %.1f GiB of %.1f GiB\n",
              static_cast<double>(total_b - free_b) / (1u << 30),
              static_cast<double>(total_b) / (1u << 30));
  std::printf("model FLOPs/token %.3g (6N + 12·L·C·T); achieved %.1f TFLOP/s; peak %.1f TFLOP/s\n",
              flops_per_token, achieved / 1e12, o.peak_tflops);
  std::printf("batch=%d seq_len=%d tokens_per_s=%.0f mfu=%.4f (%.1f %%)\n", B, T, tps, mfu,
              100.0 * mfu);
  return 0;
}

}  // namespace ddiloco::cli
