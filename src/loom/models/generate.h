// Autoregressive generation with a KV cache. A Generator holds one conversation's cache:
// each call feeds new tokens (a prompt, or the next user turn) and samples a reply, so a
// chat never re-reads its history. Greedy when temperature is 0; otherwise temperature,
// then top-k (0: off), then top-p (1: off). Randomness comes from the counter RNG keyed by
// (seed, position), so a run is reproducible.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "loom/models/causal_lm.h"

namespace loom::models {

struct SampleOptions {
  int64_t max_new_tokens = 200;
  float temperature = 0.8f;
  int64_t top_k = 40;
  float top_p = 1.0f;
  uint64_t seed = 1234;
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these
};

class Generator {
 public:
  explicit Generator(CausalLM& model);
  // Feeds `input` after everything seen so far, then samples up to max_new_tokens (fewer
  // at a stop id or when the context is full). on_token sees each token as it is chosen.
  std::vector<int32_t> continue_with(const std::vector<int32_t>& input, const SampleOptions& opt,
                                     const std::function<void(int32_t)>& on_token = {});
  int64_t context_len() const { return cache_.len; }
  int64_t capacity() const { return cache_.capacity; }

 private:
  int32_t sample(const float* logits, const SampleOptions& opt);
  CausalLM& model_;
  KVCache cache_;
  std::vector<float> probs_;
  std::vector<int32_t> order_;
};

// One-shot: the continuation of `prompt`.
std::vector<int32_t> generate(CausalLM& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt);

}  // namespace loom::models
