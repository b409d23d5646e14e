// Text generation from a trained model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ddiloco/model.hpp"
#include "ddiloco/rng.hpp"

namespace ddiloco {

/// The token that starts a document for a vocabulary: 0 for byte-level (256), GPT-2's
/// <|endoftext|> 50256 for 50257.
int32_t end_of_text_token(int vocab_size);

/// Prompt tokens: the bytes of `text` (byte-level models) after an end-of-text token; for
/// other vocabularies only the end-of-text token (we have no BPE encoder). Throws Error when
/// a byte-level prompt is not valid UTF-8.
std::vector<int32_t> encode_prompt(const std::string& text, int vocab_size);

/// Appends n sampled tokens to `context` and returns them. Each step runs the model on the
/// last seq_len tokens and draws from softmax(logits / temperature) (argmax when temperature
/// is 0). Deterministic for a given Rng state.
std::vector<int32_t> generate(Gpt<float>& model, std::vector<int32_t> context, int n,
                              double temperature, Rng& rng);

/// Human-readable text of tokens: UTF-8 for byte-level models, space-separated ids otherwise.
std::string detokenize(const std::vector<int32_t>& tokens, int vocab_size);

}  // namespace ddiloco
