// The whole GPT's gradient against finite differences, and properties of the layout.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "ddiloco/error.hpp"
#include "ddiloco/model.hpp"
#include "grad_check.hpp"

namespace ddiloco {
namespace {

GptConfig tiny() { return GptConfig{11, 6, 2, 2, 8}; }

TEST(Model, WholeModelGradientMatchesFiniteDifferences) {
  Gpt<double> model(tiny());
  model.init_weights(3);
  // Larger weights than the GPT-2 init so that every path carries signal.
  Rng rng(4);
  for (auto& p : model.parameters()) p += 0.2 * rng.normal();
  const int B = 2, T = 6;
  const std::vector<int32_t> tokens = {1, 4, 4, 9, 0, 10, 3, 3, 7, 2, 5, 8};
  const std::vector<int32_t> targets = {4, 4, 9, 0, 10, 1, 3, 7, 2, 5, 8, 6};
  model.forward(tokens.data(), targets.data(), B, T);
  model.zero_grad();
  model.backward();
  const std::vector<double> analytic(model.gradients().begin(), model.gradients().end());
  std::vector<double> params(model.parameters().begin(), model.parameters().end());
  auto loss = [&] {
    std::copy(params.begin(), params.end(), model.parameters().begin());
    return model.forward(tokens.data(), targets.data(), B, T);
  };
  test::expect_gradient(params, analytic, loss, "all parameters", 1e-7);
}

TEST(Model, GradientsAccumulateUntilZeroed) {
  Gpt<double> model(tiny());
  model.init_weights(5);
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6}, targets = {2, 3, 4, 5, 6, 7};
  model.forward(tokens.data(), targets.data(), 1, 6);
  model.zero_grad();
  model.backward();
  const std::vector<double> once(model.gradients().begin(), model.gradients().end());
  EXPECT_THROW(model.backward(), Error);           // once per forward pass
  EXPECT_THROW(model.probabilities(), Error);      // consumed by backward()
  EXPECT_EQ(model.losses().size(), 6u);            // still there
  model.forward(tokens.data(), targets.data(), 1, 6);
  model.backward();
  for (size_t i = 0; i < once.size(); ++i) ASSERT_NEAR(model.gradients()[i], 2 * once[i], 1e-12);
}

TEST(Model, LayoutCoversBufferWithoutOverlap) {
  const GptConfig c{256, 128, 3, 4, 64};
  const auto layout = ParameterLayout::gpt2(c);
  size_t expected_offset = 0;
  std::set<std::string> names;
  for (const auto& t : layout.tensors()) {
    EXPECT_EQ(t.offset, expected_offset) << t.name;
    expected_offset += t.numel;
    EXPECT_TRUE(names.insert(t.name).second) << "duplicate " << t.name;
  }
  EXPECT_EQ(layout.size(), expected_offset);
  EXPECT_EQ(layout.tensors().size(), 2u + 12u * 3 + 2u);
  // GPT-2 parameter count: V·C + T·C + L·(12C² + 13C) + 2C.
  const size_t C = 64, L = 3;
  EXPECT_EQ(layout.size(), 256 * C + 128 * C + L * (12 * C * C + 13 * C) + 2 * C);
  EXPECT_TRUE(layout.at("wte").embedding);
  EXPECT_TRUE(layout.at("h.2.mlp.c_fc.weight").weight_decay);
  EXPECT_FALSE(layout.at("h.0.ln_1.weight").weight_decay);
  EXPECT_FALSE(layout.at("ln_f.bias").weight_decay);
  EXPECT_THROW(layout.at("h.3.ln_1.weight"), Error);
}

// training_bytes and flops_per_token count the parameters without building the layout (the
// config's validation calls training_bytes); the count is the layout's, to the element.
TEST(Model, SizesCountTheLayoutsParameters) {
  for (const GptConfig& c : {GptConfig{256, 128, 3, 4, 64}, GptConfig{50257, 1024, 12, 12, 768},
                             GptConfig{2, 1, 1, 1, 1}, GptConfig{65536, 7, 4096, 3, 9}}) {
    const double params = static_cast<double>(ParameterLayout::gpt2(c).size());
    EXPECT_DOUBLE_EQ(c.flops_per_token(), 6.0 * params + 12.0 * c.n_layer * c.n_embd * c.seq_len);
    const double batch = 3, N = batch * c.seq_len, C = c.n_embd, L = c.n_layer;
    const double acts = L * (N * C * 15 + 4 * N + batch * c.n_head * c.seq_len * c.seq_len) +
                        N * C * 2 + N * c.vocab_size + 10 * N * C;
    EXPECT_DOUBLE_EQ(c.training_bytes(3), 4.0 * (4 * params + acts));
  }
}

TEST(Model, InitIsDeterministicAndGpt2Shaped) {
  const GptConfig c{256, 32, 2, 2, 32};
  Gpt<float> a(c), b(c), other(c);
  a.init_weights(42);
  b.init_weights(42);
  other.init_weights(43);
  EXPECT_TRUE(std::equal(a.parameters().begin(), a.parameters().end(), b.parameters().begin()));
  EXPECT_FALSE(
      std::equal(a.parameters().begin(), a.parameters().end(), other.parameters().begin()));
  const auto& ln = a.layout().at("h.1.ln_2.weight");
  for (size_t i = 0; i < ln.numel; ++i) EXPECT_EQ(a.parameters()[ln.offset + i], 1.0f);
  const auto& wte = a.layout().at("wte");
  double sq = 0;
  for (size_t i = 0; i < wte.numel; ++i) sq += std::pow(a.parameters()[wte.offset + i], 2);
  EXPECT_NEAR(std::sqrt(sq / wte.numel), 0.02, 0.002);
}

TEST(Model, FreshModelPredictsNearUniform) {
  Gpt<float> model(GptConfig{256, 16, 2, 2, 32});
  model.init_weights(1);
  std::vector<int32_t> tokens(16), targets(16);
  for (int i = 0; i < 16; ++i) {
    tokens[i] = (i * 37) % 256;
    targets[i] = (i * 101 + 7) % 256;  // not the input token: the tied embedding favours that
  }
  const float loss = model.forward(tokens.data(), targets.data(), 1, 16);
  EXPECT_NEAR(loss, std::log(256.0), 0.1);
}

TEST(Model, RejectsBadShapesAndTokens) {
  EXPECT_THROW(Gpt<float>(GptConfig{256, 16, 2, 3, 32}), Error);  // 3 heads do not divide 32
  Gpt<float> model(GptConfig{10, 4, 1, 1, 4});
  const std::vector<int32_t> ok = {1, 2, 3}, bad = {1, 10, 3};
  EXPECT_THROW(model.forward(ok.data(), ok.data(), 1, 5), Error);   // T > seq_len
  EXPECT_THROW(model.forward(bad.data(), ok.data(), 1, 3), Error);  // token ≥ vocab
  EXPECT_THROW(model.backward(), Error);                            // no forward yet
}

}  // namespace
}  // namespace ddiloco
