#include "ddiloco/sampler.hpp"

#include <algorithm>
#include <cmath>

#include "ddiloco/corpus.hpp"
#include "ddiloco/error.hpp"

namespace ddiloco {

int32_t end_of_text_token(int vocab_size) {
  return vocab_size == 50257 ? 50256 : kByteEndOfText;
}

std::vector<int32_t> encode_prompt(const std::string& text, int vocab_size) {
  std::vector<int32_t> tokens{end_of_text_token(vocab_size)};
  if (vocab_size == 256) {
    check_text(text, "--prompt", "byte-level models take UTF-8 text");
    for (unsigned char c : text) tokens.push_back(c);
  }
  return tokens;
}

std::vector<int32_t> generate(Gpt<float>& model, std::vector<int32_t> context, int n,
                              double temperature, Rng& rng) {
  const int V = model.config().vocab_size;
  const int T_max = model.config().seq_len;
  if (context.empty()) context.push_back(end_of_text_token(V));
  std::vector<int32_t> generated;
  std::vector<double> weights(V);
  for (int i = 0; i < n; ++i) {
    const int T = std::min<int>(T_max, static_cast<int>(context.size()));
    const int32_t* window = context.data() + context.size() - T;
    model.forward(window, nullptr, 1, T);
    const float* probs = model.probabilities().data() + static_cast<size_t>(T - 1) * V;
    int32_t next = 0;
    if (temperature <= 0) {
      next = static_cast<int32_t>(std::max_element(probs, probs + V) - probs);
    } else {
      // softmax(logits/τ) ∝ p^(1/τ) = exp((log p − log p_max)/τ): relative to the most likely
      // token so that small τ does not underflow every weight to 0.
      const double log_max = std::log(static_cast<double>(*std::max_element(probs, probs + V)));
      double total = 0;
      for (int v = 0; v < V; ++v) {
        const double lp = probs[v] > 0 ? std::log(static_cast<double>(probs[v])) : -INFINITY;
        total += weights[v] = std::exp((lp - log_max) / temperature);
      }
      double u = rng.uniform() * total;
      next = V - 1;
      for (int v = 0; v < V; ++v) {
        u -= weights[v];
        if (u < 0) {
          next = v;
          break;
        }
      }
    }
    context.push_back(next);
    generated.push_back(next);
  }
  return generated;
}

std::string detokenize(const std::vector<int32_t>& tokens, int vocab_size) {
  if (vocab_size == 256) return decode_bytes(tokens);
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) out += ' ';
    out += std::to_string(tokens[i]);
  }
  return out;
}

}  // namespace ddiloco
