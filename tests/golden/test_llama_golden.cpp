// Parity with transformers' LlamaForCausalLM (grouped K/V heads, rope_scaling llama3,
// tied embeddings) and Qwen2ForCausalLM (q/k/v biases, untied head) on the fixtures
// scripts/make_llama_fixtures.py writes (2 layers, d=64, 4 heads / 2 KV heads, vocab 256).
#include <gtest/gtest.h>

#include "common/golden.h"

namespace loom {
namespace {

TEST(GoldenLlama, LogitsLossAndGradients) {
  test::check_logits_loss_grads(test::fixture_dir() / "llama_tiny");
}

TEST(GoldenQwen2, LogitsLossAndGradients) {
  test::check_logits_loss_grads(test::fixture_dir() / "qwen2_tiny");
}

}  // namespace
}  // namespace loom
