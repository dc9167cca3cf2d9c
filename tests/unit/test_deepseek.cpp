// DeepSeek-V2/V3 beyond the golden forward/backward: what the config refuses (by key), the
// experts' load statistics, LoRA on MLA and expert projections through the trainer, and a
// save that loads back to the same logits.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "common/test_util.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/io/model_loader.h"
#include "loom/models/deepseek.h"
#include "loom/models/registry.h"
#include "loom/nn/moe.h"
#include "loom/optim/expert_balance.h"
#include "loom/train/trainer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

nlohmann::json fixture_config(const char* name) {
  return io::read_json_file(test::fixture_dir() / name / "config.json");
}

std::string refusal(nlohmann::json j, const nlohmann::json& patch) {
  j.merge_patch(patch);
  return test::error_of([&] { models::make_model(j, "config.json"); });
}

TEST(Deepseek, ConfigRefusesWhatLoomDoesNotImplementByKey) {
  const nlohmann::json v3 = fixture_config("deepseek_v3_tiny"),
                       v2 = fixture_config("deepseek_v2_tiny");
  EXPECT_NE(refusal(v3, {{"scoring_func", "softmax"}}).find("scoring_func 'softmax'"),
            std::string::npos);
  EXPECT_NE(refusal(v3, {{"topk_method", "greedy"}}).find("topk_method 'greedy'"),
            std::string::npos);
  EXPECT_NE(refusal(v2, {{"topk_method", "noaux_tc"}}).find("topk_method 'noaux_tc'"),
            std::string::npos);
  EXPECT_NE(refusal(v3, {{"n_group", 3}}).find("n_group 3 does not divide n_routed_experts 8"),
            std::string::npos);
  EXPECT_NE(refusal(v3, {{"topk_group", 5}}).find("topk_group 5 exceeds n_group 4"),
            std::string::npos);
  EXPECT_NE(refusal(v3, {{"num_key_value_heads", 2}}).find("num_key_value_heads 2"),
            std::string::npos);
  EXPECT_NE(refusal(v3, {{"num_experts_per_tok", 9}}).find("num_experts_per_tok 9"),
            std::string::npos);
  EXPECT_NE(refusal(v3, {{"rope_parameters", {{"rope_type", "dynamic"}, {"factor", 4.0}}}})
                .find("rope_scaling type 'dynamic'"),
            std::string::npos);
  EXPECT_NE(refusal(v3, {{"hidden_act", "gelu"}}).find("hidden_act 'gelu'"), std::string::npos);
  EXPECT_NO_THROW(models::make_model(v3, "config.json"));
}

// Qwen2-MoE's keys: the MoE layers follow decoder_sparse_step and mlp_only_layers, the
// shared expert and its gate are there, and what is not implemented is refused by key.
TEST(Qwen2Moe, LayersFollowTheConfigAndRefusalsNameTheKey) {
  const nlohmann::json q = fixture_config("qwen2_moe_tiny");
  auto m = models::make_model(q, "config.json");
  std::vector<int64_t> layers;
  for (const models::MoeLayer& l : m->moe_layers()) layers.push_back(l.layer);
  EXPECT_EQ(layers, (std::vector<int64_t>{0, 2}));  // mlp_only_layers [1]
  EXPECT_NE(m->params().find("model.layers.0.mlp.shared_expert_gate.weight"), nullptr);
  EXPECT_NE(m->params().find("model.layers.1.mlp.down_proj.weight"), nullptr);
  nlohmann::json step2 = q;
  step2["decoder_sparse_step"] = 2;
  step2["mlp_only_layers"] = nlohmann::json::array();
  layers.clear();
  for (const models::MoeLayer& l : models::make_model(step2, "c")->moe_layers())
    layers.push_back(l.layer);
  EXPECT_EQ(layers, (std::vector<int64_t>{1}));
  EXPECT_NE(refusal(q, {{"output_router_logits", true}}).find("'output_router_logits'"),
            std::string::npos);
  EXPECT_NE(refusal(q, {{"num_experts_per_tok", 9}}).find("'num_experts_per_tok'"),
            std::string::npos);
  EXPECT_NE(refusal(q, {{"use_sliding_window", true}}).find("use_sliding_window"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] {
              models::make_model(q, "c", nn::TensorParallel{nullptr, false, 2, 0});
            }).find("tensor_parallel.size must be 1"),
            std::string::npos);
  // Saved and read back: the same config.
  const nlohmann::json back = m->hf_config();
  for (const char* k : {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
                        "shared_expert_intermediate_size", "norm_topk_prob", "mlp_only_layers",
                        "qkv_bias", "decoder_sparse_step"})
    EXPECT_EQ(back[k], q[k]) << k;
  EXPECT_EQ(back["architectures"][0], "Qwen2MoeForCausalLM");
}

TEST(Deepseek, MoeLayersCountTokensPerExpertAndSkipMtpLayers) {
  auto model = io::load_hf_model(test::fixture_dir() / "deepseek_v3_tiny");
  auto* ds = dynamic_cast<models::Deepseek*>(model.get());
  ASSERT_NE(ds, nullptr);
  ASSERT_EQ(ds->moe_layers().size(), 2u);  // layer 0 dense (first_k_dense_replace 1)
  Tensor ids = Tensor::zeros({2, 8}, DType::I32);
  for (int64_t i = 0; i < 16; ++i) ids.i32()[i] = static_cast<int32_t>(i * 11 % 256);
  model->forward(ids);
  EXPECT_EQ(ds->moe_layers()[0].layer, 1);
  for (const models::MoeLayer& m : ds->moe_layers()) {
    int64_t total = 0;
    for (int64_t c : m.moe->router().counts()) total += c;
    EXPECT_EQ(total, 16 * 2);  // every token to top-2 experts
  }
  // A V3 checkpoint's multi-token-prediction layer (model.layers.<num_hidden_layers>) is
  // not part of the causal LM.
  EXPECT_TRUE(model->hf_ignorable("model.layers.3.eh_proj.weight"));
  EXPECT_FALSE(model->hf_ignorable("model.layers.2.mlp.gate.weight"));
}

TEST(Deepseek, SaveLoadsBackToTheSameLogits) {
  test::TempDir tmp;
  auto model = io::load_hf_model(test::fixture_dir() / "deepseek_v2_tiny");
  Tensor ids = Tensor::zeros({1, 10}, DType::I32);
  for (int64_t i = 0; i < 10; ++i) ids.i32()[i] = static_cast<int32_t>(i * 7 + 3);
  const Tensor& a = model->forward(ids);
  std::vector<float> want(a.f32(), a.f32() + a.numel());
  io::save_hf_checkpoint(*model, tmp.path / "saved");
  auto again = io::load_hf_model(tmp.path / "saved");
  const Tensor& b = again->forward(ids);
  ASSERT_EQ(b.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(b.f32()[i], want[i]) << i;
  EXPECT_EQ(io::read_json_file(tmp.path / "saved" / "config.json")["topk_method"],
            "group_limited_greedy");
}

// llama.cpp's deepseek2 layout (scripts/make_moe_fixtures.py writes the tiny V2 that
// way: experts stacked, kv_b_proj split into attn_k_b / attn_v_b, MQA-style head counts):
// the config it gives and the logits equal the safetensors folder's.
TEST(Deepseek, Deepseek2GgufLoadsAsTheSameModel) {
  const fs::path gguf = test::fixture_dir() / "gguf" / "deepseek_v2_tiny.gguf";
  const nlohmann::json c = io::read_model_config(gguf);
  EXPECT_EQ(c["model_type"], "deepseek_v2");
  EXPECT_EQ(c["topk_method"], "group_limited_greedy");
  EXPECT_EQ(c["num_key_value_heads"], c["num_attention_heads"]);
  const nlohmann::json want = fixture_config("deepseek_v2_tiny");
  for (const char* k : {"qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank",
                        "n_routed_experts", "num_experts_per_tok", "n_shared_experts",
                        "first_k_dense_replace", "n_group", "topk_group", "moe_intermediate_size"})
    EXPECT_EQ(c[k], want[k]) << k;
  auto a = io::load_model(gguf);
  auto b = io::load_hf_model(test::fixture_dir() / "deepseek_v2_tiny");
  Tensor ids = Tensor::zeros({2, 9}, DType::I32);
  for (int64_t i = 0; i < 18; ++i) ids.i32()[i] = static_cast<int32_t>(i * 13 % 256);
  const Tensor& la = a->forward(ids);
  std::vector<float> got(la.f32(), la.f32() + la.numel());
  const Tensor& lb = b->forward(ids);
  ASSERT_EQ(lb.numel(), static_cast<int64_t>(got.size()));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], lb.f32()[i]) << i;
}

// The same tiny V2 with its stacked experts quantized (gate/up Q8_0, down F16): with
// keep_quantized every expert is its own block matrix (the rows of its slice of the stacked
// tensor, bytes as stored), the logits equal the dequantized load's, and an expert-parallel
// rank reads only its slice's rows.
TEST(Deepseek, Deepseek2GgufKeepsStackedExpertsQuantized) {
  const fs::path gguf = test::fixture_dir() / "gguf" / "deepseek_v2_tiny_q8.gguf";
  auto f32 = io::load_model(gguf);
  io::LoadOptions opt;
  opt.keep_quantized = true;
  auto q = io::load_model(gguf, opt);
  for (const auto& [proj, type] :
       {std::pair{"gate_proj", GgmlType::Q8_0}, std::pair{"up_proj", GgmlType::Q8_0},
        std::pair{"down_proj", GgmlType::F16}}) {
    const std::string name = std::string("model.layers.2.mlp.experts.5.") + proj + ".weight";
    const nn::Parameter* p = q->params().find(name);
    ASSERT_NE(p, nullptr) << name;
    ASSERT_TRUE(p->quantized()) << name;
    EXPECT_EQ(p->quant->type, type) << name;
    EXPECT_EQ(p->quant->rows, p->full_shape[0]);
    EXPECT_FALSE(p->trainable);
    // Its values are the f32 load's (dequantized from the same blocks).
    std::vector<float> rows(static_cast<size_t>(p->quant->numel()));
    p->quant->dequantize_rows(0, p->quant->rows, rows.data());
    const nn::Parameter* w = f32->params().find(name);
    for (size_t i = 0; i < rows.size(); ++i) ASSERT_EQ(rows[i], w->value.f32()[i]) << name << i;
  }
  Tensor ids = Tensor::zeros({2, 9}, DType::I32);
  for (int64_t i = 0; i < 18; ++i) ids.i32()[i] = static_cast<int32_t>(i * 13 % 256);
  const Tensor& la = f32->forward(ids);
  std::vector<float> want(la.f32(), la.f32() + la.numel());
  const Tensor& lb = q->forward(ids);
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(lb.f32()[i], want[i], 1e-4f * (1.0f + std::fabs(want[i]))) << i;
  // Expert-parallel rank 1 of 2: experts 4-7 only, the same blocks.
  opt.stage.ep_size = 2;
  opt.stage.ep_rank = 1;
  auto half = io::load_model(gguf, opt);
  EXPECT_EQ(half->params().find("model.layers.2.mlp.experts.3.up_proj.weight"), nullptr);
  const nn::Parameter* a = half->params().find("model.layers.2.mlp.experts.5.up_proj.weight");
  const nn::Parameter* b = q->params().find("model.layers.2.mlp.experts.5.up_proj.weight");
  ASSERT_TRUE(a && a->quantized());
  EXPECT_EQ(a->quant->bytes, b->quant->bytes);
}

nlohmann::json train_config(const fs::path& tmp, const nlohmann::json& peft) {
  std::ofstream(tmp / "data.txt") << [] {
    std::string s;
    for (int i = 0; i < 300; ++i) s += "the quick brown fox jumps over the lazy dog. ";
    return s;
  }();
  nlohmann::json j = {{"model", (test::fixture_dir() / "deepseek_v3_tiny").string()},
                      {"data",
                       {{"path", (tmp / "data.txt").string()},
                        {"format", "text"},
                        {"tokenizer", "bytes"},
                        {"seq_len", 32}}},
                      {"train_micro_batch_size_per_gpu", 4},
                      {"gradient_accumulation_steps", 2},
                      {"train_steps", 15},
                      {"gradient_clipping", 1.0},
                      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}}}}},
                      {"output_dir", (tmp / "out").string()}};
  if (!peft.is_null()) j["peft"] = peft;
  return j;
}

std::vector<double> losses_of(const fs::path& metrics) {
  std::ifstream m(metrics);
  std::vector<double> out;
  for (std::string line; std::getline(m, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"]);
  }
  return out;
}

TEST(Deepseek, FullAndLoraFineTuningLowerTheLoss) {
  for (const nlohmann::json& peft :
       {nlohmann::json(),
        nlohmann::json{{"method", "lora"},
                       {"r", 4},
                       {"lora_alpha", 8},
                       {"target_modules",
                        {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
                         "gate_proj", "up_proj", "down_proj"}}}}) {
    test::TempDir tmp;
    train::Trainer t(train::parse_config(train_config(tmp.path, peft), "test", 1));
    const nn::Parameter* bias =
        t.model().params().find("model.layers.1.mlp.gate.e_score_correction_bias");
    ASSERT_NE(bias, nullptr);
    EXPECT_FALSE(bias->trainable);
    std::vector<float> b0(bias->value.f32(), bias->value.f32() + 8);
    t.run();
    const std::vector<double> losses = losses_of(tmp.path / "out" / "metrics.jsonl");
    ASSERT_EQ(losses.size(), 15u);
    EXPECT_LT(losses.back(), losses.front() - 0.5) << (peft.is_null() ? "full" : "lora");
    for (int i = 0; i < 8; ++i)
      EXPECT_EQ(bias->value.f32()[i], b0[i]) << "the optimizer moved the bias";
    if (!peft.is_null()) {
      // LoRA reached the MLA projections and every routed and shared expert.
      const auto& ps = t.model().params();
      for (const char* n : {"model.layers.2.self_attn.kv_b_proj.lora_A.weight",
                            "model.layers.2.self_attn.q_a_proj.lora_B.weight",
                            "model.layers.2.mlp.experts.7.down_proj.lora_A.weight",
                            "model.layers.1.mlp.shared_experts.gate_proj.lora_A.weight",
                            "model.layers.0.mlp.up_proj.lora_A.weight"})
        EXPECT_NE(ps.find(n), nullptr) << n;
      EXPECT_EQ(ps.find("model.layers.1.mlp.gate.weight.lora_A.weight"), nullptr);
    }
  }
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// V2's sequence-wise balance loss: the router's gradient of <y, R> + r * aux (r: the loss
// scale the trainer passes) against central differences, for the router weight and the
// input; and the loss changes the gradient (alpha 0 gives another).
TEST(ExpertBalance, BalanceLossGradientMatchesFiniteDifferences) {
  for (const float alpha : {0.3f, 0.0f}) {
    nn::ParamStore ps;
    nn::MoeSpec s;
    s.hidden = 6;
    s.inter = 4;
    s.n_shared = 1;
    s.router = {.hidden = 6, .n_experts = 4, .top_k = 2, .sigmoid = false, .aux_alpha = alpha};
    nn::MoE moe(ps, "model.layers.1.mlp", s, 0.5f);
    ps.materialize();
    ps.init(7);
    Tensor x = Tensor::zeros({2, 5, 6}), dx = Tensor::zeros({2, 5, 6});
    test::fill_normal(x, 3);
    nn::Scratch scratch;
    nn::Parameter* w = moe.router().weight();
    // out = [y (60 values), aux]: <out, R> = <y, R[:60]> + R[60] aux.
    auto forward = [&] {
      moe.router().set_aux_loss(0.5, 1.0);  // 2 sequences
      const Tensor& y = moe.forward(x);
      Tensor out = Tensor::zeros({y.numel() + 1});
      std::copy(y.f32(), y.f32() + y.numel(), out.f32());
      out.f32()[y.numel()] = static_cast<float>(moe.router().last_aux_loss());
      return out;
    };
    auto backward = [&](const Tensor& R) {
      forward();
      moe.router().set_aux_loss(0.5, R.f32()[60]);
      ps.zero_grads();
      dx.zero_();
      moe.backward(R.slice0(0, 60).reshape({2, 5, 6}), dx, scratch);
    };
    const double worst = test::gradcheck(
        forward, backward, {{"router weight", w->value, w->grad}, {"x", x, dx}}, 2e-2, 1e-3f);
    EXPECT_LT(worst, 2e-2) << "alpha " << alpha;
    if (alpha == 0) {
      EXPECT_EQ(moe.router().last_aux_loss(), 0.0);
      continue;
    }
    // The balance loss alone (dy = 0): its gradient per router weight element against
    // central differences of the loss (the routing stays put for so small a step).
    moe.router().set_aux_loss(0.5, 1.0);
    moe.forward(x);
    ps.zero_grads();
    dx.zero_();
    moe.backward(Tensor::zeros({2, 5, 6}), dx, scratch);
    std::vector<float> g(w->grad.f32(), w->grad.f32() + w->grad.numel());
    double worst_abs = 0, scale = 0;
    for (int64_t i = 0; i < w->value.numel(); ++i) {
      const float v = w->value.f32()[i], eps = 1e-3f;
      w->value.f32()[i] = v + eps;
      moe.forward(x);
      const double up = moe.router().last_aux_loss();
      w->value.f32()[i] = v - eps;
      moe.forward(x);
      const double down = moe.router().last_aux_loss();
      w->value.f32()[i] = v;
      worst_abs = std::max(worst_abs, std::fabs((up - down) / (2 * eps) - g[i]));
      scale = std::max(scale, std::fabs(double(g[i])));
    }
    EXPECT_GT(scale, 1e-3);
    EXPECT_LT(worst_abs, 1e-2 * scale);
  }
}

TEST(ExpertBalance, BiasMovesTowardBalanceAndCountsReset) {
  nn::ParamStore ps;
  nn::MoeSpec s;
  s.hidden = 4;
  s.inter = 2;
  s.router = {.hidden = 4, .n_experts = 4, .top_k = 1, .sigmoid = true, .score_bias = true};
  nn::MoE moe(ps, "model.layers.1.mlp", s, 0.02f);
  ps.materialize();
  std::vector<int64_t>& load = moe.router().load();
  load = {5, 1, 3, 3};  // mean 3: expert 0 over, 1 under, 2 and 3 balanced
  dist::LocalComm one;
  const std::vector<optim::ExpertLoad> r = optim::balance_experts({{1, &moe}}, one, 0.25f);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].layer, 1);
  EXPECT_EQ(r[0].min, 1);
  EXPECT_EQ(r[0].max, 5);
  EXPECT_DOUBLE_EQ(r[0].mean, 3.0);
  const float* b = moe.router().bias()->value.f32();
  EXPECT_EQ(b[0], -0.25f);
  EXPECT_EQ(b[1], 0.25f);
  EXPECT_EQ(b[2], 0.0f);
  EXPECT_EQ(b[3], 0.0f);
  EXPECT_EQ(r[0].bias_min, -0.25f);
  EXPECT_EQ(r[0].bias_max, 0.25f);
  for (int64_t c : load) EXPECT_EQ(c, 0);
}

TEST(ExpertBalance, TrainingReportsLoadsAndMovesTheBiasInSteps) {
  test::TempDir tmp;
  nlohmann::json j = train_config(tmp.path, nullptr);
  j["moe"] = {{"bias_update_rate", 0.01}};
  j["train_steps"] = 6;
  train::Trainer t(train::parse_config(j, "test", 1));
  const nn::Parameter* bias =
      t.model().params().find("model.layers.2.mlp.gate.e_score_correction_bias");
  std::vector<float> b0(bias->value.f32(), bias->value.f32() + 8);
  t.run();
  std::ifstream m(tmp.path / "out" / "metrics.jsonl");
  int rows = 0;
  for (std::string line; std::getline(m, line);) {
    auto r = nlohmann::json::parse(line);
    if (!r.contains("loss")) continue;
    ++rows;
    ASSERT_TRUE(r.contains("moe")) << line;
    EXPECT_EQ(r["moe"]["layer"], nlohmann::json({1, 2}));
    // 8 rows of 32 tokens, top-2 of 8 experts: 64 per expert on average.
    EXPECT_EQ(r["moe"]["tokens_mean"][0], 64.0);
    EXPECT_LE(r["moe"]["tokens_min"][1].get<int64_t>(), 64);
    EXPECT_GE(r["moe"]["tokens_max"][1].get<int64_t>(), 64);
  }
  EXPECT_EQ(rows, 6);
  // Six moves of +-0.01 or 0 each: the change is a multiple of the rate, at most six.
  bool moved = false;
  for (int e = 0; e < 8; ++e) {
    const double k = (bias->value.f32()[e] - b0[e]) / 0.01;
    EXPECT_NEAR(k, std::round(k), 1e-3) << e;
    EXPECT_LE(std::fabs(k), 6.0 + 1e-3) << e;
    moved |= std::fabs(k) > 0.5;
  }
  EXPECT_TRUE(moved);
  // With PEFT the bias cannot be saved: refused by name.
  j["peft"] = {{"method", "lora"}, {"r", 2}, {"target_modules", "all-linear"}};
  EXPECT_NE(test::error_of([&] {
              train::Trainer(train::parse_config(j, "test", 1));
            }).find("moe.bias_update_rate"),
            std::string::npos);
}

}  // namespace
}  // namespace loom
