// Config parsing: DeepSpeed's batch rule, unknown keys, overrides, schedules.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "common/test_util.h"
#include "loom/train/config.h"
#include "loom/train/trainer.h"

namespace loom {
namespace {

using nlohmann::json;

json base() {
  return {{"model", {{"arch", "gpt2"}}}, {"data", {{"path", "x.txt"}, {"seq_len", 8}}}};
}

std::string error_of(const json& j, int64_t world = 1) {
  try {
    train::parse_config(j, "cfg.json", world);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, BatchSizesDerivedByDeepSpeedRule) {
  json j = base();
  j["train_batch_size"] = 16;
  j["train_micro_batch_size_per_gpu"] = 2;
  auto c = train::parse_config(j, "cfg.json", 2);
  EXPECT_EQ(c.grad_accum, 4);
  j.erase("train_micro_batch_size_per_gpu");
  j["gradient_accumulation_steps"] = 2;
  c = train::parse_config(j, "cfg.json", 2);
  EXPECT_EQ(c.micro_batch, 4);
}

TEST(Config, InconsistentBatchSizesNameTheKeys) {
  json j = base();
  j["train_batch_size"] = 10;
  j["train_micro_batch_size_per_gpu"] = 2;
  j["gradient_accumulation_steps"] = 2;
  std::string e = error_of(j);
  EXPECT_NE(e.find("cfg.json"), std::string::npos) << e;
  EXPECT_NE(e.find("train_batch_size"), std::string::npos) << e;
  EXPECT_NE(e.find("gradient_accumulation_steps"), std::string::npos) << e;
}

TEST(Config, UnknownKeysAreErrorsNamingThePath) {
  json j = base();
  j["trian_steps"] = 3;
  EXPECT_NE(error_of(j).find("'trian_steps'"), std::string::npos);
  j = base();
  j["data"]["seqlen"] = 3;
  EXPECT_NE(error_of(j).find("'data.seqlen'"), std::string::npos);
  j = base();
  j["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"beta", 0.9}}}};
  EXPECT_NE(error_of(j).find("'optimizer.params.beta'"), std::string::npos);
  j = base();
  j["scheduler"] = {{"type", "WarmupLR"}, {"params", {{"warmup_steps", 3}}}};
  EXPECT_NE(error_of(j).find("scheduler.params.warmup_steps"), std::string::npos);
}

// DeepSpeed's monitor sections: their keys, defaults and where the files go.
TEST(Config, MonitorSections) {
  json j = base();
  j["output_dir"] = "run";
  j["tensorboard"] = {{"enabled", true}};
  j["csv_monitor"] = {{"enabled", true}, {"output_path", "logs"}, {"job_name", "sft"}};
  const train::TrainConfig c = train::parse_config(j, "cfg.json", 1);
  EXPECT_TRUE(c.tensorboard.enabled);
  EXPECT_EQ(c.tensorboard.dir(c.output_dir), std::filesystem::path("run/DeepSpeedJobName"));
  EXPECT_EQ(c.csv_monitor.dir(c.output_dir), std::filesystem::path("logs/sft"));
  j["tensorboard"]["flush_secs"] = 5;
  EXPECT_NE(error_of(j).find("unknown config key 'tensorboard.flush_secs'"), std::string::npos)
      << error_of(j);
  j = base();
  j["csv_monitor"] = {{"enabled", "yes"}};
  EXPECT_NE(error_of(j).find("'csv_monitor.enabled'"), std::string::npos) << error_of(j);
  j["csv_monitor"] = {{"enabled", true}, {"job_name", "a/b"}};
  EXPECT_NE(error_of(j).find("'csv_monitor.job_name' must be a folder name"), std::string::npos)
      << error_of(j);
  j = base();
  j["wandb"] = {{"enabled", true}};
  EXPECT_NE(error_of(j).find("unknown config key 'wandb'"), std::string::npos) << error_of(j);
}

// activation_checkpointing: Megatron's granularity / method / num_layers.
TEST(Config, ActivationCheckpointing) {
  using G = models::ActivationCheckpointing::Granularity;
  json j = base();
  EXPECT_EQ(train::parse_config(j, "c", 1).activation_checkpointing.granularity, G::none);
  j["activation_checkpointing"] = {{"granularity", "full"}};
  auto ac = train::parse_config(j, "c", 1).activation_checkpointing;
  EXPECT_EQ(ac.granularity, G::full);  // Megatron's defaults: uniform, 1 layer
  EXPECT_FALSE(ac.block_method);
  EXPECT_EQ(ac.num_layers, 1);
  j["activation_checkpointing"] = {{"granularity", "full"}, {"method", "block"}, {"num_layers", 3}};
  ac = train::parse_config(j, "c", 1).activation_checkpointing;
  EXPECT_TRUE(ac.block_method);
  EXPECT_EQ(ac.num_layers, 3);
  j["activation_checkpointing"] = {{"granularity", "selective"}};
  EXPECT_EQ(train::parse_config(j, "c", 1).activation_checkpointing.granularity, G::selective);

  auto err = [&](const json& a) {
    json k = base();
    k["activation_checkpointing"] = a;
    return error_of(k);
  };
  auto has = [](const std::string& e, const std::string& s) {
    return e.find(s) != std::string::npos;
  };
  EXPECT_TRUE(has(err(json::object()), "'activation_checkpointing.granularity' is required"));
  EXPECT_TRUE(
      has(err({{"granularity", "partial"}}),
          "'activation_checkpointing.granularity': 'partial' is not one of full, selective"));
  EXPECT_TRUE(
      has(err({{"granularity", true}}), "'activation_checkpointing.granularity' must be a string"));
  EXPECT_TRUE(has(err({{"granularity", "full"}, {"method", "random"}}),
                  "'activation_checkpointing.method': 'random' is not one of uniform, block"));
  EXPECT_TRUE(has(err({{"granularity", "full"}, {"num_layers", 0}}),
                  "'activation_checkpointing.num_layers' must be >= 1"));
  EXPECT_TRUE(has(err({{"granularity", "full"}, {"num_layers", 1.5}}),
                  "'activation_checkpointing.num_layers' must be an integer"));
  EXPECT_TRUE(has(err({{"granularity", "selective"}, {"num_layers", 2}}),
                  "'activation_checkpointing.num_layers' does not apply to granularity "
                  "\"selective\""));
  EXPECT_TRUE(has(err({{"granularity", "selective"}, {"method", "block"}}),
                  "'activation_checkpointing.method' does not apply"));
  EXPECT_TRUE(has(err({{"granularity", "full"}, {"partition_activations", true}}),
                  "unknown config key 'activation_checkpointing.partition_activations'"));
  EXPECT_TRUE(has(err("full"), "config key 'activation_checkpointing' must be a JSON object"));
}

TEST(Config, WrongTypesAreErrors) {
  json j = base();
  j["train_steps"] = "ten";
  EXPECT_NE(error_of(j).find("'train_steps' must be an integer"), std::string::npos);
}

// DeepSpeed's mixed-precision sections parse with its keys and defaults; bad ones name the key.
TEST(Config, MixedPrecisionSections) {
  json j = base();
  j["fp16"] = {{"enabled", false},         {"loss_scale", 0}, {"initial_scale_power", 12},
               {"loss_scale_window", 500}, {"hysteresis", 3}, {"consecutive_hysteresis", true},
               {"min_loss_scale", 0.5}};
  j["bf16"] = {{"enabled", false}};
  j["data_types"] = {{"grad_accum_dtype", "fp32"}};
  const train::TrainConfig c = train::parse_config(j, "cfg.json", 1);
  EXPECT_EQ(c.precision, train::TrainConfig::Precision::fp32);
  EXPECT_EQ(c.loss_scale.initial_scale_power, 12);
  EXPECT_EQ(c.loss_scale.loss_scale_window, 500);
  EXPECT_EQ(c.loss_scale.hysteresis, 3);
  EXPECT_TRUE(c.loss_scale.consecutive_hysteresis);
  EXPECT_EQ(c.loss_scale.min_loss_scale, 0.5);
  const train::TrainConfig d = train::parse_config(base(), "cfg.json", 1);  // DeepSpeed's defaults
  EXPECT_EQ(d.loss_scale.loss_scale, 0);
  EXPECT_EQ(d.loss_scale.initial_scale_power, 16);
  EXPECT_EQ(d.loss_scale.loss_scale_window, 1000);
  EXPECT_EQ(d.loss_scale.hysteresis, 2);
  EXPECT_FALSE(d.loss_scale.consecutive_hysteresis);
  EXPECT_EQ(d.loss_scale.min_loss_scale, 1);
  EXPECT_EQ(d.grad_accum_dtype, "fp32");

  j = base();
  j["fp16"] = {{"enabled", true}};
  j["bf16"] = {{"enabled", true}};
  EXPECT_NE(error_of(j).find("'bf16.enabled' and 'fp16.enabled' are both true"), std::string::npos);
  j = base();
  j["fp16"] = {{"enabled", false}, {"loss_scale_windw", 10}};
  EXPECT_NE(error_of(j).find("'fp16.loss_scale_windw'"), std::string::npos);
  j = base();
  j["bf16"] = {{"enabled", false}, {"loss_scale", 1}};
  EXPECT_NE(error_of(j).find("'bf16.loss_scale'"), std::string::npos);
  j = base();
  j["fp16"] = {{"hysteresis", 0}};
  EXPECT_NE(error_of(j).find("'fp16.hysteresis' must be >= 1"), std::string::npos);
  j = base();
  j["fp16"] = {{"min_loss_scale", 0}};
  EXPECT_NE(error_of(j).find("'fp16.min_loss_scale' must be > 0"), std::string::npos);
  j = base();
  j["data_types"] = {{"grad_accum_dtype", "fp8"}};
  EXPECT_NE(error_of(j).find("'data_types.grad_accum_dtype'"), std::string::npos);
}

TEST(Config, SetOverridesNestedKeysWithJsonValues) {
  json j = base();
  train::apply_override(j, "optimizer.params.lr=0.01");
  train::apply_override(j, "output_dir=runs/a");
  train::apply_override(j, "data.shuffle=false");
  EXPECT_DOUBLE_EQ(j["optimizer"]["params"]["lr"].get<double>(), 0.01);
  EXPECT_EQ(j["output_dir"], "runs/a");
  EXPECT_EQ(j["data"]["shuffle"], false);
  EXPECT_THROW(train::apply_override(j, "novalue"), Error);
  // A number too large for a double is not JSON to nlohmann (out_of_range): kept as text.
  train::apply_override(j, "optimizer.params.lr=1e999");
  EXPECT_EQ(j["optimizer"]["params"]["lr"], "1e999");
}

TEST(Config, NumberTooLargeForADoubleNamesTheFile) {
  test::TempDir d;
  const auto p = d.path / "big.json";
  std::ofstream(p) << R"({"model": {"arch": "gpt2"}, "train_steps": 1e999})";
  try {
    train::load_config(p, {}, 1);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p.string() + ": malformed JSON"), std::string::npos)
        << e.what();
  }
}

TEST(Schedule, DeepSpeedFormulas) {
  // WarmupLR, linear: min + (max - min) * s / W, then flat.
  auto s = optim::Schedule::from_json({{"type", "WarmupLR"},
                                       {"params",
                                        {{"warmup_min_lr", 0.0},
                                         {"warmup_max_lr", 1.0},
                                         {"warmup_num_steps", 4},
                                         {"warmup_type", "linear"}}}},
                                      1.0, 10);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(2), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(7), 1.0);
  // log warmup (DeepSpeed's default): log(s + 1) / log(W).
  s = optim::Schedule::from_json(
      {{"type", "WarmupLR"}, {"params", {{"warmup_max_lr", 2.0}, {"warmup_num_steps", 8}}}}, 1.0,
      10);
  EXPECT_NEAR(s.lr_at(3), 2.0 * std::log(4.0) / std::log(8.0), 1e-12);
  // WarmupDecayLR: linear decay to 0 at total_num_steps.
  s = optim::Schedule::from_json({{"type", "WarmupDecayLR"},
                                  {"params",
                                   {{"warmup_max_lr", 1.0},
                                    {"warmup_num_steps", 2},
                                    {"total_num_steps", 10},
                                    {"warmup_type", "linear"}}}},
                                 1.0, 10);
  EXPECT_DOUBLE_EQ(s.lr_at(6), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.0);
  // WarmupCosineLR ends at cos_min_ratio of the optimizer's lr.
  s = optim::Schedule::from_json(
      {{"type", "WarmupCosineLR"},
       {"params", {{"warmup_num_steps", 2}, {"total_num_steps", 10}, {"cos_min_ratio", 0.1}}}},
      0.5, 10);
  EXPECT_NEAR(s.lr_at(9), 0.05, 1e-12);
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

TEST(Config, ModelFromSizesForEachArch) {
  const nlohmann::json llama = {{"arch", "llama"},          {"vocab_size", 40},
                                {"hidden_size", 16},        {"intermediate_size", 24},
                                {"num_hidden_layers", 2},   {"num_attention_heads", 4},
                                {"num_key_value_heads", 2}, {"max_position_embeddings", 32}};
  auto m = train::build_model(llama, 7, "cfg.json");
  EXPECT_EQ(m->arch(), "llama");
  EXPECT_EQ(m->kv_heads(), 2);
  EXPECT_EQ(m->params().find("model.layers.1.self_attn.k_proj.weight")->shape, (Shape{8, 16}));
  EXPECT_NE(m->params().find("lm_head.weight"), nullptr);  // untied by default, as HF
  nlohmann::json qwen = llama;
  qwen["arch"] = "qwen2";
  EXPECT_NE(train::build_model(qwen, 7, "cfg.json")
                ->params()
                .find("model.layers.0.self_attn.q_proj.bias"),
            nullptr);
  auto error_of = [](const nlohmann::json& j) -> std::string {
    try {
      train::build_model(j, 7, "cfg.json");
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  nlohmann::json bad = llama;
  bad["n_embd"] = 16;  // a GPT-2 key
  EXPECT_NE(error_of(bad).find("unknown config key 'model.n_embd' for arch 'llama'"),
            std::string::npos)
      << error_of(bad);
  EXPECT_NE(error_of({{"arch", "mamba"}}).find("'model.arch'"), std::string::npos);
}

}  // namespace
}  // namespace loom
