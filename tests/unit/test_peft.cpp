// Parameter-efficient fine-tuning: finite-difference checks of LoRA (with dropout), the
// bottleneck adapter and the prefix (with its projection); what apply_peft freezes and
// trains; PEFT adapter folders written and read back (key names as PEFT's own); merged
// export; and the errors for bad PEFT configs and adapter folders.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>

#include "common/test_util.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/io/peft_adapter.h"
#include "loom/io/safetensors.h"
#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/models/llama.h"
#include "loom/models/peft.h"
#include "loom/nn/bottleneck_adapter.h"
#include "loom/nn/dropout.h"
#include "loom/nn/linear.h"
#include "loom/optim/adamw.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::GradTarget;

// Peak resident memory (VmHWM) in KiB, -1 where the kernel does not report it; resetting
// (/proc/self/clear_refs 5) brings it down to the current RSS.
int64_t peak_rss_kib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}
int64_t reset_peak_rss_kib() {
  std::ofstream("/proc/self/clear_refs") << "5";
  return peak_rss_kib();
}

// PEFT lays the store out again after the base is loaded (its parameters added, the base
// frozen): each value is moved into the new layout and its old pages given back as it goes,
// so at that moment a loaded f32 base is held once plus its largest tensor, not twice (a 7B
// base: ~28 GB, not 56).
TEST(Peft, LayingTheStoreOutAgainHoldsOneCopyOfTheBase) {
  nn::ParamStore ps;
  std::vector<nn::Parameter*> base;  // 32 matrices of 4 MiB
  for (int i = 0; i < 32; ++i)
    base.push_back(ps.add("layers." + std::to_string(i) + ".weight", {512, 2048},
                          nn::ParamKind::Weight, 0.0f));
  ps.materialize();
  for (nn::Parameter* w : base) {
    std::fill_n(w->value.f32(), w->value.numel(), 1.5f);
    w->trainable = false;
  }
  ps.add("layers.0.lora_A.weight", {8, 2048}, nn::ParamKind::Weight, 0.0f);
  const int64_t before = reset_peak_rss_kib();
  if (before < 0) GTEST_SKIP() << "no VmHWM in /proc/self/status";
  ps.materialize();
  const int64_t grew = peak_rss_kib() - before;
#ifndef __SANITIZE_ADDRESS__  // under ASan the peak counts its shadow and quarantine too
  EXPECT_LT(grew, 16 * 1024) << "KiB more at the peak (the base copied whole adds 131072)";
#else
  (void)grew;
#endif
  for (nn::Parameter* w : base) {
    const float* v = w->value.f32();
    EXPECT_TRUE(std::all_of(v, v + w->value.numel(), [](float x) { return x == 1.5f; })) << w->name;
  }
}

TEST(PeftGrad, LoraLinearWithDropout) {
  const int64_t N = 5, in = 6, out = 7;
  nn::ParamStore ps;
  nn::Linear lin(ps, "blk.q_proj", in, out, /*bias=*/true, 0.5f);
  nn::DropoutContext ctx{true, 3, 2, 40};
  nn::LoraSpec spec{3, 6.0f, false, 0.3f};
  lin.attach_lora(ps, spec, &ctx);
  ps.materialize();
  uint64_t seed = 5;
  std::vector<GradTarget> t;
  for (auto& p : ps.all()) {
    test::fill_normal(p->value, seed++, 0.5f);
    t.push_back({p->name, p->value, p->grad});
  }
  Tensor x = Tensor::zeros({N, in}), dx = Tensor::zeros({N, in});
  test::fill_normal(x, 1);
  t.push_back({"x", x, dx});
  test::gradcheck([&] { return lin.forward(x); },
                  [&](const Tensor& dy) {
                    lin.forward(x);
                    lin.backward(dy, dx);
                  },
                  t);
  // The mask is a function of (seed, step, row, element): the same call drops the same
  // elements; another step drops others.
  Tensor y1 = Tensor::zeros({N, out});
  y1.copy_from(lin.forward(x));
  EXPECT_EQ(0, std::memcmp(y1.raw(), lin.forward(x).raw(), y1.nbytes()));
  ctx.step = 3;
  EXPECT_NE(0, std::memcmp(y1.raw(), lin.forward(x).raw(), y1.nbytes()));
}

// The mask drops a fraction p of the elements, scales the rest by 1 / (1 - p), and keys
// them by (row, full column): a column shard drops exactly what the whole row drops there,
// and another stream, step or first row drops others.
TEST(Dropout, RateScaleAndShardKeying) {
  const int64_t rows = 64, width = 1000;
  const float p = 0.3f;
  nn::DropoutContext ctx{true, 7, 1, 128};
  std::vector<float> full(rows * width, 1.0f);
  nn::dropout_apply(full.data(), rows, width, p, ctx, 11);
  int64_t dropped = 0;
  for (float x : full) {
    if (x == 0.0f)
      ++dropped;
    else
      EXPECT_FLOAT_EQ(x, 1.0f / (1.0f - p));
  }
  // 64,000 Bernoulli(0.3) draws: the standard deviation of the rate is 0.0018.
  EXPECT_NEAR(static_cast<double>(dropped) / (rows * width), p, 0.01);
  const int64_t col0 = 300, w = 250;
  std::vector<float> shard(rows * w, 1.0f);
  nn::dropout_apply(shard.data(), rows, w, p, ctx, 11, col0);
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t i = 0; i < w; ++i) ASSERT_EQ(shard[n * w + i], full[n * width + col0 + i]);
  auto differs = [&](nn::DropoutContext c, uint64_t stream) {
    std::vector<float> o(rows * width, 1.0f);
    nn::dropout_apply(o.data(), rows, width, p, c, stream);
    return o != full;
  };
  EXPECT_TRUE(differs(ctx, 12));
  EXPECT_TRUE(differs({true, 7, 2, 128}, 11));
  EXPECT_TRUE(differs({true, 7, 1, 129}, 11));
  EXPECT_FALSE(differs(ctx, 11));
}

TEST(PeftGrad, LoraScaleAndMerge) {
  const int64_t N = 3, in = 4, out = 5;
  nn::ParamStore ps;
  nn::Linear lin(ps, "l", in, out, false, 0.5f);
  lin.attach_lora(ps, {2, 3.0f, /*rslora=*/true, 0.0f}, nullptr);
  ps.materialize();
  ps.init(7);
  EXPECT_FLOAT_EQ(lin.lora()->spec().scale(), 3.0f / std::sqrt(2.0f));
  // PEFT's init: A uniform within 1/sqrt(in), B zero.
  for (int64_t i = 0; i < lin.lora()->A()->value.numel(); ++i)
    EXPECT_LE(std::fabs(lin.lora()->A()->value.f32()[i]), 0.5f);
  for (int64_t i = 0; i < lin.lora()->B()->value.numel(); ++i)
    EXPECT_EQ(lin.lora()->B()->value.f32()[i], 0.0f);
  test::fill_normal(lin.lora()->B()->value, 9);
  Tensor x = Tensor::zeros({N, in});
  test::fill_normal(x, 8);
  Tensor y = Tensor::zeros({N, out});
  y.copy_from(lin.forward(x));
  // W + s B A without the branch gives the same output.
  nn::ParamStore ps2;
  nn::Linear plain(ps2, "l", in, out, false, 0.5f);
  ps2.materialize();
  plain.weight()->value.copy_from(lin.weight()->value);
  lin.lora()->merge_into(plain.weight()->value.f32());
  const Tensor& y2 = plain.forward(x);
  for (int64_t i = 0; i < y.numel(); ++i) EXPECT_NEAR(y.f32()[i], y2.f32()[i], 1e-5);
}

TEST(PeftGrad, BottleneckAdapter) {
  for (const char* act : {"gelu", "relu"}) {
    const int64_t N = 4, C = 6;
    nn::ParamStore ps;
    nn::BottleneckAdapter ad(ps, "blk.attn_adapter", C, {3, act, 0.1f});
    ps.materialize();
    uint64_t seed = 20;
    std::vector<GradTarget> t;
    for (auto& p : ps.all()) {
      test::fill_normal(p->value, seed++, 0.6f);
      t.push_back({p->name, p->value, p->grad});
    }
    Tensor h = Tensor::zeros({N, C}), dh = Tensor::zeros({N, C});
    test::fill_normal(h, 2);
    t.push_back({"h", h, dh});
    nn::Scratch scratch;
    test::gradcheck([&] { return ad.forward(h); },
                    [&](const Tensor& dy) {
                      ad.forward(h);
                      ad.backward(dy, dh, scratch);
                    },
                    t);
  }
}

nlohmann::json tiny_llama_config(bool tied) {
  return {{"model_type", "llama"},
          {"vocab_size", 23},
          {"hidden_size", 8},
          {"intermediate_size", 12},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"max_position_embeddings", 24},
          {"tie_word_embeddings", tied},
          {"attention_bias", true}};
}

// Loss of the whole model as a function of the trainable parameters only.
void check_trainable_grads(models::CausalLM& model, const Tensor& pos = Tensor()) {
  uint64_t seed = 200;
  for (auto& p : model.params().all())
    if (!p->quantized()) test::fill_normal(p->value, seed++, 0.3f);
  const int64_t B = 2, T = 6, V = model.vocab_size();
  Tensor ids = Tensor::zeros({B, T}, DType::I32), tg = Tensor::zeros({B, T}, DType::I32);
  for (int64_t i = 0; i < B * T; ++i) {
    ids.i32()[i] = static_cast<int32_t>((i * 7 + 3) % V);
    tg.i32()[i] = i % 5 == 4 ? kernels::kIgnoreIndex : static_cast<int32_t>((i * 3 + 1) % V);
  }
  const int64_t n = kernels::count_targets(tg.i32(), B * T);
  Tensor out = Tensor::zeros({1});
  // The output is the loss minus the unperturbed one, in double before it is rounded to
  // fp32: the loss itself (~3) in fp32 carries ~2e-7 of rounding, ~3e-5 in a finite
  // difference at eps 4e-3, as large as a small LoRA A's directional gradient.
  double loss0 = NAN;
  auto fwd = [&] {
    const Tensor& lg = model.forward(ids, pos);
    const double loss = kernels::cross_entropy_loss(lg.f32(), tg.i32(), B * T, V) / n;
    if (std::isnan(loss0)) loss0 = loss;
    out.f32()[0] = static_cast<float>(loss - loss0);
    return out;
  };
  auto bwd = [&](const Tensor& dout) {
    model.forward(ids, pos);
    model.backward(tg, dout.f32()[0] / n);
  };
  std::vector<GradTarget> t;
  for (auto& p : model.params().all())
    if (p->trainable) t.push_back({p->name, p->value, p->grad});
  ASSERT_FALSE(t.empty());
  test::gradcheck(fwd, bwd, t, 2e-2, 4e-3f);
}

TEST(PeftGrad, WholeLlamaWithAdapters) {
  models::Llama model(models::LlamaConfig::from_hf(tiny_llama_config(true), "test"));
  models::PeftConfig cfg;
  cfg.method = "adapter";
  cfg.adapter.bottleneck = 3;
  models::apply_peft(model, cfg, 1);
  check_trainable_grads(model);
}

TEST(PeftGrad, WholeLlamaWithPrefixProjectionPacked) {
  models::Llama model(models::LlamaConfig::from_hf(tiny_llama_config(false), "test"));
  models::PeftConfig cfg;
  cfg.method = "prefix";
  cfg.num_virtual_tokens = 2;
  cfg.prefix_projection = true;
  cfg.encoder_hidden_size = 5;
  models::apply_peft(model, cfg, 1);
  // Packed rows: two samples in the first row, positions restarting at 0.
  Tensor pos = Tensor::zeros({2, 6}, DType::I32);
  const int32_t p[12] = {0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 4, 5};
  std::copy(p, p + 12, pos.i32());
  check_trainable_grads(model, pos);
}

TEST(PeftGrad, WholeLlamaWithLoraAllLinear) {
  models::Llama model(models::LlamaConfig::from_hf(tiny_llama_config(false), "test"));
  models::PeftConfig cfg;
  cfg.method = "lora";
  cfg.lora = {2, 4.0f, false, 0.0f};
  cfg.target_regex = "all-linear";
  cfg.bias = "lora_only";
  cfg.modules_to_save = {"lm_head"};
  models::apply_peft(model, cfg, 1);
  check_trainable_grads(model);
}

TEST(Peft, ApplyFreezesTheBaseAndTrainsOnlyTheMethod) {
  models::Llama model(models::LlamaConfig::from_hf(tiny_llama_config(false), "test"));
  model.params().init(3);
  const int64_t V = 23;
  Tensor ids = Tensor::zeros({1, 5}, DType::I32);
  for (int i = 0; i < 5; ++i) ids.i32()[i] = i * 4 % V;
  std::vector<float> before(model.forward(ids).f32(), model.forward(ids).f32() + 5 * V);
  const int64_t base_numel = model.params().numel();

  models::PeftConfig cfg;
  cfg.method = "lora";
  cfg.lora = {4, 8.0f, false, 0.0f};
  cfg.target_modules = {"q_proj", "v_proj"};
  cfg.modules_to_save = {"lm_head"};
  models::apply_peft(model, cfg, 5);
  // B starts at zero: the adapted model is the base model exactly, values kept across the
  // re-layout of the parameter store.
  const Tensor& after = model.forward(ids);
  for (int64_t i = 0; i < 5 * V; ++i) ASSERT_EQ(after.f32()[i], before[i]);
  int64_t lora = 0;
  for (auto& p : model.params().all()) {
    const bool is_lora = p->name.find(".lora_") != std::string::npos;
    lora += is_lora ? p->value.numel() : 0;
    EXPECT_EQ(p->adapter, is_lora) << p->name;
    EXPECT_EQ(p->trainable, is_lora || p->name == "lm_head.weight") << p->name;
    EXPECT_EQ(p->grad.defined(), p->trainable) << p->name;
  }
  // q_proj [8 -> 8], v_proj [8 -> 4] in 2 layers at r = 4.
  EXPECT_EQ(lora, 2 * (4 * 8 + 8 * 4 + 4 * 8 + 4 * 4));
  EXPECT_EQ(model.params().trainable_numel(), lora + V * 8);
  EXPECT_EQ(model.params().numel(), base_numel + lora);
  optim::AdamW opt(model.params(), {});
  EXPECT_EQ(opt.state_bytes(), 2 * 4 * model.params().trainable_numel());
}

TEST(Peft, ConfigErrorsNameTheProblem) {
  auto try_apply = [](models::PeftConfig cfg, bool tied = false) {
    models::Llama model(models::LlamaConfig::from_hf(tiny_llama_config(tied), "test"));
    return error_of([&] { models::apply_peft(model, cfg, 1); });
  };
  models::PeftConfig c;
  c.method = "lora";
  c.target_modules = {"q_proj", "qkv_proj"};
  EXPECT_NE(try_apply(c).find("'qkv_proj' match no linear layer"), std::string::npos);
  c.target_modules = {"q_proj"};
  c.modules_to_save = {"lm_head"};
  EXPECT_NE(try_apply(c, /*tied=*/true).find("tied LM head"), std::string::npos);
  c.modules_to_save.clear();
  c.target_modules.clear();
  c.target_regex = "(unclosed";
  EXPECT_NE(try_apply(c).find("not a valid regular expression"), std::string::npos);
  c.target_regex = ".*\\.mlp\\.up_proj";
  EXPECT_EQ(try_apply(c), "<no error>");
}

TEST(Peft, MatchesLikePeft) {
  EXPECT_TRUE(models::peft_name_matches("model.layers.0.self_attn.q_proj", "q_proj"));
  EXPECT_TRUE(models::peft_name_matches("model.layers.0.self_attn.q_proj", "self_attn.q_proj"));
  EXPECT_FALSE(models::peft_name_matches("model.layers.0.self_attn.q_proj", "_proj"));
  EXPECT_TRUE(models::peft_name_matches("lm_head", "lm_head"));
}

// A LoRA adapter as Loom writes it has PEFT's file layout: the same keys and shapes as the
// adapter PEFT itself saved for the same config (tests/fixtures/peft/gpt2_lora).
TEST(PeftFolder, SavedKeysAndConfigArePeftsOwn) {
  auto model = io::load_hf_model(test::fixture_dir() / "gpt2_tiny");
  models::PeftConfig cfg;
  cfg.method = "lora";
  cfg.lora = {4, 8.0f, false, 0.0f};
  cfg.target_modules = {"c_attn", "c_proj", "c_fc"};
  models::apply_peft(*model, cfg, 2);
  test::TempDir tmp;
  io::save_adapter(*model, cfg, tmp.path / "a", "gpt2_tiny");
  auto ours = io::SafetensorsFile::open(tmp.path / "a" / "adapter_model.safetensors");
  auto theirs = io::SafetensorsFile::open(test::fixture_dir() / "peft" / "gpt2_lora" /
                                          "adapter_model.safetensors");
  std::map<std::string, std::vector<int64_t>> a, b;
  for (const auto& t : ours.tensors()) a[t.name] = t.shape;
  for (const auto& t : theirs.tensors()) b[t.name] = t.shape;
  EXPECT_EQ(a, b);
  nlohmann::json oc = io::read_json_file(tmp.path / "a" / "adapter_config.json");
  nlohmann::json tc =
      io::read_json_file(test::fixture_dir() / "peft" / "gpt2_lora" / "adapter_config.json");
  for (const char* k : {"peft_type", "task_type", "r", "lora_alpha", "lora_dropout", "bias",
                        "use_rslora", "fan_in_fan_out"})
    EXPECT_EQ(oc[k], tc[k]) << k;
  std::vector<std::string> ot = oc["target_modules"], tt = tc["target_modules"];
  std::sort(tt.begin(), tt.end());
  EXPECT_EQ(ot, tt);
  EXPECT_EQ(oc["base_model_name_or_path"], "gpt2_tiny");
}

// Each method trains a few steps' worth of random values, saves, and loads back (from the
// folder, its base found beside it) to the same logits.
TEST(PeftFolder, RoundTripEveryMethod) {
  const fs::path base = test::fixture_dir() / "qwen2_tiny";
  for (const char* method : {"lora", "adapter", "prefix"}) {
    SCOPED_TRACE(method);
    auto model = io::load_hf_model(base);
    models::PeftConfig cfg;
    cfg.method = method;
    cfg.lora = {3, 6.0f, false, 0.0f};
    cfg.target_modules = {"q_proj", "down_proj"};
    cfg.modules_to_save = {"lm_head"};
    cfg.bias = "all";
    cfg.adapter.bottleneck = 5;
    cfg.num_virtual_tokens = 4;
    cfg.prefix_projection = true;
    if (std::string(method) != "lora") {
      cfg.modules_to_save.clear();
      cfg.bias = "none";
    }
    models::apply_peft(*model, cfg, 3);
    uint64_t seed = 70;
    for (auto& p : model->params().all())
      if (p->trainable) test::fill_normal(p->value, seed++, 0.05f);
    Tensor ids = Tensor::zeros({2, 7}, DType::I32);
    for (int i = 0; i < 14; ++i) ids.i32()[i] = (i * 37 + 5) % 256;
    Tensor before = Tensor::zeros({2, 7, model->vocab_size()});
    before.copy_from(model->forward(ids));
    test::TempDir tmp;
    io::save_adapter(*model, cfg, tmp.path / "adapter", base.string());
    auto back = io::load_model(tmp.path / "adapter");
    const Tensor& after = back->forward(ids);
    double max_abs = 0;
    for (int64_t i = 0; i < before.numel(); ++i)
      max_abs = std::max(max_abs, double(std::fabs(after.f32()[i] - before.f32()[i])));
    EXPECT_LE(max_abs, 1e-5);
    // The prefix's KV cache starts with the prefix: cached decoding equals the full forward.
    models::KVCache cache = back->new_cache();
    Tensor one = Tensor::zeros({1, 7}, DType::I32);
    std::copy(ids.i32(), ids.i32() + 7, one.i32());
    const Tensor& cached = back->forward_cached(one, cache);
    for (int64_t i = 0; i < 7 * back->vocab_size(); ++i)
      ASSERT_NEAR(cached.f32()[i], before.f32()[i], 1e-4);
  }
}

// `loom export --merge`: the LoRA folder merged into its base is a plain HF model with the
// adapted model's logits.
TEST(PeftFolder, MergedExportHasTheAdaptedLogits) {
  const fs::path base = test::fixture_dir() / "llama_tiny";
  io::LoadOptions opt;
  opt.base = base;
  auto adapted = io::load_model(test::fixture_dir() / "peft" / "llama_lora", opt);
  Tensor ids = Tensor::zeros({1, 9}, DType::I32);
  for (int i = 0; i < 9; ++i) ids.i32()[i] = (i * 29 + 3) % 256;
  Tensor ref = Tensor::zeros({1, 9, 256});
  ref.copy_from(adapted->forward(ids));
  test::TempDir tmp;
  io::save_hf_checkpoint(*adapted, tmp.path / "merged");
  auto merged = io::load_hf_model(tmp.path / "merged");
  EXPECT_EQ(merged->params().all().size(), io::load_hf_model(base)->params().all().size());
  const Tensor& got = merged->forward(ids);
  for (int64_t i = 0; i < ref.numel(); ++i) ASSERT_NEAR(got.f32()[i], ref.f32()[i], 1e-5);
  // Adapters and prefixes cannot be merged.
  auto with_adapter = io::load_hf_model(base);
  models::PeftConfig cfg;
  cfg.method = "adapter";
  models::apply_peft(*with_adapter, cfg, 1);
  EXPECT_NE(error_of([&] {
              io::save_hf_checkpoint(*with_adapter, tmp.path / "bad");
            }).find("cannot be merged"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(tmp.path / "bad"));
}

TEST(PeftFolder, BadFoldersNameTheFileAndKey) {
  test::TempDir tmp;
  const fs::path src = test::fixture_dir() / "peft" / "llama_lora";
  const fs::path base = test::fixture_dir() / "llama_tiny";
  io::LoadOptions opt;
  opt.base = base;
  auto copy_to = [&](const std::string& name) {
    fs::path d = tmp.path / name;
    fs::create_directories(d);
    for (const char* f : {"adapter_config.json", "adapter_model.safetensors"})
      fs::copy_file(src / f, d / f);
    return d;
  };
  auto edit_config = [&](const fs::path& d, const std::function<void(nlohmann::json&)>& f) {
    nlohmann::json j = io::read_json_file(d / "adapter_config.json");
    f(j);
    io::write_json_file(d / "adapter_config.json", j);
  };
  fs::path d = copy_to("dora");
  edit_config(d, [](nlohmann::json& j) { j["use_dora"] = true; });
  EXPECT_NE(error_of([&] { io::load_model(d, opt); }).find("'use_dora'"), std::string::npos);
  d = copy_to("ia3");
  edit_config(d, [](nlohmann::json& j) { j["peft_type"] = "IA3"; });
  EXPECT_NE(error_of([&] { io::load_model(d, opt); }).find("peft_type 'IA3'"), std::string::npos);
  d = copy_to("rank");
  edit_config(d, [](nlohmann::json& j) { j["r"] = 8; });
  EXPECT_NE(error_of([&] { io::load_model(d, opt); }).find("lora_A.weight"), std::string::npos);
  d = copy_to("targets");
  edit_config(d, [](nlohmann::json& j) { j["target_modules"] = {"q_proj"}; });
  EXPECT_NE(error_of([&] { io::load_model(d, opt); }).find("is not part of this"),
            std::string::npos);
  d = copy_to("nobase");
  edit_config(d, [](nlohmann::json& j) { j["base_model_name_or_path"] = "/no/such/model"; });
  EXPECT_NE(error_of([&] { io::load_model(d); }).find("'/no/such/model' not found"),
            std::string::npos);
  d = copy_to("truncated");
  fs::resize_file(d / "adapter_model.safetensors", 100);
  EXPECT_NE(error_of([&] { io::load_model(d, opt); }).find("adapter_model.safetensors"),
            std::string::npos);
}

}  // namespace
}  // namespace loom
