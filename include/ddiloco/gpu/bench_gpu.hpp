// `ddiloco bench gpu`: the GPU model's training-step throughput and MFU. Its options live here,
// beside the GPU code that reads them, so that src/gpu needs nothing from src/cli.
#pragma once

#include <cstdint>
#include <string>

namespace ddiloco::gpu {

struct BenchGpuOptions {
  // The GPT-2 124M shape (Radford et al. 2019) with the vocabulary padded to a multiple of
  // 128 (50257 → 50304, as llm.c does) so the LM-head GEMM tiles evenly.
  int n_layer = 12;
  int n_head = 12;
  int n_embd = 768;
  int vocab_size = 50304;
  int seq_len = 1024;
  int batch = 16;
  int steps = 20;
  int warmup = 3;
  double peak_tflops = 989.0;  // H100/H200 SXM dense bf16 tensor-core peak
  double lr = 6e-4;
  double grad_clip = 1.0;
  uint64_t seed = 1;
  std::string attention = "cublas";  // gpu::attention_kind_name of a gpu::AttentionKind
  bool gelu_fusion = false;          // gpu::GptCuda::set_gelu_fusion
  // compare: run every kernel variant (attention kinds that fit the shape × GELU fused or
  // separate), each on a fresh model, and print them side by side with tokens/s ratios; the
  // summary line is the chosen variant's (attention, gelu_fusion).
  bool compare = false;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  // profile: after the timed steps, profile_steps more with CUDA events around every
  // operation, and a table of where the step's time goes. The timed steps are not
  // instrumented either way.
  bool profile = false;
  int profile_steps = 3;
};
/// Training-step throughput of the GPU model (forward + backward + clip + AdamW) on random
/// tokens: tokens/s and MFU against peak_tflops. Only in builds with DDILOCO_HAVE_CUDA;
/// last line "batch=<B> seq_len=<T> tokens_per_s=<n> mfu=<fraction> (<percent> %)".
int bench_gpu(const BenchGpuOptions& options);

}  // namespace ddiloco::gpu
