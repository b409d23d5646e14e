// Micro-benchmarks of the CPU layers at demo-sized shapes, side by side with the naive
// alternatives they replace (libm GELU, dense attention). Run: build/bench/ddiloco_microbench
#include <benchmark/benchmark.h>

#include <cmath>
#include <vector>

#include "ddiloco/layers.hpp"
#include "ddiloco/rng.hpp"

namespace {

using namespace ddiloco;

std::vector<float> random_floats(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal());
  return v;
}

void BM_GeluVectorised(benchmark::State& state) {
  const long n = state.range(0);
  const auto x = random_floats(n, 1);
  std::vector<float> y(n);
  for (auto _ : state) {
    layers::gelu_forward(y.data(), x.data(), n);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_GeluLibm(benchmark::State& state) {  // the scalar tanhf version it replaced
  const long n = state.range(0);
  const auto x = random_floats(n, 1);
  std::vector<float> y(n);
  const float k = std::sqrt(2.0f / static_cast<float>(M_PI));
  for (auto _ : state) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i)
      y[i] = 0.5f * x[i] * (1.0f + std::tanh(k * (x[i] + 0.044715f * x[i] * x[i] * x[i])));
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}

// B=16, T=128, C=128, NH=4: the demo's attention.
void BM_AttentionForwardBackward(benchmark::State& state) {
  const int B = 16, T = static_cast<int>(state.range(0)), C = 128, NH = 4;
  const auto qkv = random_floats(static_cast<size_t>(B) * T * 3 * C, 2);
  const auto dout = random_floats(static_cast<size_t>(B) * T * C, 3);
  std::vector<float> out(dout.size()), att(static_cast<size_t>(B) * NH * T * T), dqkv(qkv.size());
  for (auto _ : state) {
    layers::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    layers::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
    benchmark::DoNotOptimize(dqkv.data());
  }
  state.SetItemsProcessed(state.iterations() * B * T);
}

void BM_MatmulForwardBackward(benchmark::State& state) {
  const int N = 2048, IN = 128, OUT = static_cast<int>(state.range(0));
  const auto x = random_floats(static_cast<size_t>(N) * IN, 4);
  const auto w = random_floats(static_cast<size_t>(OUT) * IN, 5);
  const auto b = random_floats(OUT, 6);
  const auto dy = random_floats(static_cast<size_t>(N) * OUT, 7);
  std::vector<float> y(dy.size()), dx(x.size()), dw(w.size()), db(OUT);
  for (auto _ : state) {
    layers::matmul_forward(y.data(), x.data(), w.data(), b.data(), N, IN, OUT);
    layers::matmul_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, IN,
                            OUT);
    benchmark::DoNotOptimize(dw.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(6.0 * N * IN * OUT * state.iterations() / 1e9,
                                                 benchmark::Counter::kIsRate);
}

BENCHMARK(BM_GeluVectorised)->Arg(1 << 20);
BENCHMARK(BM_GeluLibm)->Arg(1 << 20);
BENCHMARK(BM_AttentionForwardBackward)->Arg(128)->Arg(256);
BENCHMARK(BM_MatmulForwardBackward)->Arg(384)->Arg(512);

}  // namespace
