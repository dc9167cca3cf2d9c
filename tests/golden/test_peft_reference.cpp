// The other direction of PEFT parity: adapter folders that Loom writes after training load
// with peft.PeftModel.from_pretrained on the transformers base model and give Loom's logits
// (scripts/check_peft_adapter.py). Needs the reference environment (torch, transformers,
// peft: scripts/ref_venv.sh); skipped where it is absent, as in CI.
#include <gtest/gtest.h>

#include <fstream>

#include "common/ref_python.h"
#include "common/test_util.h"
#include "loom/io/peft_adapter.h"
#include "loom/train/trainer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using test::ref_python;

// Trains a few steps of `peft` on a tiny base (bytes of a short text) and checks the folder
// (`flags`: check_peft_adapter.py's, e.g. --merge).
void train_and_check(const std::string& base, const nlohmann::json& peft,
                     const std::string& flags = "") {
  if (!fs::exists(ref_python())) GTEST_SKIP() << ref_python() << " absent (scripts/ref_venv.sh)";
  test::TempDir tmp;
  std::string text;
  for (int i = 0; i < 200; ++i) text += "loom trains adapters; peft loads them. ";
  std::ofstream(tmp.path / "data.txt") << text;
  const fs::path base_dir = test::fixture_dir() / base;
  nlohmann::json j = {{"model", base_dir.string()},
                      {"data",
                       {{"path", (tmp.path / "data.txt").string()},
                        {"format", "text"},
                        {"tokenizer", "bytes"},
                        {"seq_len", 12}}},
                      {"train_micro_batch_size_per_gpu", 4},
                      {"train_steps", 5},
                      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 2e-2}}}}},
                      {"peft", peft},
                      {"output_dir", (tmp.path / "out").string()}};
  train::Trainer t(train::parse_config(j, "test", 1));
  t.run();
  const fs::path ck = tmp.path / "out" / "checkpoint-final";
  ASSERT_TRUE(io::is_adapter_folder(ck));
  auto [code, out] = test::run_command(
      ref_python().string() + " " +
      (test::source_dir() / "scripts" / "check_peft_adapter.py").string() + " " + ck.string() +
      " " + base_dir.string() + " --loom " + test::loom_binary() + " --len 12 " + flags);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("check_peft_adapter: OK"), std::string::npos) << out;
}

TEST(PeftReference, LoraOnLlamaLoadsInPeft) {
  train_and_check(
      "llama_tiny",
      {{"method", "lora"}, {"r", 4}, {"lora_alpha", 8}, {"target_modules", "all-linear"}});
}

TEST(PeftReference, LoraOnGpt2WithModulesToSaveLoadsInPeft) {
  train_and_check("gpt2_tiny", {{"method", "lora"},
                                {"r", 2},
                                {"target_modules", {"c_attn", "c_fc"}},
                                {"modules_to_save", {"ln_f"}},
                                {"bias", "all"}});
}

// MLA's projections load in PEFT.
TEST(PeftReference, LoraOnDeepseekV3LoadsInPeft) {
  train_and_check(
      "deepseek_v3_tiny",
      {{"method", "lora"},
       {"r", 4},
       {"lora_alpha", 8},
       {"target_modules", {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"}}});
}

// The routed experts' LoRA loads in PEFT too: transformers 5 holds the experts fused
// ([E, 2I, C] gate_up_proj, [E, C, I] down_proj) and PEFT 0.21 converts the per-expert pairs
// into them (gate/up block-diagonal at rank 2r). PEFT maps the leaf names gate_proj /
// up_proj / down_proj to those fused parameters for the whole model, so it drops the LoRA of
// DeepSeek's dense-layer MLP and shared experts, which carry the same leaf names (checked by
// hand: PeftModel's logits then equal the base with only the expert pairs merged). A regex
// that names the experts (its optional index is what lets PEFT find the fused parameter)
// targets exactly what PEFT can load.
TEST(PeftReference, LoraOnDeepseekV3ExpertsLoadsInPeft) {
  train_and_check(
      "deepseek_v3_tiny",
      {{"method", "lora"},
       {"r", 4},
       {"lora_alpha", 8},
       {"target_modules",
        R"(.*\.(self_attn\.(q_a_proj|kv_b_proj|o_proj)|mlp\.experts(\.\d+)?\.(gate_proj|up_proj|down_proj)))"}});
}

// Every linear layer (dense and shared MLPs too), against the pairs merged into
// transformers' tensors by hand (--merge), since PeftModel drops the dense MLPs' (above).
TEST(PeftReference, LoraOnDeepseekV3EveryLinearEqualsMergedWeights) {
  train_and_check(
      "deepseek_v3_tiny",
      {{"method", "lora"}, {"r", 4}, {"lora_alpha", 8}, {"target_modules", "all-linear"}},
      "--merge");
}

// Qwen2-MoE, every linear layer (routed experts, the shared expert and its gate) against
// the pairs merged by hand: PEFT 0.21.2 has no conversion of per-expert pairs for
// qwen2_moe on transformers 5 (its adapter's expert weights are ignored there).
TEST(PeftReference, LoraOnQwen2MoeEveryLinearEqualsMergedWeights) {
  train_and_check(
      "qwen2_moe_tiny",
      {{"method", "lora"}, {"r", 4}, {"lora_alpha", 8}, {"target_modules", "all-linear"}},
      "--merge");
}

TEST(PeftReference, PrefixOnLlamaLoadsInPeft) {
  train_and_check("llama_tiny",
                  {{"method", "prefix"}, {"num_virtual_tokens", 4}, {"prefix_projection", true}});
}

}  // namespace
}  // namespace loom
