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

#include "ddiloco/error.hpp"
#include "ddiloco/gpu/bench_gpu.hpp"
#include "ddiloco/gpu/check.hpp"
#include "ddiloco/gpu/cudnn_attention.hpp"
#include "ddiloco/gpu/gpt_cuda.hpp"
#include "ddiloco/gpu/kernels.hpp"
#include "ddiloco/gpu/profiler.hpp"
#include "ddiloco/sdpa_shape.hpp"
#include "ddiloco/rng.hpp"

namespace ddiloco::gpu {
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

// One configuration of the GPU model's kernels.
struct Variant {
  gpu::AttentionKind attention;
  bool gelu_fusion;
};

std::string variant_name(const Variant& v) {
  return gpu::attention_kind_name(v.attention) +
         (v.gelu_fusion ? ", GELU fused" : ", GELU separate");
}

struct Measured {
  double fwd_ms = 0, bwd_ms = 0, opt_ms = 0, step_ms = 0, tokens_per_s = 0, mfu = 0;
  float first_loss = 0, last_loss = 0;
  long fallbacks = 0;  // fused GEMMs cuBLASLt had no algorithm for (ran unfused)
  double device_gib = 0, total_gib = 0;  // device memory in use with the model alive
};

// warmup + steps training steps of a fresh model (init_weights(seed)) on the given device
// tokens, timed with CUDA events; with `profile`, the per-operation table afterwards.
Measured measure(const GptConfig& config, const BenchGpuOptions& o, const Variant& variant,
                 const int32_t* tokens, const int32_t* targets, bool profile) {
  const int B = o.batch, T = o.seq_len;
  gpu::GptCuda model(config, AdamWConfig{o.beta1, o.beta2, o.eps, o.weight_decay},
                     variant.attention);
  model.set_gelu_fusion(variant.gelu_fusion);
  model.init_weights(o.seed);
  auto stream = static_cast<cudaStream_t>(model.stream());
  const int total = o.warmup + o.steps;
  // Events: start, after forward, after backward, after clip+AdamW — per step.
  std::vector<cudaEvent_t> events(4 * static_cast<size_t>(total));
  for (auto& e : events) DDILOCO_CUDA_CHECK(cudaEventCreate(&e));
  Measured r;
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
    if (i == 0) r.first_loss = model.loss();  // one sync, in the warm-up (or first) step
  }
  model.synchronize();
  r.last_loss = model.loss();
  for (int i = o.warmup; i < total; ++i) {
    cudaEvent_t* ev = events.data() + 4 * static_cast<size_t>(i);
    float a = 0, b = 0, c = 0;
    DDILOCO_CUDA_CHECK(cudaEventElapsedTime(&a, ev[0], ev[1]));
    DDILOCO_CUDA_CHECK(cudaEventElapsedTime(&b, ev[1], ev[2]));
    DDILOCO_CUDA_CHECK(cudaEventElapsedTime(&c, ev[2], ev[3]));
    r.fwd_ms += a / o.steps;
    r.bwd_ms += b / o.steps;
    r.opt_ms += c / o.steps;
  }
  float span = 0;  // first timed start to last end: includes any gaps between steps
  DDILOCO_CUDA_CHECK(cudaEventElapsedTime(&span, events[4 * static_cast<size_t>(o.warmup)],
                                          events[4 * static_cast<size_t>(total) - 1]));
  for (auto& e : events) cudaEventDestroy(e);
  r.step_ms = span / o.steps;
  r.tokens_per_s = static_cast<double>(B) * T / (r.step_ms / 1e3);
  r.mfu = r.tokens_per_s * config.flops_per_token() / (o.peak_tflops * 1e12);
  r.fallbacks = model.fused_epilogue_fallbacks();
  size_t free_b = 0, total_b = 0;
  DDILOCO_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  r.device_gib = static_cast<double>(total_b - free_b) / (1u << 30);
  r.total_gib = static_cast<double>(total_b) / (1u << 30);
  if (profile) profile_steps(model, tokens, targets, B, T, o, r.step_ms);
  return r;
}

// Why `kind` cannot run this shape ("" when it can): not in this build, or outside the
// flash kernels' or cuDNN's limits.
std::string unsupported(gpu::AttentionKind kind, const GptConfig& c, int B, int T) {
  if (!gpu::attention_kind_built(kind)) return "not in this build (built without cuDNN 9)";
  if (kind == gpu::AttentionKind::flash && !gpu::attention_flash_supported(T, c.n_embd, c.n_head))
    return "needs head size 64 and a sequence length that is a multiple of 64";
#if DDILOCO_HAVE_CUDNN
  if (kind == gpu::AttentionKind::cudnn)
    return gpu::sdpa_unsupported(gpu::sdpa_layout(B, T, c.n_embd, c.n_head), gpu::SdpaDtype::bfloat16,
                                 true, gpu::cudnn_runtime_version());
#else
  (void)B;
#endif
  return "";
}

// --compare: every variant that fits the shape, the chosen one among them; the kinds left
// out are named.
std::vector<Variant> compare_variants(const GptConfig& c, int B, int T) {
  std::vector<Variant> variants;
  for (const auto kind : gpu::kAttentionKinds) {
    const std::string why = unsupported(kind, c, B, T);
    if (!why.empty()) {
      std::printf("compare: attention %s left out: %s\n", gpu::attention_kind_name(kind).c_str(),
                  why.c_str());
      continue;
    }
    for (const bool fused : {false, true}) variants.push_back({kind, fused});
  }
  return variants;
}

GptConfig model_of(const BenchGpuOptions& o) {
  GptConfig config;
  config.n_layer = o.n_layer;
  config.n_head = o.n_head;
  config.n_embd = o.n_embd;
  config.vocab_size = o.vocab_size;
  config.seq_len = o.seq_len;
  config.validate();
  return config;
}

// Random tokens and their targets, uploaded once: the step then touches only device memory.
// Returns the device buffer, 2·B·T int32 (the caller frees it).
int32_t* upload_random_tokens(const BenchGpuOptions& o, size_t n) {
  Rng rng(o.seed + 1);
  std::vector<int32_t> host(2 * n);
  for (auto& t : host) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(o.vocab_size)));
  int32_t* tokens = nullptr;
  DDILOCO_CUDA_CHECK(cudaMalloc(&tokens, 2 * n * sizeof(int32_t)));
  DDILOCO_CUDA_CHECK(cudaMemcpy(tokens, host.data(), 2 * n * sizeof(int32_t), cudaMemcpyHostToDevice));
  return tokens;
}

void print_setup(const BenchGpuOptions& o, const GptConfig& config, const Variant& chosen) {
  int dev = 0;
  DDILOCO_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  DDILOCO_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  std::printf("bench gpu: %s (sm_%d%d), n_layer=%d n_head=%d n_embd=%d vocab=%d params=%.2fM\n",
              prop.name, prop.major, prop.minor, config.n_layer, config.n_head, config.n_embd,
              config.vocab_size, static_cast<double>(ParameterLayout::gpt2(config).size()) / 1e6);
  std::printf("bench gpu: batch B=%d sequence T=%d (%d tokens/step), bf16 activations, fp32 "
              "master weights, %s, steps=%d (+%d warm-up)\n",
              o.batch, o.seq_len, o.batch * o.seq_len, variant_name(chosen).c_str(), o.steps, o.warmup);
#if DDILOCO_HAVE_CUDNN
  const long version = gpu::cudnn_runtime_version();
  std::printf("bench gpu: cuDNN %ld.%ld.%ld loaded (attention cudnn built)\n", version / 10000,
              version / 100 % 100, version % 100);
#else
  std::printf("bench gpu: built without cuDNN (attention cudnn not available)\n");
#endif
}

// --compare: the variants side by side, ratios against the first row.
void print_comparison(const BenchGpuOptions& o, const std::vector<Variant>& variants,
                      const std::vector<Measured>& results) {
  std::printf("\ncompare: %zu variants, each a fresh model, %d steps after %d warm-up; ratio = "
              "tokens/s over the first row's\n",
              variants.size(), o.steps, o.warmup);
  std::printf("%-34s %8s %8s %8s %8s %11s %7s %6s %8s %s\n", "variant", "step ms", "fwd", "bwd", "opt",
              "tokens/s", "MFU %", "ratio", "GPU GiB", "fused-GEMM fallbacks");
  for (size_t i = 0; i < variants.size(); ++i) {
    const Measured& r = results[i];
    std::printf("%-34s %8.2f %8.2f %8.2f %8.2f %11.0f %7.1f %6.3f %8.1f %ld\n",
                variant_name(variants[i]).c_str(), r.step_ms, r.fwd_ms, r.bwd_ms, r.opt_ms, r.tokens_per_s,
                100.0 * r.mfu, r.tokens_per_s / results[0].tokens_per_s, r.device_gib, r.fallbacks);
  }
  std::printf("\n");
}

// The chosen variant's figures; the last line is the one scripts read.
void print_summary(const BenchGpuOptions& o, const GptConfig& config, const Variant& chosen, const Measured& mine) {
  const double flops_per_token = config.flops_per_token();
  std::printf("per step: forward %.2f ms, backward %.2f ms, clip+AdamW %.2f ms, step %.2f ms\n",
              mine.fwd_ms, mine.bwd_ms, mine.opt_ms, mine.step_ms);
  std::printf("loss: %.4f at the first step, %.4f after %d steps (random tokens: ln V = %.2f)\n",
              mine.first_loss, mine.last_loss, o.warmup + o.steps, std::log(static_cast<double>(o.vocab_size)));
  std::printf("device memory in use: %.1f GiB of %.1f GiB\n", mine.device_gib, mine.total_gib);
  if (chosen.gelu_fusion)
    std::printf("GELU fusion: %s\n", mine.fallbacks == 0
                                         ? "every fused GEMM ran in cuBLASLt's epilogue"
                                         : "cuBLASLt had no algorithm for some fused GEMMs: they ran unfused");
  std::printf("model FLOPs/token %.3g (6N + 12·L·C·T); achieved %.1f TFLOP/s; peak %.1f TFLOP/s\n",
              flops_per_token, mine.tokens_per_s * flops_per_token / 1e12, o.peak_tflops);
  std::printf("batch=%d seq_len=%d tokens_per_s=%.0f mfu=%.4f (%.1f %%)\n", o.batch, o.seq_len,
              mine.tokens_per_s, mine.mfu, 100.0 * mine.mfu);
}

}  // namespace

int bench_gpu(const BenchGpuOptions& o) {
  if (!gpu::cuda_device_available()) fail("bench gpu: no CUDA device (cudaGetDeviceCount found none)");
  const GptConfig config = model_of(o);
  const int B = o.batch, T = o.seq_len;
  const Variant chosen{gpu::parse_attention_kind(o.attention), o.gelu_fusion};
  const size_t N = static_cast<size_t>(B) * T;
  int32_t* tokens = upload_random_tokens(o, N);
  const int32_t* targets = tokens + N;
  print_setup(o, config, chosen);

  const std::string why = unsupported(chosen.attention, config, B, T);
  if (!why.empty())
    fail("bench gpu: --attention {} {} (n_embd {}, n_head {}, batch {}, seq {})", o.attention, why,
         config.n_embd, config.n_head, B, T);
  // --compare: every variant that fits the shape, side by side, the chosen one among them.
  std::vector<Variant> variants{chosen};
  if (o.compare) variants = compare_variants(config, B, T);
  std::vector<Measured> results;
  Measured mine;
  for (const auto& v : variants) {
    const bool is_chosen = v.attention == chosen.attention && v.gelu_fusion == chosen.gelu_fusion;
    // The profile table goes first so that the summary line stays the last one.
    results.push_back(measure(config, o, v, tokens, targets, o.profile && is_chosen));
    if (is_chosen) mine = results.back();
  }
  cudaFree(tokens);
  if (o.compare) print_comparison(o, variants, results);
  print_summary(o, config, chosen, mine);
  return 0;
}

}  // namespace ddiloco::gpu
