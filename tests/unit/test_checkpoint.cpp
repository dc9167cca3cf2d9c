// HF checkpoint folders: what we save loads back bit-exactly, in HF's layout (Conv1D
// weights stored [in, out], tied head omitted), and loading the fixture folder written by
// transformers' save_pretrained gives its weights.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "common/test_util.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/io/safetensors.h"
#include "loom/kernels/cpu/bf16.h"
#include "loom/models/gpt2.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

models::GPT2Config tiny() {
  models::GPT2Config c;
  c.vocab_size = 40;
  c.n_positions = 12;
  c.n_embd = 8;
  c.n_head = 2;
  c.n_layer = 2;
  return c;
}

TEST(Checkpoint, SaveLoadRoundTripIsExact) {
  test::TempDir tmp;
  models::GPT2 a(tiny());
  a.params().init(7);
  const fs::path dir = tmp.path / "ck";
  io::save_hf_checkpoint(a, dir);
  EXPECT_TRUE(fs::exists(dir / "config.json"));
  EXPECT_FALSE(fs::exists(dir.string() + ".tmp-" + std::to_string(::getpid())));

  auto b = io::load_hf_model(dir);
  ASSERT_EQ(b->params().numel(), a.params().numel());
  const Tensor va = a.params().flat_values(), vb = b->params().flat_values();
  EXPECT_EQ(0, std::memcmp(va.raw(), vb.raw(), va.nbytes()));

  Tensor ids = Tensor::zeros({1, 5}, DType::I32);
  for (int i = 0; i < 5; ++i) ids.i32()[i] = i * 7 % 40;
  std::vector<float> la(a.forward(ids).f32(), a.forward(ids).f32() + 5 * 40);
  const Tensor& lb = b->forward(ids);
  for (int i = 0; i < 5 * 40; ++i) EXPECT_EQ(la[i], lb.f32()[i]);
}

// A bf16 export stores every tensor rounded to nearest even (and says so in config.json);
// it loads back as exactly those rounded values. Other dtypes are refused, nothing written.
TEST(Checkpoint, Bf16ExportRoundsEveryTensor) {
  test::TempDir tmp;
  models::GPT2 a(tiny());
  a.params().init(7);
  const fs::path dir = tmp.path / "bf16";
  io::save_hf_checkpoint(a, dir, {}, io::StDType::BF16);
  EXPECT_EQ(io::read_json_file(dir / "config.json")["torch_dtype"], "bfloat16");
  const io::SafetensorsFile f = io::SafetensorsFile::open(dir / "model.safetensors");
  for (const auto& t : f.tensors()) EXPECT_EQ(t.dtype, io::StDType::BF16) << t.name;
  auto b = io::load_hf_model(dir);
  const Tensor va = a.params().flat_values(), vb = b->params().flat_values();
  ASSERT_EQ(va.numel(), vb.numel());
  int64_t changed = 0;
  for (int64_t i = 0; i < va.numel(); ++i) {
    const float rounded = kernels::from_bf16(kernels::to_bf16(va.f32()[i]));
    ASSERT_EQ(vb.f32()[i], rounded) << i;
    changed += rounded != va.f32()[i];
  }
  EXPECT_GT(changed, va.numel() / 2);  // the values really were rounded
  EXPECT_THROW(io::save_hf_checkpoint(a, tmp.path / "f16", {}, io::StDType::F16), Error);
  EXPECT_FALSE(fs::exists(tmp.path / "f16"));
}

TEST(Checkpoint, FileUsesHuggingFaceLayout) {
  test::TempDir tmp;
  models::GPT2 a(tiny());
  a.params().init(7);
  io::save_hf_checkpoint(a, tmp.path / "ck");
  auto f = io::SafetensorsFile::open(tmp.path / "ck" / "model.safetensors");
  const io::StTensorView* w = f.find("transformer.h.0.attn.c_attn.weight");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{8, 24}));  // Conv1D: [in, out]
  // element [i, o] of the file is our W[o, i]
  const float* fw = reinterpret_cast<const float*>(w->data.data());
  const nn::Parameter* p = a.params().find("transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(fw[3 * 24 + 17], p->value.f32()[17 * 8 + 3]);
  EXPECT_EQ(f.find("lm_head.weight"), nullptr);  // tied to transformer.wte.weight
}

TEST(Checkpoint, SavingOverAnExistingFolderReplacesIt) {
  test::TempDir tmp;
  const fs::path dir = tmp.path / "ck";
  fs::create_directories(dir);
  std::ofstream(dir / "stale.txt") << "old";
  models::GPT2 a(tiny());
  io::save_hf_checkpoint(a, dir);
  EXPECT_FALSE(fs::exists(dir / "stale.txt"));
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
}

// The tokenizer files go into the same temporary folder: when they cannot be written (here
// an unreadable GGUF source), no checkpoint appears at all.
TEST(Checkpoint, TokenizerFailureLeavesNoFolder) {
  test::TempDir tmp;
  std::ofstream(tmp.path / "bad.gguf") << "not a gguf file";
  models::GPT2 a(tiny());
  const fs::path dir = tmp.path / "ck";
  EXPECT_NE(test::error_of([&] {
              io::save_hf_checkpoint(a, dir, tmp.path / "bad.gguf");
            }).find("bad.gguf"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_FALSE(fs::exists(dir.string() + ".tmp-" + std::to_string(::getpid())));
}

TEST(Checkpoint, LoadsTransformersSavePretrainedFolder) {
  // The golden fixture was written by GPT2LMHeadModel.save_pretrained.
  auto m = io::load_hf_model(test::fixture_dir() / "gpt2_tiny");
  EXPECT_EQ(m->arch(), "gpt2");
  EXPECT_EQ(m->vocab_size(), 256);
  auto f = io::SafetensorsFile::open(test::fixture_dir() / "gpt2_tiny" / "model.safetensors");
  const io::StTensorView* ln = f.find("transformer.ln_f.weight");
  ASSERT_NE(ln, nullptr);
  EXPECT_EQ(0,
            std::memcmp(ln->data.data(), m->params().find("transformer.ln_f.weight")->value.raw(),
                        ln->data.size()));
}

TEST(Checkpoint, MissingTensorIsNamed) {
  test::TempDir tmp;
  models::GPT2 a(tiny());
  io::save_hf_checkpoint(a, tmp.path / "ck");
  // Rewrite the weights without one tensor.
  auto f = io::SafetensorsFile::open(tmp.path / "ck" / "model.safetensors");
  std::vector<io::StWriteTensor> keep;
  for (auto& t : f.tensors())
    if (t.name != "transformer.h.1.mlp.c_fc.bias")
      keep.push_back({t.name, t.dtype, t.shape, t.data.data(), t.data.size()});
  io::write_safetensors(tmp.path / "w.safetensors", keep);
  models::GPT2 b(tiny());
  try {
    io::load_hf_weights(b, tmp.path / "w.safetensors");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("transformer.h.1.mlp.c_fc.bias"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

TEST(Checkpoint, LlamaFixtureRoundTripsThroughSave) {
  // Load transformers' save_pretrained folder, save it ourselves, load that: same weights,
  // same config fields (rope scaling included), same logits.
  test::TempDir tmp;
  for (const char* name : {"llama_tiny", "qwen2_tiny"}) {
    auto a = io::load_hf_model(test::fixture_dir() / name);
    io::save_hf_checkpoint(*a, tmp.path / name);
    auto b = io::load_hf_model(tmp.path / name);
    EXPECT_EQ(a->hf_config(), b->hf_config()) << name;
    const Tensor va = a->params().flat_values(), vb = b->params().flat_values();
    ASSERT_EQ(va.numel(), vb.numel());
    EXPECT_EQ(0, std::memcmp(va.raw(), vb.raw(), va.nbytes())) << name;
  }
}

}  // namespace
}  // namespace loom
