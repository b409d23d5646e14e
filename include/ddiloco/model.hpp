// The GPT-2 decoder: shape, flat parameter buffer with named tensor views, forward and backward.
//
// Architecture (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners"):
// learned token + position embeddings, n_layer pre-LayerNorm blocks of causal multi-head
// attention and a GELU MLP of width 4·C, a final LayerNorm, and logits through the tied token
// embedding. All parameters live in ONE contiguous buffer; each tensor is a named view into it
// (names follow GPT-2/nanoGPT, per layer), which is what the syncer later splits into
// fragments of whole tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ddiloco {

/// Model shape, in GPT-2's names. Defaults: a 0.8M-parameter byte-level model.
struct GptConfig {
  int vocab_size = 256;  ///< tokens; 256 for byte-level text, 50257 for GPT-2 shards
  int seq_len = 128;     ///< maximum context (rows of the position embedding), tokens
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;  ///< channels C; must be divisible by n_head

  // Bounds that keep every size computation (4·C, B·T, ...) far from int overflow.
  static constexpr int kMaxSeqLen = 1 << 20;
  static constexpr int kMaxLayers = 4096;
  static constexpr int kMaxEmbd = 1 << 18;

  /// Throws Error("model.<key>: ...") naming the first invalid field.
  void validate() const;
  /// Bytes of parameters, gradients and AdamW moments (4 fp32 copies), plus activations for a
  /// training batch of B sequences of seq_len tokens.
  double training_bytes(int batch) const;
  /// Training FLOPs per token for forward + backward: 6·N_params + 12·n_layer·n_embd·seq_len
  /// (the PaLM estimate, Chowdhery et al. 2022, appendix B), used for MFU.
  double flops_per_token() const;
  bool operator==(const GptConfig&) const = default;
};

/// One tensor of the model: a view of `numel` elements at `offset` in the flat buffer.
struct TensorView {
  std::string name;        ///< e.g. "wte", "h.3.attn.c_attn.weight", "ln_f.bias"
  std::vector<int> shape;  ///< row-major; Linear weights are (out, in)
  size_t offset = 0;       ///< elements from the start of the flat buffer
  size_t numel = 0;
  bool weight_decay = false;  ///< AdamW decays matmul weights and embeddings, not biases/LN
  bool embedding = false;     ///< wte / wpe: merged by plain weighted mean in the syncer
};

/// Ordered list of the model's tensors and their place in the flat buffer.
class ParameterLayout {
 public:
  /// The GPT-2 layout for a shape: wte, wpe, then per layer ln_1, attn.c_attn, attn.c_proj,
  /// ln_2, mlp.c_fc, mlp.c_proj (weight then bias), then ln_f.
  static ParameterLayout gpt2(const GptConfig& config);

  const std::vector<TensorView>& tensors() const { return tensors_; }
  size_t size() const { return size_; }  ///< total elements
  /// Throws Error when no tensor has this name.
  const TensorView& at(std::string_view name) const;

 private:
  std::vector<TensorView> tensors_;
  size_t size_ = 0;
};

/// GPT-2 on CPU in scalar type S (float for training, double for gradient checks).
/// Not thread-safe: one model per rank; the kernels inside use the rank's OpenMP threads.
template <typename S>
class Gpt {
 public:
  explicit Gpt(const GptConfig& config);

  const GptConfig& config() const { return config_; }
  const ParameterLayout& layout() const { return layout_; }
  std::span<S> parameters() { return params_; }
  std::span<const S> parameters() const { return params_; }
  std::span<S> gradients() { return grads_; }
  std::span<const S> gradients() const { return grads_; }

  /// GPT-2 initialisation: weights N(0, 0.02), the two residual projections per block
  /// N(0, 0.02/√(2·n_layer)), biases 0, LayerNorm gains 1. Same seed ⇒ same weights.
  void init_weights(uint64_t seed);

  /// Forward pass on tokens(B,T) (int32 in [0, V), T ≤ seq_len, B ≥ 1). With targets(B,T)
  /// returns the mean cross-entropy in nats and keeps the activations for backward();
  /// without (nullptr) returns 0 and only the probabilities are meaningful.
  /// Activation memory grows to the largest B·T seen. Throws Error on a bad B or T.
  S forward(const int32_t* tokens, const int32_t* targets, int B, int T);
  /// Next-token probabilities (B,T,V) of the last forward pass. Throws Error after backward(),
  /// which reuses their memory for the logits' gradient.
  std::span<const S> probabilities() const;
  /// Per-position losses (B,T) of the last forward pass with targets, nats.
  std::span<const S> losses() const;

  void zero_grad();
  /// Accumulates d(mean loss)/d(parameters) of the last forward pass into gradients(). That
  /// pass must have had targets, and backward() runs once per forward pass (throws Error
  /// otherwise).
  void backward();

 private:
  struct Activations;
  void ensure_activations(int B, int T);

  GptConfig config_;
  ParameterLayout layout_;
  std::vector<S> params_;
  std::vector<S> grads_;
  std::vector<S> acts_;  // one buffer, views computed per forward
  std::vector<S> grad_acts_;
  std::vector<int32_t> tokens_, targets_;
  int last_B_ = 0, last_T_ = 0;
  // What the activation buffers hold now.
  enum class Pass { none, inference, training, backward_done } pass_ = Pass::none;
};

extern template class Gpt<float>;
extern template class Gpt<double>;

}  // namespace ddiloco
