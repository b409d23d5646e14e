// Every layer's backward against central finite differences, in double precision.
#include <gtest/gtest.h>

#include "ddiloco/layers.hpp"
#include "grad_check.hpp"

namespace ddiloco {
namespace {

using test::expect_gradient;
using test::project;
using test::random_vector;

TEST(Layers, EncoderBackward) {
  const int B = 2, T = 5, C = 6, V = 7;
  std::vector<int32_t> tokens = {1, 3, 3, 0, 6, 2, 2, 5, 1, 3};
  auto wte = random_vector(V * C, 1), wpe = random_vector(T * C, 2);
  const auto r = random_vector(B * T * C, 3);
  std::vector<double> out(B * T * C);
  auto loss = [&] {
    layers::encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return project(out, r);
  };
  std::vector<double> dwte(V * C, 0), dwpe(T * C, 0);
  layers::encoder_backward(dwte.data(), dwpe.data(), r.data(), tokens.data(), B, T, C);
  expect_gradient(wte, dwte, loss, "dwte");
  expect_gradient(wpe, dwpe, loss, "dwpe");
}

TEST(Layers, LayerNormBackward) {
  const int N = 7, C = 10;
  auto inp = random_vector(N * C, 4, 2.0), w = random_vector(C, 5), b = random_vector(C, 6);
  const auto r = random_vector(N * C, 7);
  std::vector<double> out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    layers::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(),
                              b.data(), N, C);
    return project(out, r);
  };
  loss();
  // dinp accumulates: start from a known offset and subtract it afterwards.
  std::vector<double> dinp(N * C, 0.5), dw(C, 0), db(C, 0);
  layers::layernorm_backward(dinp.data(), dw.data(), db.data(), r.data(), inp.data(), w.data(),
                             mean.data(), rstd.data(), N, C);
  for (auto& x : dinp) x -= 0.5;
  expect_gradient(inp, dinp, loss, "dinp");
  expect_gradient(w, dw, loss, "dw");
  expect_gradient(b, db, loss, "db");
}

TEST(Layers, MatmulBackward) {
  const int N = 6, IN = 5, OUT = 4;
  auto inp = random_vector(N * IN, 8), w = random_vector(OUT * IN, 9), bias = random_vector(OUT, 10);
  const auto r = random_vector(N * OUT, 11);
  std::vector<double> out(N * OUT);
  auto loss = [&] {
    layers::matmul_forward(out.data(), inp.data(), w.data(), bias.data(), N, IN, OUT);
    return project(out, r);
  };
  std::vector<double> dinp(N * IN, 9.0), dw(OUT * IN, 0), dbias(OUT, 0);  // dinp overwritten
  layers::matmul_backward(dinp.data(), dw.data(), dbias.data(), r.data(), inp.data(), w.data(),
                          N, IN, OUT);
  expect_gradient(inp, dinp, loss, "dinp");
  expect_gradient(w, dw, loss, "dw");
  expect_gradient(bias, dbias, loss, "dbias");
}

TEST(Layers, MatmulForwardMatchesNaive) {
  const int N = 3, IN = 4, OUT = 2;
  const auto inp = random_vector(N * IN, 12), w = random_vector(OUT * IN, 13);
  std::vector<double> out(N * OUT);
  layers::matmul_forward(out.data(), inp.data(), w.data(), static_cast<const double*>(nullptr),
                         N, IN, OUT);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OUT; ++o) {
      double s = 0;
      for (int i = 0; i < IN; ++i) s += inp[n * IN + i] * w[o * IN + i];
      EXPECT_NEAR(out[n * OUT + o], s, 1e-12);
    }
}

// Attention with T spanning two query blocks (block = 64 rows) and T inside one block.
class AttentionBackward : public ::testing::TestWithParam<int> {};

TEST_P(AttentionBackward, MatchesFiniteDifferences) {
  const int B = 2, T = GetParam(), C = 8, NH = 2;
  auto qkv = random_vector(B * T * 3 * C, 14);
  const auto r = random_vector(B * T * C, 15);
  std::vector<double> out(B * T * C), att(B * NH * T * T);
  auto loss = [&] {
    layers::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    return project(out, r);
  };
  loss();
  std::vector<double> dqkv(qkv.size(), 3.0);
  layers::attention_backward(dqkv.data(), r.data(), qkv.data(), att.data(), B, T, C, NH);
  expect_gradient(qkv, dqkv, loss, "dqkv");
}

INSTANTIATE_TEST_SUITE_P(SeqLens, AttentionBackward, ::testing::Values(1, 5, 70));

TEST(Layers, AttentionIsCausalAndNormalised) {
  const int B = 1, T = 66, C = 4, NH = 1;
  const auto qkv = random_vector(B * T * 3 * C, 16);
  std::vector<double> out(B * T * C), att(T * T);
  layers::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int t = 0; t < T; ++t) {
    double s = 0;
    for (int j = 0; j < T; ++j) {
      if (j > t) {
        EXPECT_EQ(att[t * T + j], 0.0);
      }
      s += att[t * T + j];
    }
    EXPECT_NEAR(s, 1.0, 1e-12);
  }
  // Position 0 attends only to itself: its output is its own V.
  for (int c = 0; c < C; ++c) EXPECT_NEAR(out[c], qkv[2 * C + c], 1e-12);
}

TEST(Layers, GeluBackward) {
  auto inp = random_vector(50, 17, 2.0);
  const auto r = random_vector(50, 18);
  std::vector<double> out(50);
  auto loss = [&] {
    layers::gelu_forward(out.data(), inp.data(), 50);
    return project(out, r);
  };
  std::vector<double> dinp(50);
  layers::gelu_backward(dinp.data(), inp.data(), r.data(), 50);
  expect_gradient(inp, dinp, loss, "dinp");
}

TEST(Layers, SoftmaxCrossEntropyBackward) {
  const int N = 5, V = 9;
  auto logits = random_vector(N * V, 19, 3.0);
  const std::vector<int32_t> targets = {0, 8, 3, 3, 5};
  std::vector<double> work(N * V), losses(N);
  auto loss = [&] {
    work = logits;
    return layers::softmax_crossentropy_forward(work.data(), losses.data(), targets.data(), N, V);
  };
  loss();
  layers::softmax_crossentropy_backward(work.data(), targets.data(), N, V, 1.0 / N);
  const std::vector<double> dlogits = work;  // loss() below overwrites work
  expect_gradient(logits, dlogits, loss, "dlogits");
}

TEST(Layers, CrossEntropyOfUniformLogitsIsLogV) {
  const int N = 3, V = 256;
  std::vector<float> logits(N * V, 0.25f), losses(N);
  const std::vector<int32_t> targets = {0, 100, 255};
  const float mean =
      layers::softmax_crossentropy_forward(logits.data(), losses.data(), targets.data(), N, V);
  EXPECT_NEAR(mean, std::log(256.0), 1e-5);
}

}  // namespace
}  // namespace ddiloco
