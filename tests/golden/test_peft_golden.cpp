// Parity with Hugging Face peft (fixtures from scripts/make_peft_fixtures.py): LoRA on GPT-2
// (Conv1D layers) and on Llama (GQA, rsLoRA, all seven projections); Prefix Tuning on GPT-2
// (the table trained directly) and on Llama (PEFT's projection MLP, prefixes per KV head).
// The LoRA and plain-prefix adapters are read from the folders PEFT saved; the projection's
// parameters (which PEFT does not save) come from the golden file.
#include <gtest/gtest.h>

#include <set>

#include "common/golden.h"
#include "loom/io/peft_adapter.h"
#include "loom/models/peft.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using test::Golden;

fs::path peft_fixture(const std::string& name) { return test::fixture_dir() / "peft" / name; }

void expect_close(const float* ours, const std::vector<float>& ref, int64_t n, double tol,
                  const std::string& what) {
  ASSERT_EQ(n, static_cast<int64_t>(ref.size())) << what;
  double max_abs = 0;
  for (int64_t i = 0; i < n; ++i) max_abs = std::max(max_abs, std::fabs(double(ours[i]) - ref[i]));
  EXPECT_LE(max_abs, tol) << what << " max abs error";
}

// One forward/backward of `model` against the fixture: logits, loss, and the gradient of
// every trainable tensor (and nothing trains that PEFT does not train).
void check_against(models::CausalLM& model, const Golden& g) {
  const auto& shape = g.get("input_ids").shape;
  const int64_t B = shape[0], T = shape[1];
  Tensor ids = test::i32_tensor(g.ids("input_ids"), {B, T});
  Tensor tg = test::i32_tensor(g.ids("targets"), {B, T});
  const Tensor& logits = model.forward(ids);
  expect_close(logits.f32(), g.f32("logits"), logits.numel(), 1e-4, "logits");
  const int64_t n = kernels::count_targets(tg.i32(), B * T);
  model.params().zero_grads();
  const double loss = model.backward(tg, 1.0f / n) / n;
  EXPECT_NEAR(loss, g.f32("loss")[0], 1e-5);
  std::set<std::string> golden_grads;
  for (const auto& t : g.file.tensors())
    if (t.name.starts_with("grad.")) golden_grads.insert(t.name.substr(5));
  std::set<std::string> ours;
  for (auto& p : model.params().all()) {
    if (!p->trainable) continue;
    ours.insert(p->name);
    std::vector<float> ref = g.f32("grad." + p->name);
    ASSERT_EQ(p->grad.numel(), static_cast<int64_t>(ref.size())) << p->name;
    EXPECT_LE(test::rel_err(p->grad.f32(), ref.data(), ref.size()), 1e-4) << "grad of " << p->name;
  }
  EXPECT_EQ(ours, golden_grads);
}

// The adapter folder PEFT saved, read by Loom: every tensor lands in the right parameter.
void check_folder(const std::string& name, const std::string& base) {
  io::LoadOptions opt;
  opt.base = test::fixture_dir() / base;
  auto model = io::load_model(peft_fixture(name), opt);
  Golden g(peft_fixture(name));
  for (auto& p : model->params().all()) {
    if (!p->trainable) continue;
    std::vector<float> v = g.f32("param." + p->name);
    expect_close(p->value.f32(), v, p->value.numel(), 0.0, "value of " + p->name);
  }
  check_against(*model, g);
}

TEST(GoldenPeft, Gpt2LoraOnConv1D) { check_folder("gpt2_lora", "gpt2_tiny"); }
TEST(GoldenPeft, LlamaLoraAllProjectionsRsLora) { check_folder("llama_lora", "llama_tiny"); }
TEST(GoldenPeft, Gpt2PrefixTable) { check_folder("gpt2_prefix", "gpt2_tiny"); }

TEST(GoldenPeft, LlamaPrefixProjectionGqa) {
  auto model = io::load_hf_model(test::fixture_dir() / "llama_tiny");
  models::PeftConfig cfg;
  cfg.method = "prefix";
  cfg.num_virtual_tokens = 3;
  cfg.prefix_projection = true;
  cfg.encoder_hidden_size = 24;
  models::apply_peft(*model, cfg, /*seed=*/1);
  Golden g(peft_fixture("llama_prefix"));
  for (auto& p : model->params().all()) {
    if (!p->trainable) continue;
    std::vector<float> v = g.f32("param." + p->name);
    ASSERT_EQ(p->value.numel(), static_cast<int64_t>(v.size())) << p->name;
    std::copy(v.begin(), v.end(), p->value.f32());
  }
  check_against(*model, g);
  // What PEFT saved is the projection's output: our table must equal it.
  io::SafetensorsFile saved =
      io::SafetensorsFile::open(peft_fixture("llama_prefix") / "adapter_model.safetensors");
  const io::StTensorView* pe = saved.find("prompt_embeddings");
  ASSERT_NE(pe, nullptr);
  const Tensor& table = model->kv_prefix()->forward();
  std::vector<float> ref(pe->numel());
  std::memcpy(ref.data(), pe->data.data(), ref.size() * 4);
  expect_close(table.f32(), ref, table.numel(), 1e-5, "prompt_embeddings");
}

}  // namespace
}  // namespace loom
