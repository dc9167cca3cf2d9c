// Parity with transformers' DeepseekV3ForCausalLM, DeepseekV2ForCausalLM and
// Qwen2MoeForCausalLM on the fixtures scripts/make_moe_fixtures.py writes (3 layers: one
// dense, two MoE with 8 routed experts; vocab 256): MLA with and without q_lora_rank,
// interleaved and rotate-half rope, value heads narrower and wider than query heads, V3's
// sigmoid routing with the correction bias and group-limited choice, V2's softmax
// group_limited_greedy; Qwen2-MoE's softmax top-2 (normalised) with a sigmoid-gated shared
// expert, GQA with q/k/v biases, its dense layer set by mlp_only_layers.
#include <gtest/gtest.h>

#include "common/golden.h"

namespace loom {
namespace {

TEST(GoldenDeepseekV3, LogitsLossAndGradients) {
  test::check_logits_loss_grads(test::fixture_dir() / "deepseek_v3_tiny");
}

TEST(GoldenDeepseekV3, WithoutQueryLatentLogitsLossAndGradients) {
  test::check_logits_loss_grads(test::fixture_dir() / "deepseek_v3_noq_tiny");
}

TEST(GoldenDeepseekV2, LogitsLossAndGradients) {
  test::check_logits_loss_grads(test::fixture_dir() / "deepseek_v2_tiny");
}

TEST(GoldenQwen2Moe, LogitsLossAndGradients) {
  test::check_logits_loss_grads(test::fixture_dir() / "qwen2_moe_tiny");
}

}  // namespace
}  // namespace loom
