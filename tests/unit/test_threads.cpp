// Results do not depend on the number of OpenMP threads: the ranks of a unit may run with
// different run.threads (the e2e identity test compares a 2-thread single run with a 1-thread
// MPI learner) and must stay bit-identical. OpenBLAS's own threaded GEMM gave results that
// depended on its thread count (on the AVX2 kernels, OPENBLAS_CORETYPE=Haswell as on AMD EPYC,
// for every product it threads; on the SSE3 ones for ragged sizes like those below), and an
// OpenMP reduction sums in an order that follows the threads. These tests hold on whatever
// kernels the machine gets; the old code failed them with and without that variable.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "ddiloco/fpu.hpp"
#include "ddiloco/layers.hpp"
#include "ddiloco/model.hpp"
#include "ddiloco/optim.hpp"
#include "ddiloco/rng.hpp"
#include "model/gemm.hpp"

namespace ddiloco {
namespace {

// Sets the OpenMP team size (and FTZ/DAZ on its threads, as configure_threads does) for the
// duration of a scope, restoring the previous setting after.
class Threads {
 public:
  explicit Threads(int n) : saved_(omp_get_max_threads()) {
    omp_set_num_threads(n);
    flush_denormals_to_zero();
    int team = 0;
#pragma omp parallel
    {
      if (omp_get_thread_num() == 0) team = omp_get_num_threads();
    }
    EXPECT_EQ(team, n) << "the OpenMP runtime did not give the requested threads";
  }
  ~Threads() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <typename T>
size_t count_differing(const std::vector<T>& a, const std::vector<T>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return n;
}

struct TrainResult {
  std::vector<float> losses, grads, params;
};

// Two steps of forward, backward, clipping and AdamW on a small GPT whose products are large
// enough for OpenBLAS to thread them (M·N·K well above its 2^18 threshold), whose sizes are
// not multiples of the kernels' blocking (C = 40, 3C = 120, V = 97), so ragged tiles occur,
// and with B·T = 512 rows, so the weight gradients are split along K.
TrainResult train_two_steps(int threads) {
  Threads scope(threads);
  const GptConfig config{97, 64, 2, 2, 40};
  const int B = 8, T = 64;
  Gpt<float> model(config);
  model.init_weights(11);
  AdamW<float> opt(model.layout(), AdamWConfig{});
  Rng rng(12);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  TrainResult r;
  for (int step = 0; step < 2; ++step) {
    for (auto& t : tokens) t = static_cast<int32_t>(rng.below(config.vocab_size));
    for (auto& t : targets) t = static_cast<int32_t>(rng.below(config.vocab_size));
    r.losses.push_back(model.forward(tokens.data(), targets.data(), B, T));
    model.zero_grad();
    model.backward();
    clip_grad_norm(model.gradients(), 1.0);
    opt.step(model.parameters(), model.gradients(), 3e-3);
  }
  r.grads.assign(model.gradients().begin(), model.gradients().end());
  r.params.assign(model.parameters().begin(), model.parameters().end());
  return r;
}

TEST(Threads, TrainingStepsAreBitIdenticalForAnyThreadCount) {
  const TrainResult one = train_two_steps(1);
  for (int threads : {2, 3}) {
    const TrainResult many = train_two_steps(threads);
    EXPECT_TRUE(same_bits(one.losses, many.losses)) << threads << " threads: losses differ";
    EXPECT_TRUE(same_bits(one.grads, many.grads))
        << threads << " threads: " << count_differing(one.grads, many.grads) << " of "
        << one.grads.size() << " gradients differ";
    EXPECT_TRUE(same_bits(one.params, many.params))
        << threads << " threads: " << count_differing(one.params, many.params) << " of "
        << one.params.size() << " parameters differ";
  }
}

// The linear layer alone, in both scalar types, on shapes with ragged edges.
template <typename S>
std::vector<S> matmul_outputs(int threads, int N, int IN, int OUT) {
  Threads scope(threads);
  Rng rng(5);
  auto random = [&](size_t n) {
    std::vector<S> v(n);
    for (auto& x : v) x = static_cast<S>(rng.normal());
    return v;
  };
  const auto inp = random(static_cast<size_t>(N) * IN), w = random(static_cast<size_t>(OUT) * IN),
             bias = random(OUT), dout = random(static_cast<size_t>(N) * OUT);
  std::vector<S> out(static_cast<size_t>(N) * OUT), dinp(static_cast<size_t>(N) * IN);
  std::vector<S> dw = random(static_cast<size_t>(OUT) * IN), dbias(OUT, S(0));
  layers::matmul_forward(out.data(), inp.data(), w.data(), bias.data(), N, IN, OUT);
  layers::matmul_backward(dinp.data(), dw.data(), dbias.data(), dout.data(), inp.data(), w.data(),
                          N, IN, OUT);
  std::vector<S> all = out;
  all.insert(all.end(), dinp.begin(), dinp.end());
  all.insert(all.end(), dw.begin(), dw.end());
  all.insert(all.end(), dbias.begin(), dbias.end());
  return all;
}

TEST(Threads, MatmulIsBitIdenticalForAnyThreadCount) {
  const int shapes[][3] = {{300, 77, 131}, {64, 256, 33}, {1000, 20, 45}, {7, 500, 300}};
  for (const auto& s : shapes) {
    const auto f1 = matmul_outputs<float>(1, s[0], s[1], s[2]);
    const auto d1 = matmul_outputs<double>(1, s[0], s[1], s[2]);
    for (int threads : {2, 3}) {
      const auto f = matmul_outputs<float>(threads, s[0], s[1], s[2]);
      const auto d = matmul_outputs<double>(threads, s[0], s[1], s[2]);
      EXPECT_TRUE(same_bits(f1, f))
          << "float N=" << s[0] << " IN=" << s[1] << " OUT=" << s[2] << ", " << threads
          << " threads: " << count_differing(f1, f) << " values differ";
      EXPECT_TRUE(same_bits(d1, d))
          << "double N=" << s[0] << " IN=" << s[1] << " OUT=" << s[2] << ", " << threads
          << " threads: " << count_differing(d1, d) << " values differ";
    }
  }
}

// detail::gemm against a plain triple loop, for every transpose pair and both kinds of beta,
// on shapes that take each branch of its plan: several tiles, K split in chunks (small C,
// long K), one tile, ragged edges, an empty product; and bit-identical for 1, 2, 3 threads.
TEST(Threads, TiledGemmMatchesReferenceAndIgnoresThreadCount) {
  const int shapes[][3] = {{600, 300, 40}, {70, 50, 1500}, {16, 16, 600}, {5, 3, 7},
                           {1, 700, 9},    {300, 1, 513},  {0, 4, 4},     {4, 4, 0}};
  for (const auto& s : shapes) {
    const int M = s[0], N = s[1], K = s[2];
    for (int trans = 0; trans < 4; ++trans) {
      const bool ta = trans & 1, tb = trans & 2;
      for (const float beta : {0.0f, 1.5f}) {
        Rng rng(static_cast<uint64_t>(M * 7 + N * 5 + K * 3 + trans));
        std::vector<float> A(static_cast<size_t>(M) * K), B(static_cast<size_t>(K) * N);
        for (auto& x : A) x = static_cast<float>(rng.normal());
        for (auto& x : B) x = static_cast<float>(rng.normal());
        std::vector<float> C0(static_cast<size_t>(M) * N);
        for (auto& x : C0) x = static_cast<float>(rng.normal());
        // beta = 0 must not read C: start from NaN there.
        if (beta == 0) C0.assign(C0.size(), std::numeric_limits<float>::quiet_NaN());
        const int lda = ta ? M : K, ldb = tb ? K : N;
        auto a = [&](int i, int k) {
          return ta ? A[static_cast<size_t>(k) * lda + i] : A[static_cast<size_t>(i) * lda + k];
        };
        auto b = [&](int k, int j) {
          return tb ? B[static_cast<size_t>(j) * ldb + k] : B[static_cast<size_t>(k) * ldb + j];
        };
        std::vector<std::vector<float>> results;
        for (int threads : {1, 2, 3}) {
          Threads scope(threads);
          std::vector<float> C = C0;
          detail::gemm(ta, tb, M, N, K, 0.5f, A.data(), std::max(1, lda), B.data(),
                       std::max(1, ldb), beta, C.data(), std::max(1, N));
          results.push_back(std::move(C));
        }
        const std::string what = "M=" + std::to_string(M) + " N=" + std::to_string(N) +
                                 " K=" + std::to_string(K) + " ta=" + std::to_string(ta) +
                                 " tb=" + std::to_string(tb) + " beta=" + std::to_string(beta);
        EXPECT_TRUE(same_bits(results[0], results[1])) << what << ": 1 vs 2 threads";
        EXPECT_TRUE(same_bits(results[0], results[2])) << what << ": 1 vs 3 threads";
        double worst = 0;
        for (int i = 0; i < M; ++i)
          for (int j = 0; j < N; ++j) {
            double ref = beta == 0 ? 0.0 : double(beta) * C0[static_cast<size_t>(i) * N + j];
            for (int k = 0; k < K; ++k) ref += 0.5 * double(a(i, k)) * double(b(k, j));
            const double err = std::abs(results[0][static_cast<size_t>(i) * N + j] - ref);
            worst = std::max(worst, std::isnan(err) ? 1e30 : err);
          }
        EXPECT_LT(worst, 1e-5 * std::sqrt(static_cast<double>(K) + 1) * 4) << what;
      }
    }
  }
}

// The mean loss is a sum over rows: it must not follow the threads' partition either (in
// double, where a different order of the sum shows in the result).
TEST(Threads, CrossEntropyLossIsBitIdenticalForAnyThreadCount) {
  const int N = 1001, V = 37;
  auto run = [&](int threads) {
    Threads scope(threads);
    Rng rng(9);
    std::vector<double> logits(static_cast<size_t>(N) * V), losses(N);
    std::vector<int32_t> targets(N);
    for (auto& x : logits) x = 3 * rng.normal();
    for (auto& t : targets) t = static_cast<int32_t>(rng.below(V));
    return layers::softmax_crossentropy_forward(logits.data(), losses.data(), targets.data(), N, V);
  };
  const double one = run(1);
  for (int threads : {2, 3}) {
    const double many = run(threads);
    EXPECT_EQ(std::memcmp(&one, &many, sizeof one), 0)
        << threads << " threads: " << one << " vs " << many;
  }
}

}  // namespace
}  // namespace ddiloco
