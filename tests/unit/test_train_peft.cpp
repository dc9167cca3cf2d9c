// PEFT through the trainer: LoRA on a pretrained base lowers the loss, trains and keeps
// optimizer state for the adapter only, saves a PEFT adapter folder that `from_pretrained`
// continues exactly, and records its memory figures.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "common/test_util.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/io/peft_adapter.h"
#include "loom/train/trainer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

nlohmann::json lora_config(const fs::path& tmp, int steps) {
  std::ofstream(tmp / "data.txt") << [] {
    std::string s;
    for (int i = 0; i < 400; ++i) s += "the quick brown fox jumps over the lazy dog. ";
    return s;
  }();
  return {{"model", (test::fixture_dir() / "llama_tiny").string()},
          {"data",
           {{"path", (tmp / "data.txt").string()},
            {"format", "text"},
            {"tokenizer", "bytes"},
            {"seq_len", 32}}},
          {"train_micro_batch_size_per_gpu", 4},
          {"gradient_accumulation_steps", 2},
          {"train_steps", steps},
          {"gradient_clipping", 1.0},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 5e-2}}}}},
          {"peft",
           {{"method", "lora"},
            {"r", 4},
            {"lora_alpha", 8},
            {"lora_dropout", 0.1},
            {"target_modules", "all-linear"}}},
          {"output_dir", (tmp / "out").string()}};
}

TEST(TrainPeft, LoraLowersTheLossAndSavesAnAdapterThatResumes) {
  test::TempDir tmp;
  train::TrainConfig cfg = train::parse_config(lora_config(tmp.path, 20), "test", 1);
  train::Trainer t(cfg);
  const auto& ps = t.model().params();
  EXPECT_EQ(t.optimizer().state_bytes(), 8 * ps.trainable_numel());
  EXPECT_LT(ps.trainable_numel() * 10, ps.numel());
  std::vector<float> base(ps.find("model.layers.0.self_attn.q_proj.weight")->value.f32(),
                          ps.find("model.layers.0.self_attn.q_proj.weight")->value.f32() + 64);
  t.run();
  // Frozen base: untouched by 20 steps of AdamW with weight decay.
  const float* q = ps.find("model.layers.0.self_attn.q_proj.weight")->value.f32();
  for (int i = 0; i < 64; ++i) ASSERT_EQ(q[i], base[i]);
  std::ifstream m(tmp.path / "out" / "metrics.jsonl");
  std::vector<double> losses;
  nlohmann::json memory;
  for (std::string line; std::getline(m, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) losses.push_back(j["loss"]);
    if (j.contains("memory")) memory = j["memory"];
  }
  ASSERT_EQ(losses.size(), 20u);
  EXPECT_LT(losses.back(), losses.front() - 0.3) << losses.front() << " -> " << losses.back();
  EXPECT_EQ(memory["optimizer_bytes"], 8 * ps.trainable_numel());
  EXPECT_GT(memory["activations_bytes"].get<int64_t>(), 0);
  const fs::path ck = tmp.path / "out" / "checkpoint-final";
  ASSERT_TRUE(io::is_adapter_folder(ck));
  EXPECT_EQ(io::read_json_file(ck / "adapter_config.json")["peft_type"], "LORA");

  // 12 steps in one run == 8 steps, save, then 4 more from the adapter folder? Not quite:
  // AdamW's moments are not in a PEFT folder. What must hold: the folder continues from the
  // saved weights (its first loss equals this run's model on the same batch).
  nlohmann::json again = lora_config(tmp.path, 1);
  again["peft"] = {{"from_pretrained", ck.string()}};
  again["output_dir"] = (tmp.path / "out2").string();
  train::Trainer t2(train::parse_config(again, "test", 1));
  for (auto& p : t.model().params().all()) {
    if (!p->trainable) continue;
    nn::Parameter* q2 = t2.model().params().find(p->name);
    ASSERT_NE(q2, nullptr) << p->name;
    ASSERT_TRUE(q2->trainable) << p->name;
    for (int64_t i = 0; i < p->value.numel(); ++i) ASSERT_EQ(q2->value.f32()[i], p->value.f32()[i]);
  }
}

TEST(TrainPeft, ConfigErrorsNameTheKey) {
  test::TempDir tmp;
  auto err = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = lora_config(tmp.path, 1);
    edit(j);
    try {
      train::Trainer t(train::parse_config(j, "cfg.json", 1));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err([](auto& j) { j["peft"]["rank"] = 4; }).find("unknown config key 'peft.rank'"),
            std::string::npos);
  EXPECT_NE(err([](auto& j) {
              j["peft"]["num_virtual_tokens"] = 4;
            }).find("'peft.num_virtual_tokens' does not apply to method 'lora'"),
            std::string::npos);
  EXPECT_NE(err([](auto& j) { j["peft"]["method"] = "ia3"; }).find("'ia3' is not one of"),
            std::string::npos);
  EXPECT_NE(err([](auto& j) {
              j["peft"]["target_modules"] = {"qkv"};
            }).find("'qkv' match no linear layer"),
            std::string::npos);
  EXPECT_NE(err([](auto& j) { j["peft"]["lora_dropout"] = 1.0; }).find("lora_dropout"),
            std::string::npos);
  EXPECT_NE(err([](auto& j) {
              j["model"] = {{"path", j["model"]}, {"quantize", true}};
            }).find("'model.quantize'"),
            std::string::npos);
  EXPECT_NE(err([](auto& j) {
              j["model"] = {{"arch", "gpt2"}, {"n_layer", 1}, {"n_embd", 8}, {"n_head", 2}};
            }).find("pretrained base"),
            std::string::npos);
  EXPECT_EQ(err([](auto&) {}), "");
}

}  // namespace
}  // namespace loom
