// `ddiloco bench gpu`: training-step throughput of GptCuda on one device, tokens/s and MFU.
//
// A step is what a GPU learner runs per inner step: zero_grad, forward (loss fused with its
// gradient), backward, global-norm clip, AdamW — all enqueued on the model's stream with no
// host synchronisation inside; CUDA events around each phase time it. MFU follows the PaLM
// estimate (Chowdhery et al. 2022, appendix B) that llm.c also prints:
//   model FLOPs per token = 6·N_params + 12·n_layer·n_embd·T   (GptConfig::flops_per_token)
//   MFU = tokens/s · FLOPs per token / peak bf16 FLOP/s.
// The attention term counts the causal T×T products as dense, like the formula does, even
// though our cublas GEMMs compute the causal split's blocks (10/16 of T×T at 4 blocks; the
// masked part inside is wasted work, not counted twice) and the flash kernels causal tiles.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/gpu/check.hpp"
#include "ddiloco/gpu/gpt_cuda.hpp"
#include "ddiloco/gpu/profiler.hpp"
#include "ddiloco/rng.hpp"

namespace ddiloco::cli {
namespace {

// `--profile`: `steps` more training steps with the model's OpProfiler on, then the table.
// Rows are the profiler's categories in order of first appearance, summed over layers and
// averaged over the profiled steps; groups (a matmul's dgrad/wgrad/bias, attention's
// sub-steps, the grad-norm kernels) are indented above their members and left out of the
// sums. % is of the profiled step (its own start/end events), whose time includes the events'
// overhead and any gaps between operations ("unattributed" below the table).
void profile_steps(gpu::GptCuda& model, const int32_t* tokens, const int32_t* targets, int B,
                   int T, const BenchGpuOptions& o, double timed_step_ms) {
  auto stream = static_cast<cudaStream_t>(model.stream());
  gpu::OpProfiler prof(model.stream());
  cudaEvent_t start = nullptr, stop = nullptr;
  DDILOCO_CUDA_CHECK(cudaEventCreate(&start));
  DDILOCO_CUDA_CHECK(cudaEventCreate(&stop));
  model.set_profiler(&prof);
  double step_ms = 0;
  for (int i = 0; i < o.profile_steps; ++i) {
    DDILOCO_CUDA_CHECK(cudaEventRecord(start, stream));
    model.zero_grad();
    model.forward_device(tokens, targets, B, T);
    model.backward();
    model.clip_grad_norm(static_cast<float>(o.grad_clip));
    model.step(o.lr);
    DDILOCO_CUDA_CHECK(cudaEventRecord(stop, stream));
    prof.collect();  // synchronises
    float ms = 0;
    DDILOCO_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    step_ms += ms;
  }
  model.set_profiler(nullptr);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  const double n = o.profile_steps;
  step_ms /= n;

  std::printf("\nprofile: %d instrumented steps, per step (summed over the %d layers); %% of the "
              "instrumented step %.2f ms; TFLOP/s = FLOPs/time for GEMMs (attention GEMMs: "
              "cublas the blocks of its causal split, 10/16 of T*T, flash causal tiles)\n",
              o.profile_steps, model.config().n_layer, step_ms);
  std::printf("%-58s %7s %9s %7s %9s\n", "category", "calls", "ms/step", "% step", "TFLOP/s");
  double leaf_ms = 0, fwd = 0, bwd = 0, opt = 0, gemm_ms = 0, gemm_flops = 0;
  for (const auto& r : prof.rows()) {
    const double ms = r.ms / n;
    std::string label(static_cast<size_t>(2 * r.depth), ' ');
    // Nested rows show their own part of the name only; the group above says which.
    const size_t cut = r.name.rfind(" / ");
    label += r.depth > 0 && cut != std::string::npos ? r.name.substr(cut + 3) : r.name;
    if (r.group) label += " (group)";
    char tf[32] = "";
    if (r.flops > 0 && r.ms > 0)
      std::snprintf(tf, sizeof tf, "%9.1f", r.flops / (r.ms / 1e3) / 1e12);
    std::printf("%-58s %7.0f %9.3f %7.2f %9s\n", label.c_str(), static_cast<double>(r.count) / n,
                ms, 100.0 * ms / step_ms, tf);
    if (r.group) continue;
    leaf_ms += ms;
    if (r.name.rfind("fwd", 0) == 0) fwd += ms;
    if (r.name.rfind("bwd", 0) == 0) bwd += ms;
    if (r.name.rfind("opt", 0) == 0) opt += ms;
    if (r.flops > 0) {
      gemm_ms += ms;
      gemm_flops += r.flops / n;
    }
  }
  std::printf("%-58s %7s %9.3f %7.2f\n", "sum of categories (leaves)", "", leaf_ms,
              100.0 * leaf_ms / step_ms);
  std::printf("%-58s %7s %9.3f %7.2f\n", "unattributed (event overhead, launch gaps)", "",
              step_ms - leaf_ms, 100.0 * (step_ms - leaf_ms) / step_ms);
  std::printf("%-58s %7s %9.3f\n", "instrumented step (events around it)", "", step_ms);
  std::printf("%-58s %7s %9.3f\n", "timed step above (no instrumentation)", "", timed_step_ms);
  std::printf("profile: forward %.2f ms, backward %.2f ms, zero_grad+clip+AdamW %.2f ms; GEMMs "
              "(incl. attention's) %.2f ms = %.1f %% of the step at %.1f TFLOP/s; non-GEMM %.2f "
              "ms\n",
              fwd, bwd, opt, gemm_ms, 100.0 * gemm_ms / step_ms,
              gemm_ms > 0 ? gemm_flops / (gemm_ms / 1e3) / 1e12 : 0.0, leaf_ms - gemm_ms);
}

}  // namespace

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

  gpu::AttentionKind attention = gpu::AttentionKind::cublas;
  if (o.attention == "flash")
    attention = gpu::AttentionKind::flash;
  else if (o.attention == "cublas_inplace")
    attention = gpu::AttentionKind::cublas_inplace;
  else if (o.attention != "cublas")
    fail("bench gpu: --attention must be cublas, cublas_inplace or flash, got '{}'",
         o.attention);
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
  // The profile goes first so that the summary line stays the last one (scripts parse it).
  if (o.profile) profile_steps(model, tokens, targets, B, T, o, step_ms);
  cudaFree(tokens);
  std::printf("batch=%d seq_len=%d tokens_per_s=%.0f mfu=%.4f (%.1f %%)\n", B, T, tps, mfu,
              100.0 * mfu);
  return 0;
}

}  // namespace ddiloco::cli
