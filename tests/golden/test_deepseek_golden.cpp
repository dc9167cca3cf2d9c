// Parity with transformers' DeepseekV3ForCausalLM and DeepseekV2ForCausalLM on the fixtures
// scripts/make_deepseek_fixtures.py writes (3 layers: one dense, two MoE with 8 routed
// experts; vocab 256): MLA with and without q_lora_rank, interleaved and rotate-half rope,
// value heads narrower and wider than query heads, V3's sigmoid routing with the correction
// bias and group-limited choice, V2's softmax group_limited_greedy.
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

}  // namespace
}  // namespace loom
