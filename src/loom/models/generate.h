// Autoregressive sampling from a CausalLM without a KV cache: each new token re-runs the
// forward over the last max_positions tokens. Temperature 0 means greedy; top_k 0 means
// the whole vocabulary. Randomness comes from the counter RNG keyed by (seed, position).
#pragma once

#include <cstdint>
#include <vector>

#include "loom/models/causal_lm.h"

namespace loom::models {

struct SampleOptions {
  int64_t max_new_tokens = 200;
  float temperature = 0.8f;
  int64_t top_k = 40;
  uint64_t seed = 1234;
};

std::vector<int32_t> generate(CausalLM& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt);

}  // namespace loom::models
