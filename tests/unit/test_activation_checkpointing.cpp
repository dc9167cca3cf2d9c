// Activation checkpointing (models/causal_lm.h): one training step of tiny GPT-2 and Llama
// models, with and without it, must give the same loss and the same gradient of every
// parameter, bit for bit (the recompute repeats the forward exactly, LoRA's dropout masks
// included); the released tensors must really be gone after the forward; and the recompute
// must run inside the backward's unit scopes, never firing a forward's hooks again.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/models/gpt2.h"
#include "loom/models/llama.h"
#include "loom/models/peft.h"
#include "loom/models/registry.h"
#include "loom/tensor/rng.h"

namespace loom {
namespace {

using AC = models::ActivationCheckpointing;
using G = AC::Granularity;

AC full(int64_t n, bool block = false) { return {G::full, block, n}; }
AC selective() { return {G::selective, false, 1}; }

nlohmann::json gpt2_config() {
  return {{"model_type", "gpt2"}, {"vocab_size", 29}, {"n_positions", 16},
          {"n_embd", 16},         {"n_layer", 3},     {"n_head", 4}};
}

nlohmann::json llama_config() {
  return {{"model_type", "llama"},
          {"vocab_size", 23},
          {"hidden_size", 8},
          {"intermediate_size", 12},
          {"num_hidden_layers", 3},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"max_position_embeddings", 24},
          {"tie_word_embeddings", false},
          {"attention_bias", true}};
}

std::unique_ptr<models::CausalLM> make(const std::string& arch, const models::PeftConfig& peft) {
  std::unique_ptr<models::CausalLM> m;
  if (arch == "gpt2")
    m = std::make_unique<models::GPT2>(models::GPT2Config::from_hf(gpt2_config(), "test"));
  else if (arch == "deepseek")  // MLA, one dense and two MoE layers (routing, shared experts)
    m = models::make_model(
        io::read_json_file(test::fixture_dir() / "deepseek_v3_tiny" / "config.json"), "test");
  else
    m = std::make_unique<models::Llama>(models::LlamaConfig::from_hf(llama_config(), "test"));
  if (peft.enabled()) models::apply_peft(*m, peft, 1);
  // Every value nonzero (LoRA's B too, so its branch and dropout reach every gradient).
  for (auto& p : m->params().all()) {
    test::fill_normal(p->value, stream_id(p->name) % 100000, 0.3f);
    if (p->kind == nn::ParamKind::Norm && p->name.find("bias") == std::string::npos)
      for (int64_t i = 0; i < p->value.numel(); ++i) p->value.f32()[i] += 1.0f;
  }
  return m;
}

models::PeftConfig lora(float dropout) {
  models::PeftConfig c;
  c.method = "lora";
  c.lora = {2, 4.0f, false, dropout};
  c.target_regex = "all-linear";
  c.bias = "lora_only";
  return c;
}

models::PeftConfig adapters() {
  models::PeftConfig c;
  c.method = "adapter";
  c.adapter.bottleneck = 3;
  return c;
}

models::PeftConfig prefix() {
  models::PeftConfig c;
  c.method = "prefix";
  c.num_virtual_tokens = 2;
  c.prefix_projection = true;
  c.encoder_hidden_size = 5;
  return c;
}

struct Step {
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;  // every trainable parameter's
  int64_t live_after_forward = 0;                   // owned storage bytes
};

// Two micro-batches (forward, backward each; gradients accumulate) of [2, 8] rows, packed
// (two samples a row) when asked, dropout on as the trainer sets it.
Step train_step(models::CausalLM& m, const AC& ac, bool packed = false) {
  m.set_activation_checkpointing(ac);
  m.params().zero_grads();
  const int64_t B = 2, T = 8, V = m.vocab_size();
  Step s;
  for (int micro = 0; micro < 2; ++micro) {
    Tensor ids = Tensor::zeros({B, T}, DType::I32), tg = Tensor::zeros({B, T}, DType::I32);
    Tensor pos = packed ? Tensor::zeros({B, T}, DType::I32) : Tensor();
    for (int64_t i = 0; i < B * T; ++i) {
      ids.i32()[i] = static_cast<int32_t>((i * 7 + 3 + micro) % V);
      tg.i32()[i] = i % 5 == 4 ? kernels::kIgnoreIndex : static_cast<int32_t>((i * 3 + 1) % V);
      if (packed) pos.i32()[i] = static_cast<int32_t>(i % T < 3 ? i % T : i % T - 3);
    }
    m.dropout() = {true, 7, 3, micro * B * T};
    m.forward(ids, pos);
    s.live_after_forward = storage_stats().live_bytes;
    s.loss += m.backward(tg, 1.0f / 13);
  }
  m.dropout().training = false;
  for (auto& p : m.params().all())
    if (p->trainable) s.grads[p->name].assign(p->grad.f32(), p->grad.f32() + p->grad.numel());
  return s;
}

void expect_bitwise(const Step& want, const Step& got, const std::string& what) {
  EXPECT_EQ(std::memcmp(&want.loss, &got.loss, sizeof(double)), 0)
      << what << ": loss " << want.loss << " vs " << got.loss;
  ASSERT_EQ(want.grads.size(), got.grads.size()) << what;
  for (const auto& [name, g] : want.grads) {
    const std::vector<float>& h = got.grads.at(name);
    ASSERT_EQ(g.size(), h.size()) << what << ": " << name;
    EXPECT_EQ(std::memcmp(g.data(), h.data(), g.size() * sizeof(float)), 0)
        << what << ": gradient of " << name << " differs (e.g. first element " << g[0] << " vs "
        << h[0] << ")";
  }
}

// Every setting against none, each on a fresh model built the same way.
void check_all_settings(const std::string& arch, const models::PeftConfig& peft,
                        bool packed = false) {
  const Step ref = train_step(*make(arch, peft), AC{}, packed);
  ASSERT_FALSE(ref.grads.empty());
  const std::vector<std::pair<std::string, AC>> cases = {{"full uniform 1", full(1)},
                                                         {"full uniform 2", full(2)},
                                                         {"full uniform 3", full(3)},
                                                         {"full block 2", full(2, true)},
                                                         {"selective", selective()}};
  for (const auto& [name, ac] : cases) {
    auto m = make(arch, peft);
    expect_bitwise(ref, train_step(*m, ac, packed), arch + " " + peft.method + " " + name);
    // The same model again: buffers released by the last step are allocated anew.
    expect_bitwise(ref, train_step(*m, ac, packed), arch + " " + name + ", second step");
  }
  // Switching on a model that ran without (its buffers then still allocated).
  auto m = make(arch, peft);
  train_step(*m, AC{}, packed);
  expect_bitwise(ref, train_step(*m, full(2), packed), arch + " switched to full");
}

TEST(ActivationCheckpointing, Gpt2GradientsBitwiseEqual) { check_all_settings("gpt2", {}); }
TEST(ActivationCheckpointing, LlamaGradientsBitwiseEqual) { check_all_settings("llama", {}); }
TEST(ActivationCheckpointing, Gpt2LoraDropoutBitwiseEqual) {
  check_all_settings("gpt2", lora(0.1f));
}
TEST(ActivationCheckpointing, LlamaLoraDropoutPackedBitwiseEqual) {
  check_all_settings("llama", lora(0.1f), /*packed=*/true);
}
TEST(ActivationCheckpointing, DeepseekGradientsBitwiseEqual) { check_all_settings("deepseek", {}); }
TEST(ActivationCheckpointing, DeepseekLoraDropoutPackedBitwiseEqual) {
  check_all_settings("deepseek", lora(0.1f), /*packed=*/true);
}
TEST(ActivationCheckpointing, AdaptersAndPrefixBitwiseEqual) {
  check_all_settings("gpt2", adapters());
  check_all_settings("llama", prefix(), /*packed=*/true);
}

// What the forward leaves allocated: selective the same as none (attention keeps no
// probabilities to free, only their [B, H, T] log-sum-exp); full frees far more, and the
// estimate falls with it.
// Evaluation through the chunked head (training's default) runs only the rows with a target,
// gathered into chunks that cross sequences: each sequence's loss sum equals the whole
// head's, a sequence without targets sums to 0, for chunks smaller and larger than a row.
TEST(ActivationCheckpointing, ChunkedHeadEvaluationSumsEqualTheWholeHeads) {
  const int64_t B = 3, T = 8;
  auto m = make("llama", {});
  const int64_t V = m->vocab_size();
  Tensor ids = Tensor::zeros({B, T}, DType::I32), tg = Tensor::zeros({B, T}, DType::I32);
  for (int64_t i = 0; i < B * T; ++i) {
    ids.i32()[i] = static_cast<int32_t>((i * 7 + 3) % V);
    const int64_t b = i / T, t = i % T;
    const bool target = b == 0 ? i % 5 != 4 : b == 2 && t >= T - 3;  // row 1: none
    tg.i32()[i] = target ? static_cast<int32_t>((i * 3 + 1) % V) : kernels::kIgnoreIndex;
  }
  std::vector<double> want(B), got(B);
  m->set_activation_checkpointing(AC{});
  m->forward(ids, Tensor());
  m->loss_sums(tg, want.data());
  EXPECT_GT(want[0], 0.0);
  EXPECT_EQ(want[1], 0.0);
  for (const int64_t rows : {1, 5, 64}) {
    AC ac;
    ac.loss_chunk_rows = rows;
    m->set_activation_checkpointing(ac);
    m->forward(ids, Tensor());
    m->loss_sums(tg, got.data());
    for (int64_t b = 0; b < B; ++b)
      EXPECT_NEAR(got[b], want[b], 1e-6 * want[b]) << "chunks of " << rows << ", row " << b;
    EXPECT_EQ(got[1], 0.0) << "chunks of " << rows;
  }
}

TEST(ActivationCheckpointing, ReleasedTensorsAreFreed) {
  for (const std::string arch : {"gpt2", "llama"}) {
    auto m = make(arch, {});
    const int64_t none = train_step(*m, AC{}).live_after_forward;
    const int64_t sel = train_step(*m, selective()).live_after_forward;
    EXPECT_EQ(none, sel) << arch;
    // Full: every block's saved tensors go; each keeps only its input [B, T, C].
    const int64_t f1 = train_step(*make(arch, {}), full(1)).live_after_forward;
    const int64_t n0 = train_step(*make(arch, {}), AC{}).live_after_forward;
    m->set_activation_checkpointing(AC{});
    const int64_t a_none = m->activation_bytes(2, 8);
    m->set_activation_checkpointing(full(1));
    const int64_t a_full = m->activation_bytes(2, 8);
    EXPECT_GT(n0 - f1, (a_none - a_full) / 2) << arch << ": " << n0 << " vs " << f1;
    m->set_activation_checkpointing(selective());
    EXPECT_EQ(m->activation_bytes(2, 8), a_none) << arch;
    EXPECT_LT(a_full, a_none) << arch;
  }
  // GPT-2's estimate by hand (N = 16 tokens, C 16, MLP 64, 4 heads, T 8, 3 layers): a layer
  // saves N (6C + 4C + 2H) + N NH = 4672 elements, a group's input is N C = 256; full
  // keeps the groups' inputs and the chunk's output, plus one group rebuilt at a time.
  auto m = make("gpt2", {});
  const int64_t none = m->activation_bytes(2, 8), layer = 4672, io = 256;
  auto saved = [&](const AC& ac) {
    m->set_activation_checkpointing(ac);
    return none - m->activation_bytes(2, 8);
  };
  EXPECT_EQ(saved(full(1)), 4 * (3 * layer - (3 * io + io + layer)));
  EXPECT_EQ(saved(full(2)), 4 * (3 * layer - (2 * io + io + 2 * layer)));
  EXPECT_EQ(saved(full(3)), 4 * (3 * layer - (io + io + 3 * layer)));
  EXPECT_EQ(saved(full(2, true)), 4 * (3 * layer - (2 * io + layer + io + layer)));
  EXPECT_EQ(saved(selective()), 0);
}

// Records the unit hooks a step fires, and acts like ZeRO-3: a unit's parameter values are
// there only while it is acquired (NaN otherwise), so a recompute outside the backward's
// scopes spoils the gradients.
struct Recorder : models::UnitHooks {
  std::vector<std::string> log;
  std::vector<std::vector<nn::Parameter*>> units;
  std::vector<std::vector<std::vector<float>>> saved;  // per unit, per parameter
  std::vector<int> refs;
  explicit Recorder(models::CausalLM& m) : units(m.units()), saved(units.size()) {
    refs.assign(units.size(), 1);
    for (size_t u = 0; u < units.size(); ++u) release(static_cast<int>(u));
    log.clear();
  }
  void acquire(int u) override {
    log.push_back("a" + std::to_string(u));
    if (refs[u]++ > 0) return;
    for (size_t i = 0; i < units[u].size(); ++i)
      std::memcpy(units[u][i]->value.f32(), saved[u][i].data(), saved[u][i].size() * 4);
  }
  void release(int u) override {
    log.push_back("r" + std::to_string(u));
    if (--refs[u] > 0) return;
    saved[u].clear();
    for (nn::Parameter* p : units[u]) {
      float* v = p->value.f32();
      saved[u].emplace_back(v, v + p->value.numel());
      std::fill(v, v + p->value.numel(), std::numeric_limits<float>::quiet_NaN());
    }
  }
  void grads_ready(int u) override { log.push_back("g" + std::to_string(u)); }
};

// ZeRO-3 gathers a unit's parameters on acquire: the recompute must run while the backward
// holds them, fire no forward hook again, and with groups of one leave the sequence as it is.
TEST(ActivationCheckpointing, RecomputeRunsInsideTheBackwardsUnitScopes) {
  const Step ref = train_step(*make("gpt2", {}), AC{});
  auto hooks_of = [&](const AC& ac) {
    auto m = make("gpt2", {});
    Recorder r(*m);
    m->set_unit_hooks(&r);
    expect_bitwise(ref, train_step(*m, ac), "under ZeRO-3-like hooks");
    return r.log;
  };
  const std::vector<std::string> none = hooks_of(AC{});
  EXPECT_EQ(hooks_of(full(1)), none);
  EXPECT_EQ(hooks_of(selective()), none);
  EXPECT_EQ(hooks_of(full(1, true)), none);
  // Groups of two: blocks [0, 1] (units 1 and 2) and [2]. The first group's units are both
  // acquired, in backward order, before its recompute, each released after its backward:
  // the backward's "a2 r2 g2 a1 r1 g1" becomes "a2 a1 r2 g2 r1 g1".
  const std::vector<std::string> two = hooks_of(full(2));
  std::vector<std::string> want = none;
  int replaced = 0;
  for (size_t i = 0; i + 3 < want.size(); ++i) {
    if (want[i] == "a2" && want[i + 1] == "r2" && want[i + 2] == "g2" && want[i + 3] == "a1") {
      want[i + 1] = "a1";
      want[i + 2] = "r2";
      want[i + 3] = "g2";
      ++replaced;
    }
  }
  EXPECT_EQ(replaced, 2);  // two micro-batches
  EXPECT_EQ(two, want);
}

}  // namespace
}  // namespace loom
