// GPT-2 forward and backward on CPU: the sequence of layer calls, the buffers between them.
#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "ddiloco/error.hpp"
#include "ddiloco/layers.hpp"
#include "ddiloco/model.hpp"
#include "ddiloco/rng.hpp"
#include "model/weights.hpp"

namespace ddiloco {

void GptConfig::validate() const {
  if (vocab_size < 2 || vocab_size > 65536)
    fail("model.vocab_size: must be in [2, 65536] (uint16 tokens), got {}", vocab_size);
  if (seq_len < 1 || seq_len > kMaxSeqLen)
    fail("model.seq_len: must be in [1, {}], got {}", kMaxSeqLen, seq_len);
  if (n_layer < 1 || n_layer > kMaxLayers)
    fail("model.n_layer: must be in [1, {}], got {}", kMaxLayers, n_layer);
  if (n_embd < 1 || n_embd > kMaxEmbd)
    fail("model.n_embd: must be in [1, {}], got {}", kMaxEmbd, n_embd);
  if (n_head < 1) fail("model.n_head: must be ≥ 1, got {}", n_head);
  if (n_embd % n_head != 0)
    fail("model.n_head: must divide model.n_embd = {}, got {}", n_embd, n_head);
}

namespace {
// ParameterLayout::gpt2(c).size() without laying out (and naming) 12 tensors per layer: the
// config's validation asks for it (training_bytes), and a model of thousands of layers made that
// check build tens of thousands of named tensors.
double parameter_count(const GptConfig& c) {
  const double V = c.vocab_size, T = c.seq_len, C = c.n_embd, L = c.n_layer;
  // wte, wpe; per block 2 LayerNorms (4C), c_attn (3C·C + 3C), c_proj (C·C + C), c_fc
  // (4C·C + 4C), mlp c_proj (4C·C + C); ln_f (2C).
  return V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
}
}  // namespace

double GptConfig::training_bytes(int batch) const {
  const double params = parameter_count(*this);
  const double N = static_cast<double>(batch) * seq_len, C = n_embd, L = n_layer;
  // Per layer: 13 (N,C)-sized activations counting the 3C/4C ones, 4 per-row statistics and
  // the attention probabilities; then embeddings, final LayerNorm, probabilities.
  const double acts = L * (N * C * 15 + 4 * N + static_cast<double>(batch) * n_head * seq_len * seq_len) +
                      N * C * 2 + N * vocab_size + 10 * N * C;
  return 4.0 * (4 * params + acts);
}

double GptConfig::flops_per_token() const {
  const double params = parameter_count(*this);
  return 6.0 * params + 12.0 * n_layer * n_embd * static_cast<double>(seq_len);
}

ParameterLayout ParameterLayout::gpt2(const GptConfig& c) {
  ParameterLayout layout;
  auto add = [&layout](std::string name, std::vector<int> shape, bool decay, bool embedding) {
    TensorView view;
    view.name = std::move(name);
    view.numel = 1;
    for (int d : shape) view.numel *= static_cast<size_t>(d);
    view.shape = std::move(shape);
    view.offset = layout.size_;
    view.weight_decay = decay;
    view.embedding = embedding;
    layout.size_ += view.numel;
    layout.tensors_.push_back(std::move(view));
  };
  const int C = c.n_embd;
  add("wte", {c.vocab_size, C}, true, true);
  add("wpe", {c.seq_len, C}, true, true);
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = fmt::format("h.{}.", l);
    add(p + "ln_1.weight", {C}, false, false);
    add(p + "ln_1.bias", {C}, false, false);
    add(p + "attn.c_attn.weight", {3 * C, C}, true, false);
    add(p + "attn.c_attn.bias", {3 * C}, false, false);
    add(p + "attn.c_proj.weight", {C, C}, true, false);
    add(p + "attn.c_proj.bias", {C}, false, false);
    add(p + "ln_2.weight", {C}, false, false);
    add(p + "ln_2.bias", {C}, false, false);
    add(p + "mlp.c_fc.weight", {4 * C, C}, true, false);
    add(p + "mlp.c_fc.bias", {4 * C}, false, false);
    add(p + "mlp.c_proj.weight", {C, 4 * C}, true, false);
    add(p + "mlp.c_proj.bias", {C}, false, false);
  }
  add("ln_f.weight", {C}, false, false);
  add("ln_f.bias", {C}, false, false);
  return layout;
}

const TensorView& ParameterLayout::at(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return t;
  fail("model has no tensor named '{}'", name);
}

namespace {

using model_views::Block;
using model_views::Weights;

}  // namespace

// Views of the activation buffer for a given (B, T); per-layer tensors are stacked by layer.
template <typename S>
struct Gpt<S>::Activations {
  S *encoded, *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *attproj, *residual2, *ln2,
      *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *fcproj, *residual3, *lnf, *lnf_mean, *lnf_rstd,
      *probs, *losses;
  size_t total = 0;

  Activations(const GptConfig& c, int B, int T, S* base) {
    const size_t L = c.n_layer, C = c.n_embd, NH = c.n_head, V = c.vocab_size;
    const size_t N = static_cast<size_t>(B) * T;
    auto take = [&](size_t n) {
      S* p = base ? base + total : nullptr;
      total += n;
      return p;
    };
    encoded = take(N * C);
    ln1 = take(L * N * C);
    ln1_mean = take(L * N);
    ln1_rstd = take(L * N);
    qkv = take(L * N * 3 * C);
    atty = take(L * N * C);
    att = take(L * B * NH * T * T);
    attproj = take(L * N * C);
    residual2 = take(L * N * C);
    ln2 = take(L * N * C);
    ln2_mean = take(L * N);
    ln2_rstd = take(L * N);
    fch = take(L * N * 4 * C);
    fch_gelu = take(L * N * 4 * C);
    fcproj = take(L * N * C);
    residual3 = take(L * N * C);
    lnf = take(N * C);
    lnf_mean = take(N);
    lnf_rstd = take(N);
    probs = take(N * V);
    losses = take(N);
  }
};

template <typename S>
Gpt<S>::Gpt(const GptConfig& config)
    : config_(config), layout_((config.validate(), ParameterLayout::gpt2(config))) {
  params_.assign(layout_.size(), S(0));
  grads_.assign(layout_.size(), S(0));
}

template <typename S>
void Gpt<S>::init_weights(uint64_t seed) {
  Rng rng(seed);
  const double residual_std = 0.02 / std::sqrt(2.0 * config_.n_layer);
  for (const auto& t : layout_.tensors()) {
    S* p = params_.data() + t.offset;
    const bool is_bias = t.name.ends_with(".bias");
    const bool is_ln = t.name.find("ln_") != std::string::npos;
    if (is_ln && !is_bias) {
      std::fill_n(p, t.numel, S(1));
    } else if (is_bias) {
      std::fill_n(p, t.numel, S(0));
    } else {
      const bool residual_proj = t.name.ends_with("c_proj.weight");
      const double std = residual_proj ? residual_std : 0.02;
      for (size_t i = 0; i < t.numel; ++i) p[i] = static_cast<S>(std * rng.normal());
    }
  }
}

template <typename S>
void Gpt<S>::ensure_activations(int B, int T) {
  // Sizes are not linear in B·T (attention is B·T²): grow to whatever this shape needs.
  const size_t need = Activations(config_, B, T, nullptr).total;
  if (need > acts_.size()) acts_.resize(need);
  const size_t N = static_cast<size_t>(B) * T, C = config_.n_embd;
  const size_t grad_need = N * C * 3 + N * 4 * C;
  if (grad_need > grad_acts_.size()) grad_acts_.resize(grad_need);
}

template <typename S>
S Gpt<S>::forward(const int32_t* tokens, const int32_t* targets, int B, int T) {
  if (B < 1) fail("forward: batch size must be ≥ 1, got {}", B);
  if (T < 1 || T > config_.seq_len)
    fail("forward: sequence length must be in [1, model.seq_len = {}], got {}", config_.seq_len,
         T);
  const int C = config_.n_embd, NH = config_.n_head, V = config_.vocab_size;
  const long N = static_cast<long>(B) * T;
  for (long i = 0; i < N; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V)
      fail("forward: token {} at position {} is outside the vocabulary [0, {})", tokens[i], i, V);
    if (targets != nullptr && (targets[i] < 0 || targets[i] >= V))
      fail("forward: target {} at position {} is outside the vocabulary [0, {})", targets[i], i,
           V);
  }
  ensure_activations(B, T);
  tokens_.assign(tokens, tokens + N);
  if (targets) targets_.assign(targets, targets + N);
  last_B_ = B;
  last_T_ = T;
  pass_ = targets != nullptr ? Pass::training : Pass::inference;

  Weights<S> w(layout_, params_.data(), config_.n_layer);
  Activations a(config_, B, T, acts_.data());
  const size_t NC = static_cast<size_t>(N) * C;

  layers::encoder_forward(a.encoded, tokens, w.wte, w.wpe, B, T, C);
  for (int l = 0; l < config_.n_layer; ++l) {
    const Block<S>& p = w.blocks[l];
    const S* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * NC;
    S* ln1 = a.ln1 + l * NC;
    S* qkv = a.qkv + l * 3 * NC;
    S* atty = a.atty + l * NC;
    S* att = a.att + static_cast<size_t>(l) * B * NH * T * T;
    S* attproj = a.attproj + l * NC;
    S* residual2 = a.residual2 + l * NC;
    S* ln2 = a.ln2 + l * NC;
    S* fch = a.fch + l * 4 * NC;
    S* fch_gelu = a.fch_gelu + l * 4 * NC;
    S* fcproj = a.fcproj + l * NC;
    S* residual3 = a.residual3 + l * NC;

    layers::layernorm_forward(ln1, a.ln1_mean + l * N, a.ln1_rstd + l * N, residual, p.ln1w,
                              p.ln1b, N, C);
    layers::matmul_forward(qkv, ln1, p.qkvw, p.qkvb, N, C, 3 * C);
    layers::attention_forward(atty, att, qkv, B, T, C, NH);
    layers::matmul_forward(attproj, atty, p.projw, p.projb, N, C, C);
    layers::residual_forward(residual2, residual, attproj, NC);
    layers::layernorm_forward(ln2, a.ln2_mean + l * N, a.ln2_rstd + l * N, residual2, p.ln2w,
                              p.ln2b, N, C);
    layers::matmul_forward(fch, ln2, p.fcw, p.fcb, N, C, 4 * C);
    layers::gelu_forward(fch_gelu, fch, 4 * NC);
    layers::matmul_forward(fcproj, fch_gelu, p.fcprojw, p.fcprojb, N, 4 * C, C);
    layers::residual_forward(residual3, residual2, fcproj, NC);
  }
  const S* last = a.residual3 + (config_.n_layer - 1) * NC;
  layers::layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, last, w.lnfw, w.lnfb, N, C);
  layers::matmul_forward(a.probs, a.lnf, w.wte, static_cast<const S*>(nullptr), N, C, V);
  if (targets == nullptr) {
    // Softmax only; the "loss" computed against token 0 is discarded.
    std::vector<int32_t> zeros(N, 0);
    layers::softmax_crossentropy_forward(a.probs, a.losses, zeros.data(), N, V);
    return S(0);
  }
  return layers::softmax_crossentropy_forward(a.probs, a.losses, targets, N, V);
}

template <typename S>
std::span<const S> Gpt<S>::probabilities() const {
  if (pass_ == Pass::none) fail("probabilities: no forward pass has run");
  if (pass_ == Pass::backward_done)
    fail("probabilities: backward() replaced them with the loss gradient; run forward() again");
  Activations a(config_, last_B_, last_T_, const_cast<S*>(acts_.data()));
  return {a.probs, static_cast<size_t>(last_B_) * last_T_ * config_.vocab_size};
}

template <typename S>
std::span<const S> Gpt<S>::losses() const {
  if (pass_ != Pass::training && pass_ != Pass::backward_done)
    fail("losses: the last forward pass had no targets");
  Activations a(config_, last_B_, last_T_, const_cast<S*>(acts_.data()));
  return {a.losses, static_cast<size_t>(last_B_) * last_T_};
}

template <typename S>
void Gpt<S>::zero_grad() {
  std::fill(grads_.begin(), grads_.end(), S(0));
}

template <typename S>
void Gpt<S>::backward() {
  if (pass_ == Pass::backward_done)
    fail("backward: already run for this forward pass; run forward() again");
  if (pass_ != Pass::training) fail("backward: the last forward pass had no targets");
  const int B = last_B_, T = last_T_;
  const int C = config_.n_embd, NH = config_.n_head, V = config_.vocab_size;
  const long N = static_cast<long>(B) * T;
  const size_t NC = static_cast<size_t>(N) * C;

  Weights<S> w(layout_, params_.data(), config_.n_layer);
  Weights<S> g(layout_, grads_.data(), config_.n_layer);
  Activations a(config_, B, T, acts_.data());
  // Gradient scratch: the residual stream, one (N,C) and one (N,3C) / (N,4C) buffer, reused
  // by every layer because each is consumed before the next layer's backward begins.
  S* dresidual = grad_acts_.data();
  S* dln = dresidual + NC;
  S* datty = dln + NC;
  S* dwide = datty + NC;  // (N,4C): dfch, also used as dqkv (N,3C)
  // The loss gradient replaces the probabilities in place: no second (N,V) buffer.
  pass_ = Pass::backward_done;

  layers::softmax_crossentropy_backward(a.probs, targets_.data(), N, V, S(1) / S(N));
  layers::matmul_backward(dln, g.wte, static_cast<S*>(nullptr), a.probs, a.lnf, w.wte, N, C, V);
  std::fill_n(dresidual, NC, S(0));
  const S* last = a.residual3 + (config_.n_layer - 1) * NC;
  layers::layernorm_backward(dresidual, g.lnfw, g.lnfb, dln, last, w.lnfw, a.lnf_mean,
                             a.lnf_rstd, N, C);

  for (int l = config_.n_layer - 1; l >= 0; --l) {
    const Block<S>& p = w.blocks[l];
    const Block<S>& d = g.blocks[l];
    const S* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * NC;
    // d(residual3) = d(residual2) + d(fcproj): the MLP branch first.
    layers::matmul_backward(dwide, d.fcprojw, d.fcprojb, dresidual, a.fch_gelu + l * 4 * NC,
                            p.fcprojw, N, 4 * C, C);
    layers::gelu_backward(dwide, a.fch + l * 4 * NC, dwide, 4 * NC);
    layers::matmul_backward(dln, d.fcw, d.fcb, dwide, a.ln2 + l * NC, p.fcw, N, C, 4 * C);
    layers::layernorm_backward(dresidual, d.ln2w, d.ln2b, dln, a.residual2 + l * NC, p.ln2w,
                               a.ln2_mean + l * N, a.ln2_rstd + l * N, N, C);
    // Attention branch.
    layers::matmul_backward(datty, d.projw, d.projb, dresidual, a.atty + l * NC, p.projw, N, C,
                            C);
    layers::attention_backward(dwide, datty, a.qkv + l * 3 * NC,
                               a.att + static_cast<size_t>(l) * B * NH * T * T, B, T, C, NH);
    layers::matmul_backward(dln, d.qkvw, d.qkvb, dwide, a.ln1 + l * NC, p.qkvw, N, C, 3 * C);
    layers::layernorm_backward(dresidual, d.ln1w, d.ln1b, dln, residual, p.ln1w,
                               a.ln1_mean + l * N, a.ln1_rstd + l * N, N, C);
  }
  layers::encoder_backward(g.wte, g.wpe, dresidual, tokens_.data(), B, T, C);
}

template class Gpt<float>;
template class Gpt<double>;

}  // namespace ddiloco
